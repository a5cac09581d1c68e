"""The docs' numbers that describe a run match their records (benchmarks/doc_numbers.py on this repository), and the
checker itself, on made-up docs and records: a changed number fails naming file and line, a missing record fails,
``--write`` puts the record's numbers back."""

import importlib.util
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("doc_numbers", ROOT / "benchmarks" / "doc_numbers.py")
doc_numbers = sys.modules.setdefault("doc_numbers", importlib.util.module_from_spec(SPEC))
SPEC.loader.exec_module(doc_numbers)

TABLE_DOC = """# Speed

<!-- numbers: benchmarks/results/run.json -->
| stack | s/step | ratio |
|---|---|---|
| Keras 3 | 0.0170 s | 1.52x |
| Keras 2 | 0.0134 s | 1.79x |

Text after.
"""

PARAGRAPH_DOC = """# Fine-tuning

<!-- numbers: benchmarks/results/run.json#prose -->
One run, 2026-12-06: accuracy 0.686 after the public pretraining, 0.714
after the private one, 1,524 tests.
"""

RECORD = {
    "command": "python benchmarks/step_time.py --models cnn",
    "date": "2026-12-07",
    "machine": {"cpu": "made up", "cores": 2},
    "results": {"k3": {"seconds": 0.01704, "ratio": 1.5213}, "k2": {"seconds": 0.0134, "ratio": 1.79}},
    "rows": [
        {"label": ["Keras 3"], "values": ["results.k3.seconds", "results.k3.ratio"]},
        {"label": ["Keras 2"], "values": ["results.k2.seconds", 1.79]},
    ],
    "quoted": {"prose": [["accuracy ", 0.6861], ["pretraining, ", [0.714]], ["one, ", 1524]]},
}


def repository(tmp_path: pathlib.Path, doc: str, record: dict | None = RECORD) -> pathlib.Path:
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "docs" / "page.md").write_text(doc)
    if record is not None:
        (tmp_path / "benchmarks" / "results").mkdir(parents=True)
        (tmp_path / "benchmarks" / "results" / "run.json").write_text(json.dumps(record))
    return tmp_path


def test_the_repository_docs_match_their_records():
    errors = doc_numbers.Checker(ROOT).run()
    assert not errors, "\n".join(
        errors + ["run `python benchmarks/doc_numbers.py` (--write puts the records' numbers)"]
    )


def test_the_repository_has_markers_in_the_readme_and_the_docs_it_covers():
    for doc in ("README.md", "docs/performance.md", "docs/install.md", "docs/accounting.md", "examples/README.md"):
        assert "<!-- numbers: benchmarks/results/" in (ROOT / doc).read_text(), doc


def test_every_measured_number_in_the_docs_has_a_record():
    found = [
        f"{doc.relative_to(ROOT)}:{line}: {number}"
        for doc in doc_numbers.doc_paths(ROOT)
        for line, number in doc_numbers.unmarked(doc, doc.read_text(encoding="utf-8").split("\n"))
    ]
    assert not found, "measured numbers without a record (a marker and benchmarks/results/):\n" + "\n".join(found)


def test_unmarked_finds_measured_numbers_outside_markers_and_code():
    doc = """<!-- numbers: benchmarks/results/run.json -->
| stack | ratio |
|---|---|
| Keras 3 | 1.52x |

The step took 12.5 ms, 1.4x the non-private one (`--repeats 5`, 3 x 3 kernels).
A full-batch fit would be reported at epsilon 5.4 instead of 75, at ε = 3.0 (`target_epsilon=3.5`; epsilon >= 1.5x).
```
1.9x and epsilon 2.5 in code
```
"""
    assert doc_numbers.unmarked(pathlib.Path("d.md"), doc.split("\n")) == [
        (6, "12.5 ms"),
        (6, "1.4x"),
        (7, "epsilon 5.4"),
        (7, "ε = 3.0"),
        (7, "1.5x"),
    ]


