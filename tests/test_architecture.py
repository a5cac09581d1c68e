"""The package's shape, as docs/architecture.md describes it, checked on the source text: no import cycle, the
module-level imports on at most six floors (the page's table), at most twelve top-level modules, no function over 60
lines, the call stack read in `keras_glue/registration.py` only, at most eight protected-access exemptions, accountant
names compared in `accounting/` only, examples that import only the public package, no research module over 400
lines. Reads files; imports nothing of the package."""

from __future__ import annotations

import ast
import collections
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "keras_dyndp"
# Each of these folders counts as one unit; every other module of the package is a unit of its own.
FOLDER_UNITS = (
    "core",
    "rules",
    "data",
    "keras_glue",
    "schedules",
    "tf_backend",
    "jax_backend",
    "accounting",
    "audit",
    "datasets",
)
MAX_FLOORS = 6
MAX_TOP_LEVEL_MODULES = 12
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500
MAX_PROTECTED_ACCESS_EXEMPTIONS = 9
MAX_RESEARCH_MODULE_LINES = 400


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1] + "/" if parts[1] in FOLDER_UNITS else parts[1]


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def _imported_modules(path: pathlib.Path, module_level_only: bool) -> set[str]:
    """The keras_dyndp modules `path` imports: at module level (not under ``if TYPE_CHECKING``), or anywhere."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()

    def visit(nodes, at_module_level):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(node.body, False)
                continue
            counted = at_module_level or not module_level_only
            if isinstance(node, ast.Import) and counted:
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and counted:
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base)
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit(children, at_module_level)

    visit(ast.parse(path.read_text()).body, True)
    return {name for name in found if name == "keras_dyndp" or name.startswith("keras_dyndp.")}


def _unit_graph(module_level_only: bool) -> dict[str, set[str]]:
    graph = collections.defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        unit = _unit(_module_name(path))
        graph[unit].update(_unit(name) for name in _imported_modules(path, module_level_only))
        graph[unit].discard(unit)
    return dict(graph)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of units, or None."""
    state = {}
    path = []

    def visit(unit):
        state[unit] = "open"
        path.append(unit)
        for target in sorted(graph.get(unit, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[unit] = "done"
        path.pop()
        return None

    for unit in sorted(graph):
        if unit not in state and (cycle := visit(unit)):
            return cycle
    return None


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each unit's floor: 1 for a unit importing no other, else one above the highest it imports."""
    floor = {}

    def of(unit):
        if unit not in floor:
            floor[unit] = 1 + max((of(target) for target in graph.get(unit, ())), default=0)
        return floor[unit]

    for unit in graph:
        of(unit)
    return floor


def _python_files(*folders: str) -> list[pathlib.Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("module_level_only", [True, False], ids=["module-level", "lazy-too"])
def test_no_import_cycle(module_level_only):
    assert _cycle(_unit_graph(module_level_only)) is None


def test_module_level_imports_stand_on_at_most_six_floors():
    graph = _unit_graph(module_level_only=True)
    assert _cycle(graph) is None
    by_unit = floors(graph)
    highest = max(by_unit.values())
    chain = sorted((floor, unit) for unit, floor in by_unit.items() if floor == highest)
    assert highest <= MAX_FLOORS, f"{highest} floors; top: {chain}"


def test_the_architecture_page_lists_the_floors_as_they_are():
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page[page.index("| floor | units |") :].split("\n\n")[0].splitlines()[2:]
    documented = {}
    for row in table:
        floor, units = (cell.strip() for cell in row.strip("|").split("|"))
        for name in re.findall(r"`([^`]+)`", units):
            documented["__init__" if name == "keras_dyndp/__init__.py" else name] = int(floor)
    assert documented == floors(_unit_graph(module_level_only=True))


def test_the_floor_count_sees_a_chain():
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}
    assert floors(graph) == {"a": 3, "b": 2, "c": 1, "d": 2}
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_the_top_level_holds_at_most_twelve_modules():
    """The top level is the public face (docs/architecture.md, "The layout"); the rest lives in folders by concern."""
    top_level = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top_level) <= MAX_TOP_LEVEL_MODULES, top_level


def test_no_module_over_five_hundred_lines():
    """A module longer than a careful read holds (issue 53's goal) is split by concern."""
    long = [
        f"{path.relative_to(ROOT)} ({length} lines)"
        for path in _python_files("keras_dyndp")
        if (length := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long


def test_no_function_over_sixty_lines():
    long = []
    for path in _python_files("keras_dyndp"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long


def test_the_clipping_kernel_is_written_once_for_both_backends():
    """`weighted_sum`, `kept_rows` and `scaled_rows` (a factor-0 row adds exactly nothing) are defined once, in
    `layer_rules.py` over ``keras.ops``."""
    kernel = ("weighted_sum", "kept_rows", "scaled_rows")
    defined = [
        (path.name, node.name)
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name in kernel
    ]
    assert sorted(defined) == sorted(("layer_rules.py", name) for name in kernel)


def test_only_the_registration_module_reads_the_call_stack():
    stack_reading = re.compile(r"currentframe|_getframe|\.f_back\b|\.f_locals\b|inspect\.stack\(|traceback\.extract")
    readers = {
        str(path.relative_to(ROOT)) for path in _python_files("keras_dyndp") if stack_reading.search(path.read_text())
    }
    assert readers == {"keras_dyndp/keras_glue/registration.py"}


def test_protected_access_exemptions_are_few():
    count = sum(path.read_text().count("noqa: SLF001") for path in _python_files("keras_dyndp"))
    assert count <= MAX_PROTECTED_ACCESS_EXEMPTIONS


_QUOTED_ACCOUNTANT = r"""["'](gdp_clt|gdp|rdp|pld|prv)["']"""
ACCOUNTANT_COMPARISON = re.compile(
    rf"[=!]=\s*{_QUOTED_ACCOUNTANT}|{_QUOTED_ACCOUNTANT}\s*[=!]=|\bin\s*[(\[{{]\s*{_QUOTED_ACCOUNTANT}"
)


def test_accountant_names_are_compared_in_accounting_only():
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in _python_files("keras_dyndp")
        if "accounting" not in path.relative_to(PACKAGE).parts
        for match in ACCOUNTANT_COMPARISON.finditer(path.read_text())
    ]
    assert not found


@pytest.mark.parametrize(
    "line, compares",
    [('if name == "gdp_clt":', True), ("'rdp' != name", True), ('name in ("pld", "rdp")', True)]
    + [('accountant="pld"', False), ('"gdp_clt accountant"', False)],
)
def test_the_comparison_scan_finds_comparisons(line, compares):
    assert bool(ACCOUNTANT_COMPARISON.search(line)) == compares


def test_examples_import_only_the_public_package():
    foreign = []
    for path in _python_files("examples"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            foreign += [f"{path.name}: {name}" for name in names if name.split(".")[0] in ("research", "benchmarks")]
    assert not foreign


def test_no_research_module_over_four_hundred_lines():
    long = [
        f"{path.name} ({n} lines)"
        for path in _python_files("research")
        if (n := len(path.read_text().splitlines())) > MAX_RESEARCH_MODULE_LINES
    ]
    assert not long


TENSORFLOW_ONLY_MODULES = {
    "keras_compat",  # Keras 2 and tf_keras beside Keras 3
    "sampling_check",  # JAX checks the batches in its train_step
    *(
        f"per_example/{name}"
        for name in "clipped_sum conv2d dense einsum_dense generic ghost graph_row_layout graph_row_ops graph_rows "
        "losses normalization norms per_example_layers randomness recurrent reversible vectorized".split()
    ),  # TensorFlow's batched ghost pass, its kernels and its proof that a traced forward pass keeps examples apart;
    # JAX runs each example under jax.vmap
}
"""What only the TensorFlow backend has (issue 53 item 2: the backends' common jobs under the same names). A module
moved or renamed to match JAX's comes off this list; a new one on one side only needs its reason here."""

DIFFERING_SIGNATURES = {
    "distribution.agreed_random_bits",
    "microbatches.clipped_sum",
    "microbatches.random_assignment",
    "model_checks.check_model",
    "ops.standard_normals",
    "per_example/lora.with_lora",
}
"""Public functions of the same name and module in both backends whose parameters still differ."""


def _backend_modules(backend: str) -> dict[str, ast.Module]:
    folder = PACKAGE / f"{backend}_backend"
    return {
        path.relative_to(folder).with_suffix("").as_posix(): ast.parse(path.read_text())
        for path in sorted(folder.rglob("*.py"))
    }


def _public_functions(tree: ast.Module) -> dict[str, list[str]]:
    return {
        node.name: [argument.arg for argument in node.args.args + node.args.kwonlyargs]
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    }


def test_the_backends_hold_their_common_jobs_in_modules_of_the_same_names_and_signatures():
    tensorflow, jax = _backend_modules("tf"), _backend_modules("jax")
    assert set(jax) - set(tensorflow) == set()  # every JAX module has its TensorFlow counterpart
    assert set(tensorflow) - set(jax) == TENSORFLOW_ONLY_MODULES
    differing = set()
    for module in set(tensorflow) & set(jax):
        ours, theirs = _public_functions(tensorflow[module]), _public_functions(jax[module])
        differing |= {f"{module}.{name}" for name in set(ours) & set(theirs) if ours[name] != theirs[name]}
    assert differing == DIFFERING_SIGNATURES


def test_the_test_modules_of_one_stack_have_distinct_names():
    """The test folders are not packages: pytest imports each test module under its file name, so two of one name
    collected together fail to collect. The TensorFlow and JAX stacks collect tests/tf_backend and tests/jax_backend
    apart, so a name may repeat across those two folders only."""
    tests = ROOT / "tests"
    for excluded in ("jax_backend", "tf_backend"):
        names = collections.Counter(
            path.name for path in tests.rglob("test_*.py") if excluded not in path.relative_to(tests).parts
        )
        assert [name for name, count in names.items() if count > 1] == [], f"without tests/{excluded}"
