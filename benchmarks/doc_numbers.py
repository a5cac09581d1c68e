"""Checks the numbers of README.md, docs/*.md and examples/README.md that describe a run against their records.

A marker names the records (``benchmarks/results/<name>.json``, written by ``benchmarks/records.py``) behind the
table or paragraph right after it:

    <!-- numbers: benchmarks/results/step_time_cnn_vnni.json -->
    | stack | oneDNN | non-private SGD | keras_dyndp |
    ...

* Before a table: the records' ``rows`` (concatenated, in the order named) are the table's body rows, one each:
  ``{"label": [cells], "values": [...]}``. A row's first cells must read as its ``label``; the numbers of its other
  cells, in reading order, must be its ``values`` at the doc's rounding (``0.0170`` is a value that rounds to 4
  decimals as 0.0170; ``1,724`` keeps its comma). A value is a number, a string (the doc's token verbatim: a date, a
  setting) or ``"results.<key>.<key>..."``, a path into the record's ``results``.
* Before a paragraph: each of the records' ``quoted``, ``[context, value]`` or ``[context, [values]]``, must appear
  as the context (its spaces match any whitespace) followed by the value (the next numbers: the values), at the
  doc's rounding. A record quoted by several paragraphs names its groups (``"quoted": {"readme": [...], ...}``) and
  each marker one (``benchmarks/results/x.json#readme``).
* A record with ``recompute`` (a name in `RECOMPUTE`) gets its ``results`` computed now from the command it states
  (keras_dyndp's accounting, a few seconds), so the doc is checked against the computation, not a copy.

``--unmarked`` lists the numbers with the unit of a run (`MEASURED`: 1.41x, 12 ms, 91.1%, 1,524 tests) and the
epsilons stated in prose (`EPSILON`: epsilon 1.99, ε = 3.0, accounting results) that no marker covers, outside code
spans and fences (tests/test_doc_numbers.py: there are none).

A marker whose record is missing is an error: a number that describes a run needs its record. Exit status 1 with one
line per difference (``file:line: ... the doc says X, the record Y``), 0 when every number matches. ``--write``
rewrites the docs' numbers from the records (and a recomputed record's ``results``) instead.

    python benchmarks/doc_numbers.py [--write | --unmarked] [--root=.]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
MARKER = re.compile(r"<!-- numbers: (?P<records>[^>]*?) -->")  # records: "path[#quotes] ..."
TOKEN = re.compile(
    r"(?P<date>\b\d{4}-\d{2}-\d{2}\b)"
    r"|(?P<number>(?:(?<=[\s(])[+-])?(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[+-]?\d+)?(?![\d]))"
)


def doc_paths(root: pathlib.Path) -> list[pathlib.Path]:
    """The docs whose numbers are checked: README.md, docs/*.md, examples/README.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "examples" / "README.md"]


def tokens(text: str) -> list[re.Match]:
    """The numbers (and dates, kept whole) of ``text``, in reading order."""
    return list(TOKEN.finditer(text))


def formatted(value: object, token: str) -> str:
    """``value`` written as the doc's ``token`` is written: its decimals, thousands commas, sign and exponent;
    a string value is compared verbatim."""
    if isinstance(value, str):
        return value
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    spec = ("+" if token.startswith("+") else "") + ("," if "," in token else "")
    if exponent:
        return _exp(value, token)
    text = f"{value:{spec}.{decimals}f}"
    return "0" + text[2:] if text.startswith("-0") and float(text) == 0 else text


def _exp(value: float, token: str) -> str:
    """``value`` in the doc's exponent notation (``+2.70e-15``: decimals and exponent digits as the token)."""
    mantissa, exponent = token.lower().split("e")
    spec = "+" if token.startswith("+") else ""
    text = f"{value:{spec}.{len(mantissa.partition('.')[2])}e}"
    digits = len(exponent.lstrip("+-"))
    head, tail = text.split("e")
    return f"{head}e{tail[0]}{tail[1:].lstrip('0').rjust(digits, '0')}"


@dataclasses.dataclass
class Block:
    """The lines after a marker: a table's body rows or a paragraph."""

    doc: pathlib.Path
    marker_line: int  # 1-based
    records: list[str]
    first_line: int  # 0-based index of the block's first line in the doc
    lines: list[str]
    is_table: bool


def blocks(doc: pathlib.Path, lines: list[str]) -> list[Block]:
    """Every marker of ``doc`` with the table (its body rows) or paragraph after it."""
    found = []
    for index, line in enumerate(lines):
        marker = MARKER.search(line)
        if not marker:
            continue
        start = index + 1
        while start < len(lines) and (not lines[start].strip() or lines[start].lstrip().startswith("<!--")):
            start += 1  # blank lines and other comments (another checker's marker) between a marker and its block
        end = start
        while end < len(lines) and lines[end].strip() and not MARKER.search(lines[end]):
            end += 1
        is_table = start < len(lines) and lines[start].lstrip().startswith("|")
        if is_table:  # the header and its separator are no run's numbers
            end = start
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                end += 1
            start = min(start + 2, end)
        found.append(Block(doc, index + 1, marker["records"].split(), start, lines[start:end], is_table))
    return found


MEASURED = re.compile(
    r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:-\d+(?:\.\d+)?)?"
    r"(?:x|%|\s?(?:ns|us|µs|ms|s|seconds?|minutes?|min|hours?|tests?))(?![\w-])"
)
"""A number with the unit of a measured run: a ratio (1.41x), a time, a share, a test count. (Sizes are left out:
in the docs they describe data, files and machines.)"""
EPSILON = re.compile(
    r"(?<![\w-])(?:epsilon|ε|claim|f-DP)(?:[\s=:(~≈<>≤≥]+[^\s\d]*){1,4}?(?<![\w.])(?P<number>\d+\.\d+)(?![\d.]*\d)",
    re.IGNORECASE,
)
"""An epsilon a doc states: the word epsilon (or ε, claim, f-DP) followed within a few words by a decimal number
(epsilon 1.99, PLD epsilon 4.20, ε = 3.0, claim 8.20, f-DP 5.64): an accounting or audit result (or a setting) that a
record should check.
A number of `MEASURED` (epsilon >= 1.5x) is that pattern's, not an epsilon; a target in code (`target_epsilon=3`) is
left out with the code."""
CODE = re.compile(r"`[^`]*`")


def unmarked(doc: pathlib.Path, lines: list[str]) -> list[tuple[int, str]]:
    """The numbers of ``doc`` outside code that no marker's block covers: the measured ones (`MEASURED`: 1.41x,
    12 ms) and the epsilons (`EPSILON`: epsilon 1.99), each as (1-based line, the number or ``epsilon ... number``
    as the doc writes it), in reading order. Each is a number that describes a run (or an accounting result)
    without a record to check it against.

    Args:
        doc: The doc's path (its blocks' errors name it).
        lines: The doc's lines, without their line ends.
    """
    covered = {block.first_line + offset for block in blocks(doc, lines) for offset in range(len(block.lines))}
    found, fenced = [], False
    for index, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and index not in covered:
            text = CODE.sub("", line)
            measured = list(MEASURED.finditer(text))
            epsilons = [
                match
                for match in EPSILON.finditer(text)
                if not any(m.start() <= match.start("number") < m.end() for m in measured)
            ]
            found += [(index + 1, match[0]) for match in sorted(measured + epsilons, key=lambda m: m.start())]
    return found


def resolve(value: object, results: dict, root: pathlib.Path) -> object:
    """A row's or quote's value: a literal, the value at ``results.<key>...`` of the record, or at
    ``<another record>:results.<key>...`` (a summary that quotes the runs of other records)."""
    reference = value
    try:
        if isinstance(value, str) and re.fullmatch(r"[\w/.-]+\.json:results\..+", value):
            name, _, value = value.partition(":")
            results = load_record(root, name).get("results", {})
        if not (isinstance(value, str) and value.startswith("results.")):
            return value
        found: object = results
        for key in value.split(".")[1:]:
            found = found[int(key)] if isinstance(found, list) else found[key]
        return found
    except (OSError, KeyError, IndexError, ValueError, TypeError):
        return Missing(reference)


class Missing(str):
    """A value a row or quote names that its record does not have (a re-measured record whose results are laid out
    otherwise: map its ``rows`` / ``quoted`` to them)."""

    def __new__(cls, reference: str):
        return super().__new__(cls, f"nothing at {reference}")


@functools.cache
def _recomputed(name: str) -> dict:
    return RECOMPUTE[name]()


def load_record(root: pathlib.Path, name: str) -> dict:
    """The record at ``root / name``, its ``results`` recomputed where it names a `RECOMPUTE` function."""
    record = json.loads((root / name).read_text(encoding="utf-8"))
    if "recompute" in record:
        record["results"] = _recomputed(record["recompute"])
    return record


def cells(line: str) -> list[tuple[int, str]]:
    """The cells of a table row with their offsets in the line (a ``|`` inside backticks does not split)."""
    found, start, quoted = [], line.index("|") + 1, False
    for offset in range(start, len(line)):
        if line[offset] == "`":
            quoted = not quoted
        elif line[offset] == "|" and not quoted:
            found.append((start, line[start:offset]))
            start = offset + 1
    return found


@dataclasses.dataclass
class Checker:
    """Checks (or, with ``write``, rewrites) the numbers of the blocks against their records."""

    root: pathlib.Path
    write: bool = False
    errors: list[str] = dataclasses.field(default_factory=list)
    records_written: dict = dataclasses.field(default_factory=dict)

    def error(self, block: Block, offset: int, message: str) -> None:
        line = block.first_line + offset + 1 if offset >= 0 else block.marker_line
        self.errors.append(f"{block.doc.relative_to(self.root)}:{line}: {message}")

    def compare(self, block: Block, offset: int, match: re.Match, value: object, what: str, name: str) -> str | None:
        """The rewritten token where the doc's token differs from ``value`` at its rounding (else None)."""
        expected = formatted(value, match[0])
        if expected == match[0]:
            return None
        if isinstance(value, Missing):  # never written into a doc
            self.error(block, offset, f"{what}: the doc says {match[0]}, the record {name} has {value}")
            return None
        if not self.write:
            self.error(block, offset, f"{what}: the doc says {match[0]}, the record {name} says {expected}")
        return expected

    def records(self, block: Block) -> list[tuple[str, dict]] | None:
        """The block's records, or None (an error) where one is missing or unreadable."""
        loaded = []
        for name in block.records:
            name, _, group = name.partition("#")
            if not (self.root / name).is_file():
                self.error(block, -1, f"the record {name} is missing: a number that describes a run needs its record")
                return None
            record = load_record(self.root, name)
            if "recompute" in record:
                self.records_written[name] = record
            if group:  # a paragraph quoting one group of the record's quotes
                record = {**record, "quoted": record.get("quoted", {}).get(group)}
                if record["quoted"] is None:
                    self.error(block, -1, f"the record {name} has no quotes named {group!r}")
                    return None
            loaded.append((name, record))
        return loaded

    def check_table(self, block: Block, loaded: list[tuple[str, dict]]) -> None:
        rows = [(name, record, row) for name, record in loaded for row in record.get("rows", [])]
        if len(rows) != len(block.lines):
            self.error(block, -1, f"the table has {len(block.lines)} rows, its records {len(rows)}")
            return
        for offset, (name, record, row) in enumerate(rows):
            line = block.lines[offset]
            row_cells = cells(line)
            label = [text.strip() for _, text in row_cells[: len(row["label"])]]
            if label != row["label"]:
                self.error(block, offset, f"the row reads {label}, the record {name} has {row['label']}")
                continue
            start = row_cells[len(label)][0] if len(row_cells) > len(label) else len(line)
            found = [m for m in tokens(line[start:])]
            values = [resolve(value, record.get("results", {}), self.root) for value in row["values"]]
            if len(found) != len(values):
                self.error(block, offset, f"the row has {len(found)} numbers, the record {name} {len(values)}")
                continue
            names = [_source(value, name) for value in row["values"]]
            what = "a number of the row"
            edits = [(m, self.compare(block, offset, m, v, what, n)) for m, v, n in zip(found, values, names)]
            block.lines[offset] = line[:start] + _edited(line[start:], edits)

    def check_paragraph(self, block: Block, loaded: list[tuple[str, dict]]) -> None:
        text = "\n".join(block.lines)
        edits = []
        for name, record in loaded:
            for context, values in record.get("quoted", []):
                values = values if isinstance(values, list) else [values]
                pattern = r"\s+".join(map(re.escape, context.split())) + (r"\s" if context.endswith(" ") else "")
                match = re.search(pattern, text)
                found = tokens(text[match.end() :])[: len(values)] if match else []
                if len(found) < len(values) or text[match.end() : match.end() + found[0].start()].strip():
                    self.error(block, 0, f"no number after {context!r}: the paragraph no longer quotes {name}")
                    continue
                for number, value in zip(found, values):
                    number = TOKEN.match(text, match.end() + number.start())
                    line = text.count("\n", 0, number.start())
                    value = resolve(value, record.get("results", {}), self.root)
                    edits.append((number, self.compare(block, line, number, value, f"after {context!r}", name)))
        block.lines = _edited(text, edits).split("\n")

    def run(self) -> list[str]:
        """Checks every doc; with ``write``, rewrites the docs (and recomputed records) instead. The errors."""
        for doc in doc_paths(self.root):
            if not doc.is_file():
                continue
            lines = doc.read_text(encoding="utf-8").split("\n")
            found = blocks(doc, lines)
            for block in found:
                loaded = self.records(block)
                if loaded is not None:
                    (self.check_table if block.is_table else self.check_paragraph)(block, loaded)
            if self.write:
                for block in reversed(found):
                    lines[block.first_line : block.first_line + len(block.lines)] = block.lines
                doc.write_text("\n".join(lines), encoding="utf-8")
        if self.write:
            for name, record in self.records_written.items():
                stored = json.loads((self.root / name).read_text(encoding="utf-8"))
                stored["results"] = record["results"]
                (self.root / name).write_text(json.dumps(stored, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return self.errors


def _source(value: object, name: str) -> str:
    """The record a row's value comes from: ``name``, or the other record a ``<record>:results...`` value names."""
    return value.partition(":")[0] if isinstance(value, str) and ".json:results." in value else name


def _edited(text: str, edits: list[tuple[re.Match, str | None]]) -> str:
    """``text`` with each matched token replaced by its rewrite (None: kept)."""
    for match, new in sorted(((m, n) for m, n in edits if n is not None), key=lambda e: -e[0].start()):
        text = text[: match.start()] + new + text[match.end() :]
    return text


def _zcdp_report_row() -> dict:
    """docs/accounting.md's `dyndp-privacy --epsilon=1.2 --num_examples=60000 --batch_size=250 --epochs=20
    --rho_mu=1.25 --rho_c=3.333 --initial_clip=1.5`: the zcdp row's first noise multiplier and PLD epsilon (delta
    1 / (10 N), the command's default)."""
    from keras_dyndp import schedules  # pylint: disable=import-outside-toplevel  (only for records that recompute)

    delta = 1 / (10 * 60000)
    zcdp = schedules.calibrate(
        "zcdp",
        target_epsilon=1.2,
        target_delta=delta,
        sampling_probability=250 / 60000,
        num_steps=4800,
        initial_clip=1.5,
        rho_mu=1.25,
        rho_c=3.333,
    )
    return {"first_noise_multiplier": float(zcdp.noise_multipliers[0]), "pld_epsilon": float(zcdp.epsilon(delta))}


def _gdp_clt_calibration_examples() -> dict:
    """The PLD epsilon (delta 1e-5) of docs/accounting.md's calibration examples (benchmarks/calibration_examples.py),
    each calibrated under the GDP-CLT (``schedules.calibrate_shape(1.0, target_delta=1e-5, accountant='gdp_clt',
    ...)``, as `python benchmarks/accounting.py --calibration_examples` prints it), keyed as the examples are ordered:
    ``"0"`` (p 0.01, T 20) .. ``"4"`` (growing mu 1/rho_mu 0.1 at 1.2)."""
    from keras_dyndp import schedules  # pylint: disable=import-outside-toplevel  (only for records that recompute)

    spec = importlib.util.spec_from_file_location("calibration_examples", HERE / "calibration_examples.py")
    examples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(examples)
    found = {}
    for index, (_, arguments) in enumerate(examples.EXAMPLES):
        schedule = schedules.calibrate_shape(1.0, target_delta=1e-5, accountant="gdp_clt", **arguments)
        found[str(index)] = float(schedule.epsilon(1e-5, "pld"))
    return found


def _sampling_added_delta() -> dict:
    """docs/privacy.md's "What sampling adds to delta" (keras_dyndp.core.batch_sizes): at N = 60000, p = 250 / 60000,
    T = 4800, eta of the default cap and batch-size range (1e-15 tails) and the delta it adds at epsilon 1.2, 2 and 8;
    the same at epsilon 8 with the 1e-12 tails of before; and the share of batches (in percent) that
    ``max_batch_size=2`` truncates at N = 40, p = 0.1."""
    from keras_dyndp.core import batch_sizes  # pylint: disable=import-outside-toplevel  (only for records that recompute)

    num_examples, probability, steps = 60000, 250 / 60000, 4800
    epsilons = ("1_2", "2", "8")  # keys without dots: a path into results splits at them
    found = {}
    for tails, key in ((batch_sizes.BATCH_SIZE_TAIL, "default"), (1e-12, "tails_1e_12")):
        size_range = batch_sizes.batch_size_range(num_examples, probability, tails)
        eta = batch_sizes.overflow_probability(num_examples, probability, size_range[1], size_range=size_range)
        found[key] = {
            "eta": eta,
            **{
                f"added_delta_at_{e}": batch_sizes.added_delta(eta, steps, float(e.replace("_", "."))) for e in epsilons
            },
        }
    found["truncated_percent_cap_2_n_40_p_0_1"] = 100 * batch_sizes.overflow_probability(40, 0.1, 2)
    return found


def _gdp_audit_reference() -> dict:
    """The claim of docs/audit.md's reference point (tests/audit/test_bounds.py): mu = 1.7 GDP at delta 1e-5, as an
    epsilon (`keras_dyndp.accounting.epsilon_from_mu`)."""
    from keras_dyndp.accounting import gdp  # pylint: disable=import-outside-toplevel

    mu, delta = 1.7, 1e-5
    return {"mu": mu, "delta": delta, "claimed_epsilon": gdp.epsilon_from_mu(mu, delta)}


def _planted_fault_claim() -> dict:
    """docs/audit.md's planted-fault schedule (tests/audit/test_white_box.py's ``_schedule(FAULT_MU)``): p = 1,
    T = 8, C_t geometric from 1 to 0.5, one sigma giving mu = sqrt(sum_t (C_t / sigma)^2) = 0.5; the epsilon the
    white-box audit claims for it (``schedule.epsilon(1e-5, "pld")``, as `white_box.white_box_audit` does) and the
    settings the doc states."""
    import numpy as np  # pylint: disable=import-outside-toplevel  (only for records that recompute)

    from keras_dyndp import schedules  # pylint: disable=import-outside-toplevel

    steps, first_clip, last_clip, mu, delta = 8, 1.0, 0.5, 0.5, 1e-5
    clip_norms = np.geomspace(first_clip, last_clip, steps)
    sigma = np.sqrt(np.sum(clip_norms**2)) / mu
    schedule = schedules.DPSchedule(clip_norms, np.full(steps, sigma), 1.0)
    return {
        "sampling_probability": 1.0,
        "steps": steps,
        "first_clip": first_clip,
        "last_clip": last_clip,
        "mu": mu,
        "delta": delta,
        "claimed_epsilon": float(schedule.epsilon(delta, "pld")),
    }


def _full_batch_fit_epsilon() -> dict:
    """docs/privacy.md's "Refused, and why": the epsilon a 20-step schedule at p = 0.01 (delta 1e-5, constant clip 1)
    reports (PLD, `PrivacyLogger`'s default) and its epsilon when `fit` trains on the full batch instead (the same
    noise multipliers at p = 1), for the schedule calibrated to 1.0 under the GDP-CLT (docs/accounting.md's first
    calibration example) and under PLD (the default); and the batch-size check's tail
    (``batch_sizes.BATCH_SIZE_TAIL``, both sides summed)."""
    from keras_dyndp import schedules  # pylint: disable=import-outside-toplevel  (only for records that recompute)
    from keras_dyndp.core import batch_sizes  # pylint: disable=import-outside-toplevel

    probability, steps, delta = 0.01, 20, 1e-5
    found = {"sampling_probability": probability, "steps": steps, "delta": delta}
    for accountant in ("gdp_clt", "pld"):
        schedule = schedules.calibrate_shape(
            1.0,
            1.0,
            target_epsilon=1.0,
            target_delta=delta,
            sampling_probability=probability,
            num_steps=steps,
            accountant=accountant,
        )
        full_batch = schedules.DPSchedule(schedule.clip_norms, schedule.noise_stddevs, 1.0)
        found[f"calibrated_{accountant}"] = {
            f"{name}_pld": float(s.epsilon(delta, "pld"))
            for name, s in (("reported", schedule), ("full_batch", full_batch))
        }
    found["batch_size_tail"] = batch_sizes.BATCH_SIZE_TAIL
    found["batch_size_tails"] = 2 * batch_sizes.BATCH_SIZE_TAIL
    return found


# The functions a record's ``recompute`` names: each returns the record's ``results``, computed now (seconds).
RECOMPUTE = {
    "zcdp_report_row": _zcdp_report_row,
    "gdp_clt_calibration_examples": _gdp_clt_calibration_examples,
    "sampling_added_delta": _sampling_added_delta,
    "planted_fault_claim": _planted_fault_claim,
    "gdp_audit_reference": _gdp_audit_reference,
    "full_batch_fit_epsilon": _full_batch_fit_epsilon,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--write", action="store_true", help="rewrite the docs' numbers from the records")
    parser.add_argument("--root", default=str(HERE.parent), help="the repository")
    parser.add_argument("--unmarked", action="store_true", help="list the measured numbers no marker covers")
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root).resolve()
    if args.unmarked:
        for doc in doc_paths(root):
            for line, number in unmarked(doc, doc.read_text(encoding="utf-8").split("\n")):
                print(f"{doc.relative_to(root)}:{line}: {number}")
        return 0
    errors = Checker(root, write=args.write).run()
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