def test_matching_table_and_paragraph_pass(tmp_path):
    assert doc_numbers.Checker(repository(tmp_path, TABLE_DOC)).run() == []
    assert doc_numbers.Checker(repository(tmp_path / "p", PARAGRAPH_DOC)).run() == []


def test_a_changed_table_number_fails_naming_file_line_and_both_numbers(tmp_path):
    root = repository(tmp_path, TABLE_DOC.replace("1.79x", "1.80x"))
    assert doc_numbers.Checker(root).run() == [
        "docs/page.md:7: a number of the row: the doc says 1.80, the record benchmarks/results/run.json says 1.79"
    ]


def test_a_changed_quoted_number_fails(tmp_path):
    root = repository(tmp_path, PARAGRAPH_DOC.replace("0.714", "0.741"))
    (error,) = doc_numbers.Checker(root).run()
    assert error.startswith("docs/page.md:4: after 'pretraining, ': the doc says 0.741") and error.endswith("0.714")


def test_a_missing_record_fails(tmp_path):
    (error,) = doc_numbers.Checker(repository(tmp_path, TABLE_DOC, record=None)).run()
    assert error.startswith("docs/page.md:3: the record benchmarks/results/run.json is missing")


def test_a_row_or_quote_that_no_longer_reads_as_recorded_fails(tmp_path):
    errors = doc_numbers.Checker(
        repository(tmp_path, TABLE_DOC.replace("| Keras 2 | 0.0134 s |", "| Keras 2 | |"))
    ).run()
    assert errors == ["docs/page.md:7: the row has 1 numbers, the record benchmarks/results/run.json 2"]
    errors = doc_numbers.Checker(repository(tmp_path / "p", PARAGRAPH_DOC.replace("accuracy 0.686", "0.686"))).run()
    assert errors == [
        "docs/page.md:4: no number after 'accuracy ': the paragraph no longer quotes benchmarks/results/run.json"
    ]


def test_a_value_the_record_no_longer_has_fails_and_is_not_written(tmp_path):
    record = {**RECORD, "results": {"k2": RECORD["results"]["k2"]}}  # re-measured, laid out otherwise
    for write in (False, True):
        root = repository(tmp_path / str(write), TABLE_DOC, record)
        assert doc_numbers.Checker(root, write=write).run() == [
            f"docs/page.md:6: a number of the row: the doc says {number}, the record benchmarks/results/run.json has "
            f"nothing at results.k3.{key}"
            for number, key in (("0.0170", "seconds"), ("1.52", "ratio"))
        ]
        assert (root / "docs" / "page.md").read_text() == TABLE_DOC


def test_write_puts_the_records_numbers_back(tmp_path):
    root = repository(tmp_path, TABLE_DOC.replace("0.0170 s", "0.0180 s").replace("1.79x", "1.80x"))
    assert doc_numbers.Checker(root, write=True).run() == []
    assert (root / "docs" / "page.md").read_text() == TABLE_DOC
    root = repository(tmp_path / "p", PARAGRAPH_DOC.replace("1,524", "1,542"))
    assert doc_numbers.main(["--write", f"--root={root}"]) == 0
    assert (root / "docs" / "page.md").read_text() == PARAGRAPH_DOC
    assert doc_numbers.main([f"--root={root}"]) == 0


def test_numbers_are_read_and_written_as_the_doc_writes_them():
    assert [m[0] for m in doc_numbers.tokens("2026-12-07: 1,724 tests, 0.0108 s (1x), (-2.4%), 2.1-2.2x, L64")] == [
        "2026-12-07",
        "1,724",
        "0.0108",
        "1",
        "-2.4",
        "2.1",
        "2.2",
    ]
    assert doc_numbers.formatted(1724, "1,700") == "1,724"
    assert doc_numbers.formatted(0.017, "0.0170") == "0.0170"
    assert doc_numbers.formatted(-0.0241, "-2.4") == "0.0"
    assert doc_numbers.formatted(2.7e-15, "+2.70e-15") == "+2.70e-15"
    assert doc_numbers.formatted("2026-12-07", "2026-12-07") == "2026-12-07"
