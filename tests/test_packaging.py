"""The project as a user installs it: a wheel in a fresh virtual environment, used from a
folder that is not the checkout. `depthscope db upgrade` needs the Alembic scripts, which
ship inside the package (`nas_service/migrations/`)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow]

#: What `depthscope db` imports (the CLI loads its subcommands lazily): the wheel is
#: installed without its dependencies (torch, Ray…), then these alone.
DB_DEPENDENCIES = ["sqlalchemy>=2.0", "alembic>=1.13", "pydantic>=2.6", "pydantic-settings>=2.2"]


def run(
    *cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=600, cwd=cwd, env=env
    )
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def build_wheel(tmp_path: Path) -> Path:
    """The project's wheel, built without its dependencies from a copy of the checkout."""
    source = tmp_path / "source"  # built from a copy: the checkout gets no build/ folder
    for part in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / part, source / part)
    for package in ("cost_model", "workers", "nas_service"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    wheels = tmp_path / "wheels"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        wheels,
        source,
    )
    return next(wheels.glob("depthscope-*.whl"))


def test_db_upgrade_from_an_installed_wheel(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    py = venv / "bin" / "python"
    run(py, "-m", "pip", "install", "-q", "--no-deps", wheel)
    run(py, "-m", "pip", "install", "-q", *DB_DEPENDENCIES)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    db = elsewhere / "service.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPTHSCOPE_", "PYTHON"))}
    env["DEPTHSCOPE_DATABASE_URL"] = f"sqlite:///{db}"
    depthscope = venv / "bin" / "depthscope"
    run(depthscope, "db", "upgrade", cwd=elsewhere, env=env)
    assert run(depthscope, "db", "current", cwd=elsewhere, env=env).stdout.strip() == (
        "0004 (head)"
    )
    where = run(py, "-c", "import nas_service; print(nas_service.__file__)", cwd=elsewhere)
    assert str(venv) in where.stdout  # the installed package, not the checkout
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {
        "ds_jobs",
        "ds_job_events",
        "ds_trial_runs",
        "ds_runner_leases",
        "ds_runner_lives",
    } <= tables


def test_the_wheel_ships_the_dashboard(tmp_path: Path) -> None:
    """`depthscope serve` serves its dashboard from the installed package: the page, its
    scripts and styles, and the vendored chart library with its licence and version."""
    import zipfile

    static = ROOT / "nas_service" / "dashboard" / "static"
    expected = {
        f"nas_service/dashboard/{p.relative_to(static.parent).as_posix()}"
        for p in static.rglob("*")
        if p.is_file()
    }
    assert {
        "nas_service/dashboard/static/index.html",
        "nas_service/dashboard/static/app.js",
        "nas_service/dashboard/static/vendor/echarts/echarts.common.min.js",
        "nas_service/dashboard/static/vendor/echarts/LICENSE",
        "nas_service/dashboard/static/vendor/echarts/VERSION",
    } <= expected
    with zipfile.ZipFile(build_wheel(tmp_path)) as wheel:
        names = set(wheel.namelist())
    assert expected <= names, sorted(expected - names)
    assert "nas_service/dashboard/__init__.py" in names
