"""The package layout is the architecture: imports point one way, no circles, and every path the
documentation names is real."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.support.paths import REPO

PACKAGE = REPO / "proxy"

# What each part of proxy/ may import, besides itself. A part is a subpackage, or one of the
# root modules. The process modules (cli, server, workers, devmode, __main__) may import anything.
PROCESS = {"cli", "server", "workers", "devmode", "__main__"}
BASE = {"settings", "errors", "proxy"}  # "proxy": the root package's own (empty) __init__
SERVES = {"runtime", "gate", "observe", "policy", "store"} | BASE  # what every front end uses
MAY_IMPORT: dict[str, set[str]] = {
    "errors": {"proxy"},
    "settings": {"proxy"},
    "store": {"errors", "proxy"},
    "policy": {"errors", "proxy"},
    # the offline verifier runs from the wheel alone: nothing of opgate's
    "transparency": {"proxy"},
    # x402's pure core: the protocol's parsing and signing (the SDK's), nothing of opgate's
    "x402": {"proxy"},
    # the JWS verifier is transparency's (jws), shared with the offline bundle's check
    "mandates": {"policy", "transparency", "proxy"},
    "observe": {"policy", "store", "transparency"} | BASE,
    # the process's shared resources: holds the gate's, read by every package that serves
    "runtime": {"gate", "observe", "policy", "store"} | BASE,
    "gate": SERVES | {"x402"},
    # the operations listener's sign-in and answers, shared by what it serves
    "admin": {"gate"} | BASE,
    "forward": SERVES,
    # reconciliation reads an x402 payment's nonce state (recovery/x402_state.py)
    "recovery": SERVES | {"x402"},
    "authoring": {"admin"} | SERVES,
    "operations": {"admin", "mandates", "recovery"} | SERVES,
    "proposals": {"operations", "admin", "recovery"} | SERVES,
    "console": {"proposals", "operations", "admin", "recovery"} | SERVES,
    "mcp": {"proposals", "operations", "recovery"} | SERVES,
}


# The gate's public entry points: all that the parts above it use of it. Every other gate
# module (intake, lookup, upstream, ...) is the request path's own business.
GATE_ENTRY_POINTS = {
    "pipeline",  # send a request through the gate
    "reasons",  # its stable codes
    "problem",  # and their problem+json answers
    "decision",  # what a check decides
    "checks",  # the decision core, and the Agent a decision is about
    "transitions",  # may an operation be sent now: the gate's and recovery's one answer
    "identity",  # who is calling
    "ids",  # the one grammar of the ids an operator or an agent names
    "bodies",  # the bodies it reads and composes, strictly
    "budgets",  # the budgets it claims against, and their standings
}
# Which gate modules a part may import; parts not listed are bound by MAY_IMPORT alone. The
# runtime holds the gate's resources and nothing of the request path.
REACHES_INTO_GATE: dict[str, set[str]] = {
    "runtime": {"credentials", "cutoff", "identity", "limits", "signatures"},  # + agent keys
    "admin": GATE_ENTRY_POINTS,
    "operations": GATE_ENTRY_POINTS,
    "proposals": GATE_ENTRY_POINTS,
    # a proposal's page shows the provider's current answer to the rule's preconditions, read
    # by the gate's own lookup and judged by its own rules (proxy/console/explain.py)
    "console": GATE_ENTRY_POINTS | {"lookup", "preconditions"},
    "mcp": GATE_ENTRY_POINTS,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, known: set[str]) -> Iterator[str]:
    """Every proxy module ``path`` imports, at module level or inside a function."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # "from proxy.gate import upstream" imports the module proxy.gate.upstream
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for name in names:
            if name == "proxy" or name.startswith("proxy."):
                while name not in known and "." in name:
                    name = name.rpartition(".")[0]
                yield name


def import_graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    known = {module_name(p) for p in files}
    return {module_name(p): set(imported_modules(p, known)) - {module_name(p)} for p in files}


def part_of(module: str) -> str:
    """``proxy.gate.checks`` -> ``gate``; ``proxy.cli`` -> ``cli``; ``proxy`` -> ``proxy``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "proxy"


def forbidden_imports(graph: Mapping[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        source = part_of(module)
        if source in PROCESS:
            continue
        allowed = MAY_IMPORT.get(source)
        for target in sorted(targets):
            dest = part_of(target)
            if dest == source:
                continue
            if allowed is None or dest not in allowed:
                problems.append(f"{module} -> {target} ({source} may not import {dest})")
    return problems


def gate_reach_ins(graph: Mapping[str, set[str]]) -> list[str]:
    """Imports of a gate module that is not among those the importing part may reach."""
    problems = []
    for module, targets in sorted(graph.items()):
        allowed = REACHES_INTO_GATE.get(part_of(module))
        if allowed is None:
            continue
        for target in sorted(targets):
            if part_of(target) == "gate" and target.removeprefix("proxy.gate.") not in allowed:
                problems.append(f"{module} -> {target} (not an entry point of gate)")
    return problems


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of modules larger than one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


# The root: the process, and what it shares with every package (settings, errors, runtime).
ROOT = PROCESS | BASE | {"runtime", "__init__"}


def test_the_root_holds_only_the_process() -> None:
    """`ls proxy/*.py` lists the process and what it shares: the rest lives in packages named
    for their role."""
    root = {p.stem for p in PACKAGE.glob("*.py")}
    assert root <= ROOT, sorted(root - ROOT)


def test_every_package_says_what_it_owns_and_what_it_may_import() -> None:
    """Each subpackage's __init__ docstring names what it owns and its allowed imports."""
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text("utf-8")))
        assert doc, f"{init}: no docstring"
        assert len(doc.splitlines()) >= 3, f"{init}: a docstring of a few lines"
        assert "May import" in doc, f"{init}: the docstring does not say what it may import"
    for name in MAY_IMPORT:
        if name not in ROOT:
            assert (PACKAGE / name / "__init__.py").is_file(), name


