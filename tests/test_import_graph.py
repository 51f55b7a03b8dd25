"""The project's import graph has no cycle, counting every import: module-level, inside a
function and under `TYPE_CHECKING` alike (a cycle hidden in a function is still a cycle of the
design). The graph is read from the source with `ast` over `cost_model`, `workers` and
`nas_service`; its strongly connected components of more than one module are the cycles.

The service's core never imports its HTTP layer (`nas_service.api`): the read schemas it
answers with live below it (`nas_service.results.reads`), and `api/schemas.py` re-exports them.

The layers themselves are import-linter's contracts in pyproject.toml (`[tool.importlinter]`):
`lint-imports` keeps them here, and a copy of the sources with one forbidden import added
breaks each."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("cost_model", "workers", "nas_service")


def module_files(root: Path, packages: Iterable[str]) -> dict[str, tuple[Path, bool]]:
    """Every module of `packages` under `root`: its dotted name → (file, is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def _known(name: str, modules: Mapping[str, object]) -> str | None:
    """`name` or its nearest enclosing module of the project; None for a third-party one."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """Module → the project's modules it imports, wherever the import statement stands.
    `from a import b` is an import of `a.b` when `a.b` is a module, else of `a`."""
    modules = module_files(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:
                    child = f"{source}.{alias.name}"
                    targets.append(child if child in modules else source)
            for target in targets:
                known = _known(target, modules)
                if known is not None and known != name:
                    graph[name].add(known)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def _describe(graph: Mapping[str, set[str]], component: list[str]) -> str:
    inside = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


def test_the_project_has_no_import_cycle() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 100, "the graph missed the project's modules"
    assert [_describe(graph, c) for c in cycles(graph)] == []


#: The service's folders along the data flow, top to bottom (the import-linter contract in
#: `pyproject.toml` says the same): a module imports its own layer's or those below, never up.
LAYERS = (
    ("api", "cli", "client", "dashboard", "demo"),
    ("jobs",),
    ("results",),
    ("runner",),
    ("search",),
    ("store",),
    ("spec",),
    ("settings",),
)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "nas_service" or len(parts) < 2:
        return None
    for level, names in enumerate(LAYERS):
        if parts[1] in names:
            return level
    return None


def test_every_service_module_sits_in_a_layer_and_imports_none_above() -> None:
    """Function-level and `TYPE_CHECKING` imports included; a module added outside the layers
    (a new top-level module or folder) fails until it is placed."""
    graph = import_graph(ROOT)
    service = [m for m in graph if m.startswith("nas_service.")]
    unplaced = [
        m for m in service if _layer(m) is None and not m.startswith("nas_service.migrations")
    ]
    assert unplaced == []
    assert {
        "nas_service.results.cache",
        "nas_service.results.calibration",
        "nas_service.results.comparison",
        "nas_service.results.decode",
        "nas_service.results.plots",
        "nas_service.search.dominance",
        "nas_service.search.numbers",
        "nas_service.runner.simulated",
        "nas_service.runner.recorded",
        "nas_service.search.pricing",
        "nas_service.search.scheduler",
        "nas_service.runner.supervisor",
        "nas_service.store.records",
        "nas_service.store.optuna_statements",
        "nas_service.store.optuna_study",
        "nas_service.spec.model",
        "nas_service.spec.fields",
        "nas_service.spec.search_space",
        "nas_service.spec.budget",
        "nas_service.spec.training",
        "nas_service.spec.cost",
    } <= set(service)
    up = {
        m: sorted(t for t in graph[m] if (lt := _layer(t)) is not None and lt < (_layer(m) or 0))
        for m in service
        if _layer(m) is not None
    }
    assert {m: t for m, t in up.items() if t} == {}


def test_the_layer_check_finds_an_arrow_pointing_up() -> None:
    graph = {"nas_service.store.x": {"nas_service.results.y"}, "nas_service.results.y": set()}
    up = [
        t
        for t in graph["nas_service.store.x"]
        if (_layer(t) or 0) < (_layer("nas_service.store.x") or 0)
    ]
    assert up == ["nas_service.results.y"]


def test_the_api_names_the_read_schemas_of_the_core() -> None:
    """`api/schemas.py` re-exports every read schema of `nas_service.results.reads` and every
    stored record of `nas_service.store.records` as the same class, so the routes, the Python
    client and the OpenAPI document name what the core answers."""
    from pydantic import BaseModel

    from nas_service.api import schemas
    from nas_service.results import reads
    from nas_service.store import records

    models = {
        name: obj
        for module in (reads, records)
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__ == module.__name__
    }
    assert len(models) >= 30
    assert {name: getattr(schemas, name, None) for name in models} == models


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_hidden_in_a_function_or_type_checking_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    from pkg.b import g\n    return g\n",
            "pkg/b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
            ),
            "pkg/c.py": "from . import a\n",
            "pkg/d.py": "import pkg.a\nimport numpy\n",
            "pkg/sub/__init__.py": "from .e import X\n",
            "pkg/sub/e.py": "from ..d import numpy\nX = 1\n",
        },
    )
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a"}  # numpy is not the project's
    assert graph["pkg.sub"] == {"pkg.sub.e"}
    assert graph["pkg.sub.e"] == {"pkg.d"}  # a name from a module is an import of the module
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_an_acyclic_graph_has_no_cycle() -> None:
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the packages under `root`, with the contracts of its pyproject.toml."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_are_kept() -> None:
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("workers/contract.py", "import nas_service.spec", "nas_service > workers > cost_model"),
        ("cost_model/flops.py", "import workers.store", "nas_service > workers > cost_model"),
        (
            "nas_service/search/study.py",
            "from workers import train",
            "nas_service imports no torch module of workers",
        ),
        (
            "nas_service/results/queries.py",
            "def f() -> None:\n    from nas_service.api import schemas",
            "nas_service: its folders along the data flow",
        ),
        (
            "nas_service/results/answers.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nas_service import cli",
            "nas_service: its folders along the data flow",
        ),
        (
            "nas_service/store/records.py",
            "def f() -> None:\n    from nas_service.results import answers",
            "nas_service: its folders along the data flow",
        ),
    ],
    ids=[
        "workers-to-service",
        "cost-model-to-workers",
        "service-to-torch",
        "core-to-api",
        "core-to-cli",
        "store-to-results",
    ],
)
def test_a_forbidden_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    """The project's contracts over a copy of its sources with one import added (at the
    module's end, inside a function or under TYPE_CHECKING): `lint-imports` fails, naming the
    contract."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            tmp_path / package,
            ignore=lambda _, names: [n for n in names if not n.endswith(".py") and "." in n],
        )
    assert lint_imports(tmp_path).returncode == 0  # the copy is as clean as the project
    path = tmp_path / module
    path.write_text(path.read_text() + "\n" + line + "\n")
    out = lint_imports(tmp_path)
    assert out.returncode != 0
    assert "Contracts: 2 kept, 1 broken." in out.stdout, out.stdout
    assert f"{contract} BROKEN" in out.stdout, out.stdout
