"""The dependency direction of the design, enforced on the source (not only documented):
cost_model is pure; workers never reach the service, the database or Optuna, and only
workers/task.py imports Ray; importing the cost model or the CLI does not import torch.

The same direction between the project's own packages, and the layers inside `nas_service`,
are import-linter contracts too (pyproject.toml, `tests/test_import_graph.py`); this test
keeps what they do not say: which third-party frameworks each package may import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "cost_model": {
        "torch",
        "ray",
        "optuna",
        "sqlalchemy",
        "alembic",
        "fastapi",
        "uvicorn",
        "pydantic",
        "pydantic_settings",
        "psycopg",
        "httpx",
        "workers",
        "nas_service",
        "migrations",
    },
    "workers": {"nas_service", "sqlalchemy", "fastapi", "optuna", "alembic", "migrations"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_down(package: str) -> None:
    files = python_files(package)
    assert files, f"{package}/ has no Python files"
    offenders = {
        str(f.relative_to(ROOT)): sorted(imported_modules(f) & FORBIDDEN[package]) for f in files
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}


def test_only_the_task_module_of_workers_imports_ray() -> None:
    users = {
        str(f.relative_to(ROOT)) for f in python_files("workers") if "ray" in imported_modules(f)
    }
    assert users <= {"workers/task.py"}


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom torch import nn\nimport ray.util\n")
    assert imported_modules(bad) >= {"torch", "ray"}


@pytest.mark.parametrize("module", ["cost_model", "nas_service.cli"])
def test_importing_does_not_import_heavy_frameworks(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'optuna', 'sqlalchemy', 'fastapi') "
        "if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    "module", ["nas_service.api.app", "nas_service.runner", "nas_service.jobs", "workers.contract"]
)
def test_the_service_never_loads_torch(module: str) -> None:
    """The HTTP service and the runner import workers' contract types only (`workers.contract`):
    torch loads in the workers, never in the service."""
    code = f"import sys, {module}\nprint('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"


def test_the_contract_imports_nothing_heavy() -> None:
    assert imported_modules(ROOT / "workers" / "contract.py") <= {
        "__future__",
        "dataclasses",
        "hashlib",
        "json",
        "math",
        "typing",
        "cost_model",
    }
