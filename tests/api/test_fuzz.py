"""Fuzzing the HTTP API from its own OpenAPI document (schemathesis 4), in-process over ASGI,
on a fresh SQLite database per operation, with no runner (jobs are only stored).

Every generated request, valid and invalid (both generation modes), is checked by every
schemathesis check: no 5xx, status codes, content types, headers and bodies as documented,
invalid data refused, valid data accepted (with one allowance, `SEMANTIC_422`). Three runs:

- with the token (schemathesis sends it as the document's bearer scheme);
- without it: every answer but health's is the JSON 401 (or a 405 for a method the path
  does not have: routing comes first);
- the job routes, their valid ids replaced by a stored job with 300 synthetic trials, so the
  analysis answers (and their schemas) are exercised on real rows.

After every request the database holds exactly the jobs, and the Optuna studies, answered
201: a refused request stored nothing.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from sqlalchemy import create_engine, text

from nas_service.api.app import create_app
from nas_service.settings import get_settings
from nas_service.store import upgrade
from nas_service.store.jobs import optuna_storage

pytestmark = pytest.mark.slow

TOKEN = "fuzz-token"
MAX_EXAMPLES = 40
#: A body can be valid by its schema and still be refused, 422 naming the field, for what
#: JSON Schema cannot say: the cost model's combinations (n_heads divides d_model, d_ff or
#: ff_ratio, …) and a job spec's (one width rule, a space with a valid candidate, a budget
#: for one optimizer step, …). Everywhere else, schema-valid input must be accepted.
SEMANTIC_422 = ["2xx", "3xx", "401", "403", "404", "409", "422", "429"]
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=MAX_EXAMPLES)


def _app(database_url: str) -> Any:
    return create_app(
        get_settings(
            database_url=database_url,
            api_token=TOKEN,
            max_trials=50,
            max_concurrent_jobs=1000,
            max_candidates_enumerated=2000,
        )
    )


def _config(token: bool) -> SchemathesisConfig:
    data: dict[str, Any] = {
        "generation": {"mode": "all", "max-examples": MAX_EXAMPLES},
        "operations": [
            {
                "include-name": ["POST /v1/jobs", "POST /v1/cost"],
                "checks": {"positive_data_acceptance": {"expected-statuses": SEMANTIC_422}},
            }
        ],
    }
    if token:
        data["auth"] = {"openapi": {"HTTPBearer": {"bearer": TOKEN}}}
    return SchemathesisConfig.from_dict(data)


# The document comes from an app of its own (it does not depend on the database); every
# test calls a fresh app on a fresh database (`fuzzed`).
_DOCUMENT_DIR = tempfile.TemporaryDirectory(prefix="depthscope-fuzz-")
_DOCUMENT_APP = _app(f"sqlite:///{Path(_DOCUMENT_DIR.name) / 'document.db'}")
authorised = schemathesis.openapi.from_asgi("/openapi.json", _DOCUMENT_APP, config=_config(True))
anonymous = schemathesis.openapi.from_asgi("/openapi.json", _DOCUMENT_APP, config=_config(False))


@dataclass
class Fuzzed:
    app: Any
    engine: Any
    created: set[str] = field(default_factory=set)
    codes: Counter[int] = field(default_factory=Counter)

    def stored(self) -> tuple[int, int]:
        with self.engine.connect() as conn:
            jobs = conn.scalar(text("SELECT count(*) FROM ds_jobs")) or 0
            studies = conn.scalar(text("SELECT count(*) FROM studies")) or 0
        return int(jobs), int(studies)

    def answered(self, response: Any) -> None:
        self.codes[response.status_code] += 1
        if response.status_code == 201:
            self.created.add(response.json()["id"])
        assert self.stored() == (len(self.created), len(self.created)), "a refusal stored"


@pytest.fixture
def fuzzed(tmp_path: Path) -> Iterator[Fuzzed]:
    url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    upgrade(url)
    optuna_storage(url)  # Optuna's tables, as the app's lifespan makes them
    engine = create_engine(url)
    state = Fuzzed(_app(url), engine)
    try:
        yield state
        assert state.stored() == (len(state.created), len(state.created))
        print(f" {sum(state.codes.values())} requests: {dict(sorted(state.codes.items()))}")
    finally:
        engine.dispose()


@authorised.parametrize()
@FUZZ
def test_fuzz_with_the_token(case: Any, fuzzed: Fuzzed) -> None:
    fuzzed.answered(case.call_and_validate(app=fuzzed.app))


@anonymous.parametrize()
@FUZZ
def test_fuzz_without_the_token(case: Any, fuzzed: Fuzzed) -> None:
    response = case.call_and_validate(app=fuzzed.app)
    if response.status_code == 405:  # a method the path does not have
        assert case.method.upper() != case.operation.method.upper()
    elif case.path != "/v1/health":
        assert response.status_code == 401, response.text
        assert response.json()["error"]["field"] == "authorization"
    fuzzed.answered(response)


@pytest.fixture
def stored_job(fuzzed: Fuzzed) -> str:
    """A job with 300 synthetic trials in its study (no training), for the job routes."""
    import optuna

    from nas_service.jobs import submit
    from nas_service.spec import parse_spec
    from nas_service.store import make_engine, make_sessionmaker
    from tests.support.api import SPEC, _synthetic

    spec = SPEC | {"objectives": ["val_loss", "train_memory_bytes"], "n_trials": 40}
    url = str(fuzzed.app.state.settings.database_url)
    engine = make_engine(url)
    try:
        job = submit(make_sessionmaker(engine), fuzzed.app.state.settings, spec)
    finally:
        engine.dispose()
    study = optuna.load_study(study_name=job.study_name, storage=optuna_storage(url))
    support = _synthetic()
    trials = support.synthetic_trials(parse_spec(spec), 300)  # type: ignore[attr-defined]
    support.store_trials(study, trials)  # type: ignore[attr-defined]
    fuzzed.created.add(job.id)
    return job.id


@authorised.exclude(path_regex=r"^(?!.*\{job_id\})").parametrize()
@FUZZ
def test_fuzz_the_routes_of_a_stored_job(case: Any, fuzzed: Fuzzed, stored_job: str) -> None:
    """Valid job ids are the stored job's (invalid ones stay as generated)."""
    component = case.meta.components.get(ParameterLocation.PATH) if case.meta else None
    if component is None or component.mode.is_positive:
        case.path_parameters["job_id"] = stored_job
    fuzzed.answered(case.call_and_validate(app=fuzzed.app))
