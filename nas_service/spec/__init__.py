"""The job spec: a search space over depth, width, heads, residual variant and block size, a
fixed compute budget per candidate, objectives, constraints, and how to search.

The training axes (`TRAINING_AXES`: lr, depth_lr_mult, warmup_frac, weight_decay) are fixed
values, or searched: jointly (choices or a `FloatRange` in `training`, study parameters like
the architecture's) or per shape (`tune` lists: every architecture trained at each
combination).

A `fidelity` section makes the search multi-fidelity: rungs (fractions of each candidate's
budget), the reduction factor, Hyperband brackets, and whether a promoted candidate resumes
from its checkpoint (WSD only) or retrains; the rules themselves are `nas_service.search.fidelity`.

The same pydantic model is what the HTTP API accepts and what `depthscope submit` reads from
YAML. `JobSpec` checks everything a spec can check on its own; `check_job(spec, settings)`
adds what needs the service's settings (limits, cluster names) and the cost model (a space
with no valid candidate, a budget too small for one optimizer step). Every refusal names the
field and the reason (`SpecError`), and nothing is stored on refusal.

A spec may come from a stranger, so everything in it is bounded: every number is finite (no
NaN or infinity, from JSON or YAML), every integer that sizes an allocation has a ceiling
(here, or an operator limit of `Settings` checked by `check_job`), strings hold no NUL bytes or
control characters, a range is counted arithmetically and never expanded before its bound is
checked, a corpus is read only from where the operator allows (`resolve_corpus`), and YAML is
read with a size cap and without anchors or aliases (`load_yaml_text`).
"""

from __future__ import annotations

from nas_service.spec.budget import (
    MAX_REDUCTION,
    MAX_RUNGS,
    Budget,
    Fidelity,
    FloatBudget,
    IntBudget,
)
from nas_service.spec.candidates import (
    Candidate,
    base_arch,
    build_candidate,
    enumerate_candidates,
    space_size,
)
from nas_service.spec.checks import (
    CorpusLocation,
    check_job,
    locate_corpus,
    resolve_corpus,
)
from nas_service.spec.cost import CostContext, StepCalibration
from nas_service.spec.fields import (
    MAX_ASPECT_RATIO,
    MAX_CONSTRAINTS,
    MAX_DEPTH_LR_MULT,
    MAX_EVALS,
    MAX_FF_RATIO,
    MAX_LAYOUT,
    MAX_LR,
    MAX_MICROBATCHES,
    MAX_SEED,
    MAX_SPEC_BYTES,
    MAX_VOCAB,
    MAX_YAML_DEPTH,
    IntAxis,
    IntRange,
    SpecError,
    Text,
    axis_count,
    axis_max,
    axis_values,
)
from nas_service.spec.files import (
    SpecFileError,
    load_spec,
    load_yaml_text,
    read_spec_data,
    read_yaml_mapping,
)
from nas_service.spec.model import (
    CALIBRATED,
    LOSS,
    OBJECTIVE_METRICS,
    Constraint,
    JobSpec,
    Stop,
    parse_spec,
)
from nas_service.spec.search_space import ArchDefaults, ParamsTarget, SearchSpace
from nas_service.spec.space import (
    AXES,
    Axis,
    AxisDef,
    CandidateSpace,
    decode_residual,
    encode_residual,
)
from nas_service.spec.stored import STORED, StoredSpec, parse_spec_stored, read_stored
from nas_service.spec.training import (
    TRAINING_AXES,
    TRAINING_BOUNDS,
    Confirm,
    FloatRange,
    TrainAxis,
    Training,
    Tune,
)

__all__ = [
    "AXES",
    "CALIBRATED",
    "LOSS",
    "MAX_ASPECT_RATIO",
    "MAX_CONSTRAINTS",
    "MAX_DEPTH_LR_MULT",
    "MAX_EVALS",
    "MAX_FF_RATIO",
    "MAX_LAYOUT",
    "MAX_LR",
    "MAX_MICROBATCHES",
    "MAX_REDUCTION",
    "MAX_RUNGS",
    "MAX_SEED",
    "MAX_SPEC_BYTES",
    "MAX_VOCAB",
    "MAX_YAML_DEPTH",
    "OBJECTIVE_METRICS",
    "STORED",
    "TRAINING_AXES",
    "TRAINING_BOUNDS",
    "ArchDefaults",
    "Axis",
    "AxisDef",
    "Budget",
    "Candidate",
    "CandidateSpace",
    "Confirm",
    "Constraint",
    "CorpusLocation",
    "CostContext",
    "Fidelity",
    "FloatBudget",
    "FloatRange",
    "IntAxis",
    "IntBudget",
    "IntRange",
    "JobSpec",
    "ParamsTarget",
    "SearchSpace",
    "SpecError",
    "SpecFileError",
    "StepCalibration",
    "Stop",
    "StoredSpec",
    "Text",
    "TrainAxis",
    "Training",
    "Tune",
    "axis_count",
    "axis_max",
    "axis_values",
    "base_arch",
    "build_candidate",
    "check_job",
    "decode_residual",
    "encode_residual",
    "enumerate_candidates",
    "load_spec",
    "load_yaml_text",
    "locate_corpus",
    "parse_spec",
    "parse_spec_stored",
    "read_spec_data",
    "read_stored",
    "read_yaml_mapping",
    "resolve_corpus",
    "space_size",
]
