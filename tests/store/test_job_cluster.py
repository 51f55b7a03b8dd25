"""A job's cluster is a column of its row (`ds_jobs.cluster`), written at submission from the
spec: a runner picks up its own cluster's jobs only, filtered in SQL (`store.jobs.active_jobs`),
and leaves the others' alone."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from nas_service.jobs import submit
from nas_service.runner.loop import Runner
from nas_service.search.study import create_study
from nas_service.settings import ClusterSettings
from nas_service.spec import parse_spec, read_stored
from nas_service.store import Job
from nas_service.store.jobs import active_jobs, optuna_storage
from tests.support.jobs import TINY, setup


class _NoTraining:
    """A backend for a runner that must train nothing: it connects, and has one node."""

    def connect(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass

    def largest_node(self) -> dict[str, float]:
        return {"CPU": 2.0}

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the runner asked the backend to {name}")


def _two_clusters(tmp_path: Path) -> tuple[str, Any, Any]:
    db = f"sqlite:///{tmp_path / 'clusters.db'}"
    settings, Session = setup(db)
    clusters = {"local": ClusterSettings(num_cpus=2), "lab": ClusterSettings(num_cpus=2)}
    return db, settings.model_copy(update={"clusters": clusters}), Session


def test_submission_writes_the_cluster_and_active_jobs_filter_on_it(tmp_path: Path) -> None:
    _, settings, Session = _two_clusters(tmp_path)
    local = submit(Session, settings, TINY | {"name": "here"})
    lab = submit(Session, settings, TINY | {"name": "there", "cluster": "lab"})
    with Session() as s:
        assert {j.id: j.cluster for j in s.query(Job)} == {local.id: "local", lab.id: "lab"}
        assert [j.id for j in active_jobs(s, "lab")] == [lab.id]
        assert [j.id for j in active_jobs(s, "local")] == [local.id]
        assert [j.id for j in active_jobs(s, "elsewhere")] == []
        assert [j.id for j in active_jobs(s)] == [local.id, lab.id]


def test_a_runner_picks_up_its_own_clusters_jobs_only(tmp_path: Path) -> None:
    """The lab's runner takes the lab's job (a stored spec this version no longer reads: it
    fails it at once, training nothing) and never touches the local one, still pending."""
    db, settings, Session = _two_clusters(tmp_path)
    local = submit(Session, settings, TINY | {"name": "here"})
    stale = TINY | {"cluster": "lab", "space": TINY["space"] | {"variants": ["retired"]}}
    job_id = str(uuid.uuid4())
    create_study(parse_spec(TINY), optuna_storage(db), f"depthscope-{job_id}")
    with Session.begin() as s:
        s.add(
            Job(
                id=job_id,
                name="stale",
                spec=stale,
                cluster="lab",
                study_name=f"depthscope-{job_id}",
                n_trials=4,
            )
        )
    Runner(settings, cluster="lab", backend=_NoTraining()).run(timeout_s=60)
    with Session() as s:
        failed, waiting = s.get(Job, job_id), s.get(Job, local.id)
        assert failed is not None and failed.status == "failed"
        assert failed.error == f"the stored spec is no longer valid: {read_stored(stale).reason}"
        assert (
            waiting is not None
            and waiting.status == "pending"
            and waiting.events[-1].kind == ("submitted")
        )