def modules_missing_from_docstring(package: Path) -> list[str]:
    """The modules and subpackages of ``package`` its __init__ docstring does not name (as a
    word: ``intake`` or ``intake.py``)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text("utf-8"))) or ""
    held = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    held += [d.name for d in package.iterdir() if (d / "__init__.py").is_file()]
    return sorted(n for n in held if not re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", doc))


def test_every_package_docstring_names_every_module_it_holds() -> None:
    """A reader of a package's __init__ learns every module it holds, so a new one is placed
    and described, not just dropped in."""
    missing = {
        str(init.parent.relative_to(REPO)): modules_missing_from_docstring(init.parent)
        for init in sorted(PACKAGE.rglob("*/__init__.py"))
    }
    assert {package: names for package, names in missing.items() if names} == {}


# The two drawings of the layout a reader meets first: the README's table and the root
# package's docstring. Each lists the packages top-down, importers above what they import.
_README_ROW = re.compile(r"^  \| (`proxy/[^|]*)\|", re.MULTILINE)
_ROOT_DOC_ROW = re.compile(r"^    ([a-z_0-9]+/?(?:, [a-z_0-9]+)*) ", re.MULTILINE)


def layout_tables() -> dict[str, list[str]]:
    """The parts each layout table names, in its order: ``gate`` for ``proxy/gate/``,
    ``cli`` for ``proxy/cli.py``."""
    readme = (REPO / "README.md").read_text("utf-8").split("| folder | owns |", 1)[1]
    readme = readme.split("\n\n", 1)[0]
    in_readme = [
        name
        for cell in _README_ROW.findall(readme)
        for name in re.findall(r"`proxy/([a-z_0-9]+)(?:/|\.py)`", cell)
    ]
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text("utf-8"))) or ""
    in_doc = [name.rstrip("/") for row in _ROOT_DOC_ROW.findall(doc) for name in row.split(", ")]
    return {"README.md": in_readme, "proxy/__init__.py": in_doc}


def test_the_layout_tables_name_every_package_and_root_module() -> None:
    """The README's layout table and proxy/__init__.py's each name every package of proxy/ and
    every root module (a package added without a row is found here, not by a reader)."""
    packages = {d.name for d in PACKAGE.iterdir() if (d / "__init__.py").is_file()}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    for table, named in layout_tables().items():
        assert sorted((packages | modules) - set(named)) == [], f"{table} misses these"
        assert sorted(set(named) - packages - modules) == [], f"{table} names what is not there"
        assert len(named) == len(set(named)), f"{table} names a part twice: {named}"


def test_the_layout_tables_list_each_package_above_what_it_imports() -> None:
    """Dependencies point down each table: no package may import one listed above it."""
    for table, named in layout_tables().items():
        packages = [n for n in named if n in MAY_IMPORT and n not in ROOT]
        for index, name in enumerate(packages):
            above = set(packages[:index]) & MAY_IMPORT[name]
            assert not above, f"{table}: {name} is listed below {sorted(above)}, which it imports"


def test_the_settings_are_typed_wherever_they_are_passed() -> None:
    """No function takes ``settings: Any``: mypy checks every use of a setting by its name."""
    untyped = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text("utf-8").splitlines(), start=1)
        if re.search(r"\bsettings: Any\b", line)
    ]
    assert untyped == []


def test_imports_point_one_way() -> None:
    """No module imports a part of opgate that sits above it (e.g. gate -> recovery)."""
    assert forbidden_imports(import_graph()) == []


def test_the_front_ends_reach_into_gate_only_through_its_entry_points() -> None:
    """Console, mcp, operations, proposals and admin import from gate only its entry points
    (pipeline, reasons, decisions, ...), never its inner stages (intake, lookup, upstream)."""
    assert gate_reach_ins(import_graph()) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        pytest.param(
            {"proxy.console.views": {"proxy.gate.intake"}},
            ["proxy.console.views -> proxy.gate.intake"],
            id="console-to-an-inner-stage",
        ),
        pytest.param(
            {"proxy.mcp.calls": {"proxy.gate"}},
            ["proxy.mcp.calls -> proxy.gate"],
            id="mcp-to-the-package-itself",
        ),
        pytest.param(
            {"proxy.operations.api": {"proxy.gate.reasons", "proxy.gate.pipeline"}},
            [],
            id="operations-to-entry-points",
        ),
        pytest.param(
            {"proxy.recovery.reconcile": {"proxy.gate.lookup"}},
            [],
            id="recovery-is-not-restricted",
        ),
    ],
)
def test_the_entry_point_check_catches_a_reach_in(
    graph: dict[str, set[str]], expected: list[str]
) -> None:
    """The checker itself: a front end importing a gate module off the list is reported."""
    found = gate_reach_ins(graph)
    assert len(found) == len(expected)
    for problem, words in zip(found, expected, strict=True):
        assert words in problem


def test_no_import_circles() -> None:
    """No set of modules imports itself round, even through imports inside functions."""
    assert import_cycles(import_graph()) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        pytest.param(
            {"proxy.gate.pipeline": {"proxy.recovery.api"}, "proxy.recovery.api": set()},
            ["gate may not import recovery"],
            id="gate-to-recovery",
        ),
        pytest.param(
            {"proxy.store.store": {"proxy.gate.checks"}, "proxy.gate.checks": set()},
            ["store may not import gate"],
            id="store-to-gate",
        ),
        pytest.param(
            {"proxy.observe.observer": {"proxy.gate.pipeline"}, "proxy.gate.pipeline": set()},
            ["observe may not import gate"],
            id="observe-to-gate",
        ),
        pytest.param(
            {"proxy.gate.pipeline": {"proxy.server"}, "proxy.server": set()},
            ["gate may not import server"],
            id="gate-to-the-process",
        ),
        pytest.param(
            {"proxy.server": {"proxy.gate.pipeline"}, "proxy.gate.pipeline": {"proxy.store.store"}},
            [],
            id="downward-is-fine",
        ),
    ],
)
def test_the_direction_check_catches_an_upward_import(
    graph: dict[str, set[str]], expected: list[str]
) -> None:
    """The checker itself: an upward import is reported, a downward one is not."""
    found = forbidden_imports(graph)
    assert len(found) == len(expected)
    for problem, words in zip(found, expected, strict=True):
        assert words in problem


def test_the_circle_check_catches_a_circle() -> None:
    """The checker itself: a circle of three modules is found, a chain is not."""
    circle = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(circle) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


DOCUMENTS = ["README.md", "docs/**/*.md", "bench/README.md", "deploy/README.md"]
# output folders a run or an install script creates, not part of the tree
WRITTEN_BY_RUNS = ("bench/results/", "tests/mcp/conformance/node_modules")
NAMED_PATH = re.compile(r"(?<![\w/.-])((?:proxy|tests|policies|deploy|bench|docs)/[\w./-]*[\w/])")


def named_paths() -> Iterator[tuple[str, str]]:
    for pattern in DOCUMENTS:
        for doc in sorted(REPO.glob(pattern)):
            for match in NAMED_PATH.finditer(doc.read_text("utf-8")):
                yield str(doc.relative_to(REPO)), match.group(1).rstrip(".")


def test_every_path_the_documentation_names_is_real() -> None:
    """Each proxy/, tests/, policies/, deploy/, bench/ or docs/ path in the docs exists."""
    missing = [
        f"{doc}: {path}"
        for doc, path in named_paths()
        if not (REPO / path).exists() and not path.startswith(WRITTEN_BY_RUNS)
    ]
    assert missing == []
    assert any(path.startswith("proxy/gate/") for _, path in named_paths())
    assert any(doc.startswith("docs/reference/") for doc, _ in named_paths())


LINK = re.compile(r"\]\(([^()\s]+)\)")


def anchors(doc: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings (code blocks aside)."""
    found, fence = set(), False
    for line in doc.read_text("utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def relative_links() -> Iterator[tuple[Path, str]]:
    for pattern in DOCUMENTS:
        for doc in sorted(REPO.glob(pattern)):
            for match in LINK.finditer(doc.read_text("utf-8")):
                if not re.match(r"^[a-z]+:", match.group(1)):
                    yield doc, match.group(1)


def test_every_relative_link_and_anchor_in_the_documentation_is_real() -> None:
    """Each Markdown link to a file of the repository names a real file, and its #anchor a
    real heading of it."""
    broken = []
    for doc, link in relative_links():
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(f"{doc.relative_to(REPO)}: {link}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{doc.relative_to(REPO)}: {link} (no such heading)")
    assert broken == []
    assert any(doc.name == "README.md" and "docs/" in link for doc, link in relative_links())


WORK_ITEM = re.compile(r"\b(?:issue|task|ticket) #?\d+", re.IGNORECASE)


def test_comments_say_what_the_code_is_not_which_work_item_added_it() -> None:
    """No comment or docstring in proxy/ names a work item ("issue 4")."""
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if WORK_ITEM.search(line)
    ]
    assert found == []


def test_no_test_module_imports_another() -> None:
    """Helpers two test modules share live in tests/support/, not in one of them: a test module
    imports none other (pytest would also collect a test it imports twice)."""
    found = [
        f"{path.relative_to(REPO)} imports {node.module}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("tests.")
        and (node.module or "").rpartition(".")[2].startswith("test_")
    ]
    assert found == []
