"""Optuna behind one wall: Optuna's private modules and fields are read only inside
`nas_service/store/` (its storage, statements, compatibility check and study helpers), so an
Optuna release that moves them breaks one folder, which `store.optuna_compat` guards."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a private module of Optuna's (`optuna.storages._rdb`, `from optuna.study._tell import`),
#: or a private field of a study or trial
PRIVATE = re.compile(
    r"optuna(?:\.\w+)*\._\w"
    r"|\._(?:storage|study_id|trial_id|backend|cached_frozen_trial|studies)\b"
)


def offences(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if "store" in path.relative_to(root).parts[:1]:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE.search(line.split("#")[0]):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_optuna_private_names_only_inside_store() -> None:
    assert offences(ROOT / "nas_service") == []


def test_the_check_sees_an_offence(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "ok.py").write_text("storage = study._storage\n")
    (tmp_path / "runner.py").write_text(
        "from optuna.storages._rdb import models\nx = 1  # study._storage in a comment\n"
        "tid = trial._trial_id\n"
    )
    assert offences(tmp_path) == [
        "runner.py:1: from optuna.storages._rdb import models",
        "runner.py:3: tid = trial._trial_id",
    ]
