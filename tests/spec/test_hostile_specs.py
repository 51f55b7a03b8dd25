"""Job specs written by a stranger: every number finite, every size bounded (by a ceiling of
the spec or an operator limit of the settings), strings printable, ranges counted without
being expanded. Each hostile spec is refused quickly with its field and reason (corpora,
settings and YAML files: test_hostile_inputs.py)."""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from nas_service.settings import get_settings
from nas_service.spec import (
    IntRange,
    SpecError,
    check_job,
    enumerate_candidates,
    parse_spec,
    space_size,
)
from tests.support.api import error
from tests.support.hostile import (
    BILLION,
    GOOD,
    INF,
    NAN,
    ROOT,
    _yaml,
    assert_refused,
    refusal,
    with_,
)

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

# -- refused by the spec alone ----------------------------------------------------------------
PARSE_CASES = [
    # every number finite
    ("flops-nan-in-list", with_(("budget", {"flops": [1e9, NAN]})), "budget.flops", "finite"),
    ("flops-inf", with_(("budget", {"flops": INF})), "budget.flops", "finite"),
    ("tokens-nan", with_(("budget", {"tokens": NAN})), "budget.tokens", "finite"),
    (
        "tokens-fraction-in-list",
        with_(("budget", {"tokens": [1000, 0.5]})),
        "budget.tokens",
        "whole number",
    ),
    ("flops-bool", with_(("budget", {"flops": True})), "budget.flops", "must be a number"),
    (
        "aspect-nan",
        with_(("space.d_model", None), ("space.aspect_ratio", [NAN])),
        "space.aspect_ratio.0",
        "finite",
    ),
    (
        "aspect-inf",
        with_(("space.d_model", None), ("space.aspect_ratio", [32.0, INF])),
        "space.aspect_ratio.1",
        "finite",
    ),
    (
        "aspect-huge",
        with_(("space.d_model", None), ("space.aspect_ratio", [1e308])),
        "space.aspect_ratio",
        "at most 1e+06",
    ),
    (
        "params-target-inf",
        with_(("space.d_model", None), ("space.params_target", {"params": INF})),
        "space.params_target.params",
        "finite",
    ),
    ("ff-ratio-inf", with_(("space.arch", {"ff_ratio": INF})), "space.arch.ff_ratio", "finite"),
    ("ff-ratio-huge", with_(("space.arch", {"ff_ratio": 1e9})), "space.arch.ff_ratio", "less"),
    ("lr-inf", with_(("training.lr", INF)), "training.lr", "finite"),
    ("weight-decay-inf", with_(("training.weight_decay", INF)), "training.weight_decay", "finite"),
    (
        "constraint-inf",
        with_(("constraints", [{"metric": "params", "max": INF}])),
        "constraints.0.max",
        "finite",
    ),
    # integers that size something
    ("seed-negative", with_(("sampler_seed", -1)), "sampler_seed", "greater than or equal to 0"),
    ("seed-2-32", with_(("sampler_seed", 2**32)), "sampler_seed", "less than or equal to"),
    ("n-evals", with_(("training.n_evals", BILLION)), "training.n_evals", "less than or equal"),
    (
        "eval-batches",
        with_(("training.eval_batches", BILLION)),
        "training.eval_batches",
        "less than or equal",
    ),
    ("vocab", with_(("training.vocab_size", 10**12)), "training.vocab_size", "less than or equal"),
    ("tensor", with_(("cost.tensor", BILLION)), "cost.tensor", "less than or equal"),
    ("microbatches", with_(("cost.microbatches", BILLION)), "cost.microbatches", "less than"),
    (
        "constraints-many",
        with_(("constraints", [{"metric": "params", "max": 1.0 + i} for i in range(1000)])),
        "constraints",
        "at most 64",
    ),
    # strings: no NUL bytes, control characters or lone surrogates
    ("name-nul", with_(("name", "job\x00x")), "name", "NUL byte at position 3"),
    ("name-newline", with_(("name", "job\nDROP")), "name", "control character U+000A"),
    ("cluster-nul", with_(("cluster", "local\x00")), "cluster", "NUL byte"),
    ("corpus-nul", with_(("training.corpus", "a.txt\x00")), "training.corpus", "NUL byte"),
    ("variant-nul", with_(("space.variants", ["baseline\x00"])), "space.variants.0", "NUL byte"),
    ("objective-nul", with_(("objectives", ["val_loss\x00"])), "objectives.0", "NUL byte"),
    (
        "metric-escape",
        with_(("constraints", [{"metric": "params\x1b[2J", "max": 1}])),
        "constraints.0.metric",
        "control character U+001B",
    ),
    ("hardware-nul", with_(("cost.hardware", "h100\x00")), "cost.hardware", "NUL byte"),
    # the layout search (cost.layout: auto): every size bounded, the enumeration counted
    ("layout-nul", with_(("cost.layout", "auto\x00")), "cost.layout", "'fixed' or 'auto'"),
    (
        "devices",
        with_(("cost.layout", "auto"), ("cost.devices", BILLION)),
        "cost.devices",
        "less than or equal",
    ),
    (
        "global-batch",
        with_(("cost.layout", "auto"), ("cost.devices", 8), ("cost.global_batch", BILLION)),
        "cost.global_batch",
        "less than or equal",
    ),
    (
        "memory-cap-nan",
        with_(("cost.layout", "auto"), ("cost.devices", 8), ("cost.memory_cap_bytes", NAN)),
        "cost.memory_cap_bytes",
        "finite",
    ),
    (
        "memory-cap-inf",
        with_(("cost.layout", "auto"), ("cost.devices", 8), ("cost.memory_cap_bytes", INF)),
        "cost.memory_cap_bytes",
        "finite",
    ),
    (
        "max-virtual",
        with_(("cost.layout", "auto"), ("cost.devices", 8), ("cost.max_virtual", BILLION)),
        "cost.max_virtual",
        "less than or equal",
    ),
    (
        "layouts-too-many",
        with_(
            ("cost.layout", "auto"),
            ("cost.devices", 1 << 16),
            ("cost.global_batch", 1 << 24),
            ("cost.max_virtual", 64),
        ),
        "cost.devices",
        "more than 5000 layouts",
    ),
]
#: The training axes: choices, ranges and tune lists (also submitted over HTTP, below).
TRAINING_PARSE_CASES = [
    ("lr-choices-empty", with_(("training.lr", [])), "training.lr", "empty"),
    ("lr-choices-duplicate", with_(("training.lr", [0.1, 0.1])), "training.lr", "duplicate"),
    ("lr-choice-nan", with_(("training.lr", [0.1, NAN])), "training.lr", "finite"),
    ("lr-choice-huge", with_(("training.lr", [0.1, 1e300])), "training.lr", "outside (0, 1000]"),
    ("lr-choice-bool", with_(("training.lr", [0.1, True])), "training.lr", "not true"),
    (
        "lr-range-inverted",
        with_(("training.lr", {"low": 0.1, "high": 0.01})),
        "training.lr",
        "inverted range",
    ),
    (
        "lr-range-empty",
        with_(("training.lr", {"low": 0.1, "high": 0.1})),
        "training.lr",
        "give a single value",
    ),
    (
        "lr-range-inf",
        with_(("training.lr", {"low": 0.1, "high": INF})),
        "training.lr.high",
        "finite",
    ),
    (
        "lr-range-log-non-positive",
        with_(("training.lr", {"low": -1.0, "high": 0.1, "log": True})),
        "training.lr",
        "a log range needs positive bounds",
    ),
    (
        "depth-lr-mult-log-zero",
        with_(("training.depth_lr_mult", {"low": 0, "high": 10, "log": True})),
        "training.depth_lr_mult",
        "a log range needs positive bounds, got low 0",
    ),
    (
        "depth-lr-mult-huge",
        with_(("training.depth_lr_mult", 1e9)),
        "training.depth_lr_mult",
        "outside [0, 1000]",
    ),
    (
        "warmup-range-over-1",
        with_(("training.warmup_frac", {"low": 0.0, "high": 2.0})),
        "training.warmup_frac",
        "high 2 is outside [0, 1]",
    ),
    (
        "weight-decay-negative",
        with_(("training.weight_decay", [-0.1, 0.1])),
        "training.weight_decay",
        "outside [0, 1000]",
    ),
    (
        "tune-unknown-axis",
        with_(("tune", {"momentum": [0.9, 0.95]})),
        "tune.momentum",
        "unknown training axis 'momentum'; expected one of lr, depth_lr_mult, warmup_frac, "
        "weight_decay",
    ),
    (
        "tune-key-escaped",
        with_(("tune", {"lr\x00": [0.1]})),
        "tune.lr\\x00",
        "unknown training axis 'lr\\x00'",
    ),
    ("tune-empty-list", with_(("tune", {"lr": []})), "tune.lr", "empty"),
    ("tune-duplicate", with_(("tune", {"lr": [0.1, 0.1]})), "tune.lr", "duplicate"),
    ("tune-nan", with_(("tune", {"weight_decay": [NAN]})), "tune.weight_decay", "finite"),
    ("tune-not-a-list", with_(("tune", {"lr": 0.1})), "tune.lr", "must be a list"),
    (
        "tune-out-of-bounds",
        with_(("tune", {"warmup_frac": [0.5, 1.5]})),
        "tune.warmup_frac",
        "outside [0, 1]",
    ),
    (
        "tune-and-joint",
        with_(("tune", {"lr": [0.01, 0.1]}), ("training.lr", [0.01, 0.1])),
        "tune.lr",
        "also searched jointly in training.lr",
    ),
    (
        "grid-with-a-range",
        with_(("sampler", "grid"), ("training.lr", {"low": 1e-4, "high": 1e-2, "log": True})),
        "training.lr",
        "the grid sampler needs choices, not a range",
    ),
    (
        "depth-lr-mult-without-mixing",
        with_(
            ("space.variants", ["baseline"]),
            ("space.block_sizes", None),
            ("training.depth_lr_mult", 10.0),
        ),
        "training.depth_lr_mult",
        "none of the variants (baseline) has depth-mixing parameters",
    ),
    (
        "tune-depth-lr-mult-without-mixing",
        with_(
            ("space.variants", ["baseline"]),
            ("space.block_sizes", None),
            ("tune", {"depth_lr_mult": [0.1, 1.0, 10.0]}),
        ),
        "tune.depth_lr_mult",
        "none of the variants (baseline) has depth-mixing parameters",
    ),
    (
        "confirm-one-seed",
        with_(("tune", {"lr": [1e-3, 3e-3]}), ("confirm", {"seeds": 1})),
        "confirm.seeds",
        "greater than or equal to 2",
    ),
    (
        "confirm-without-tune",
        with_(("confirm", {"seeds": 4})),
        "confirm",
        "confirmation needs a tune grid",
    ),
    (
        "confirm-a-single-setting",
        with_(("tune", {"lr": [1e-3]}), ("confirm", {"seeds": 4})),
        "confirm",
        "tune lists a single setting",
    ),
    (
        "confirm-unknown-key",
        with_(("tune", {"lr": [1e-3, 3e-3]}), ("confirm", {"seeds": 4, "level": 0.9})),
        "confirm.level",
        "Extra inputs are not permitted",
    ),
    (
        "stop-width-zero",
        with_(("stop", {"optimum_interval": 0})),
        "stop.optimum_interval",
        "greater than 0",
    ),
    (
        "stop-without-the-loss",
        with_(("stop", {"optimum_interval": 0.2}), ("objectives", ["train_memory_bytes"])),
        "stop.optimum_interval",
        "fitted to val_loss, which is not among the objectives",
    ),
    (
        "stop-with-fidelity",
        with_(
            ("stop", {"optimum_interval": 0.2}),
            ("fidelity", {"rungs": [0.333, 1.0], "reduction": 3, "brackets": 1}),
            ("training.schedule", "wsd"),
        ),
        "stop.optimum_interval",
        "a trial that stops at a rung has no full-budget loss",
    ),
    (
        "optimum-sampler-without-the-loss",
        with_(("sampler", "optimum"), ("objectives", ["train_memory_bytes"])),
        "sampler",
        "optimum places shapes by the fit of val_loss",
    ),
    (
        "optimum-sampler-over-a-range",
        with_(("sampler", "optimum"), ("training.lr", {"low": 1e-4, "high": 1e-2})),
        "training.lr",
        "the optimum sampler needs choices, not a range",
    ),
    (
        "stop-unknown-key",
        with_(("stop", {"optimum_interval": 0.2, "level": 0.9})),
        "stop.level",
        "Extra inputs are not permitted",
    ),
]
PARSE_CASES += TRAINING_PARSE_CASES
#: A multi-fidelity section that passes (under the WSD schedule), and its hostile variants.
FIDELITY = {"rungs": [0.111, 0.333, 1.0], "reduction": 3, "brackets": 1}
WSD = ("training.schedule", "wsd")
FIDELITY_PARSE_CASES = [
    (
        "rungs-not-increasing",
        with_(("fidelity", FIDELITY | {"rungs": [0.5, 0.3, 1.0]}), WSD),
        "fidelity.rungs",
        "strictly increasing: rung 1 (0.3) is not above rung 0 (0.5)",
    ),
    (
        "rung-over-1",
        with_(("fidelity", FIDELITY | {"rungs": [0.5, 1.5, 1.0]}), WSD),
        "fidelity.rungs",
        "rung 1 (1.5) is outside (0, 1]",
    ),
    (
        "rung-zero",
        with_(("fidelity", FIDELITY | {"rungs": [0, 1.0]}), WSD),
        "fidelity.rungs",
        "rung 0 (0) is outside (0, 1]",
    ),
    (
        "last-rung-not-1",
        with_(("fidelity", FIDELITY | {"rungs": [0.25, 0.5]}), WSD),
        "fidelity.rungs",
        "the last rung must be 1",
    ),
    (
        "one-rung",
        with_(("fidelity", FIDELITY | {"rungs": [1.0]}), WSD),
        "fidelity.rungs",
        "at least 2",
    ),
    (
        "rungs-many",
        with_(("fidelity", FIDELITY | {"rungs": [i / 1000 for i in range(1, 1001)]}), WSD),
        "fidelity.rungs",
        "at most 8",
    ),
    (
        "rung-nan",
        with_(("fidelity", FIDELITY | {"rungs": [NAN, 1.0]}), WSD),
        "fidelity.rungs",
        "finite",
    ),
    (
        "reduction-1",
        with_(("fidelity", FIDELITY | {"reduction": 1}), WSD),
        "fidelity.reduction",
        "greater than 1",
    ),
    (
        "reduction-huge",
        with_(("fidelity", FIDELITY | {"reduction": 1e9}), WSD),
        "fidelity.reduction",
        "less than or equal to 100",
    ),
    (
        "brackets-over-rungs",
        with_(("fidelity", FIDELITY | {"brackets": 4}), WSD),
        "fidelity.brackets",
        "4 brackets, more than the 3 rungs",
    ),
    (
        "checkpoint-under-cosine",
        with_(("fidelity", FIDELITY | {"reuse": "checkpoint"}), ("training.schedule", "cosine")),
        "fidelity.reuse",
        "continuing from a checkpoint is exact only under the WSD schedule: set "
        "training.schedule: wsd, or reuse: retrain",
    ),
    (
        "rung-in-the-decay-phase",
        with_(("fidelity", FIDELITY | {"rungs": [0.5, 0.9, 1.0]}), WSD),
        "fidelity.rungs",
        "rung 1 (0.9) lies in the decay phase (after 1 − decay_frac = 0.8)",
    ),
    (
        "rung-in-a-longer-decay-phase",
        with_(("fidelity", FIDELITY), WSD, ("training.decay_frac", 0.7)),
        "fidelity.rungs",
        "rung 1 (0.333) lies in the decay phase",
    ),
    (
        "median-pruner-with-fidelity",
        with_(("fidelity", FIDELITY), WSD, ("pruner", "median")),
        "pruner",
        "median does not combine with fidelity",
    ),
    (
        "pareto-pruner-with-fidelity",
        with_(("fidelity", FIDELITY), WSD, ("pruner", "pareto")),
        "pruner",
        "pareto does not combine with fidelity",
    ),
    (
        "artifact-store-from-a-job",
        with_(("fidelity", FIDELITY | {"artifact_store": "s3://elsewhere/x"}), WSD),
        "fidelity.artifact_store",
        "Extra inputs are not permitted",
    ),
    ("decay-frac-1", with_(("training.decay_frac", 1)), "training.decay_frac", "less than 1"),
    # learned positions hold training.seq_len positions: no longer sequence can be priced
    (
        "decode-context-past-learned-positions",
        with_(("space.arch", {"positions": "learned"}), ("cost.decode_context", 65)),
        "cost.decode_context",
        "learned positions cover only training.seq_len = 64",
    ),
    (
        "cost-seq-len-past-learned-positions",
        with_(("space.arch", {"positions": "learned"}), ("cost.seq_len", 128)),
        "cost.seq_len",
        "learned positions cover only training.seq_len = 64",
    ),
    (
        "decay-frac-bool",
        with_(("training.decay_frac", True)),
        "training.decay_frac",
        "must be a number, not true",
    ),
]
PARSE_CASES += FIDELITY_PARSE_CASES


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [case[1:] for case in PARSE_CASES],
    ids=[case[0] for case in PARSE_CASES],
)
def test_hostile_spec_is_refused_by_parse_spec(data: Any, field: str, fragment: str) -> None:
    errors, elapsed = refusal(parse_spec, data)
    assert_refused(errors, field, fragment)
    assert elapsed < 0.5


def test_a_stranger_s_key_is_shown_escaped() -> None:
    errors, _ = refusal(parse_spec, GOOD | {"evil\x00key": 1})
    assert [f for f, _ in errors] == ["evil\\x00key"]


def test_a_list_budget_with_a_non_positive_value_is_refused_on_its_field() -> None:
    for kind, values in (("flops", [1e12, 0.0]), ("tokens", [10**6, -5])):
        errors, _ = refusal(parse_spec, with_(("budget", {kind: values})))
        assert_refused(errors, f"budget.{kind}", "positive")


def test_nan_from_json_and_yaml(tmp_path: Path) -> None:
    body = json.loads(json.dumps(GOOD).replace('"flops": 1000000000000.0', '"flops": [1e12, NaN]'))
    assert math.isnan(body["budget"]["flops"][1])
    assert_refused(refusal(parse_spec, body)[0], "budget.flops", "finite")
    from nas_service.spec import load_spec

    json_file = tmp_path / "spec.json"  # JSON read as YAML: NaN is the string "NaN"
    json_file.write_text(json.dumps(body))
    assert_refused(refusal(load_spec, json_file)[0], "budget.flops", "finite")
    for text, field in (
        ("budget: {flops: [1.0e+12, .nan]}", "budget.flops"),
        ("budget: {flops: .inf}", "budget.flops"),
        ("budget: {flops: -.inf}", "budget.flops"),
        ("training: {lr: .inf}", "training.lr"),
    ):
        spec_file = tmp_path / "spec.yaml"
        spec_file.write_text(_yaml(GOOD) + text + "\n")
        assert_refused(refusal(load_spec, spec_file)[0], field, "finite")


# -- refused against the settings, before anything is expanded --------------------------------
CHECK_CASES = [
    (
        "n-layers-billion-range",
        with_(("space.n_layers", {"low": 1, "high": BILLION})),
        {},
        "space.n_layers",
        f"{BILLION} is over the limit of 512",
    ),
    (
        "n-layers-billion-range-counted",
        with_(("space.n_layers", {"low": 1, "high": BILLION})),
        {"max_n_layers": 2 * BILLION},
        "space.n_layers",
        f"{BILLION} values, over the limit of 10000 per axis",
    ),
    (
        "space-of-a-billion",
        with_(("space.n_layers", {"low": 1, "high": 100_000})),
        {"max_n_layers": 10**6, "max_axis_values": 10**6},
        "space",
        "more than 200000 candidates",
    ),
    (
        "block-sizes-billion-range",
        with_(("space.block_sizes", {"low": 1, "high": BILLION})),
        {},
        "space.block_sizes",
        "values, over the limit of 10000 per axis",
    ),
    (
        "n-heads-wide-range",
        with_(("space.n_heads", {"low": 1, "high": 20_000})),
        {},
        "space.n_heads",
        "20000 values, over the limit of 10000 per axis",
    ),
    (
        "d-model-mega",
        with_(("space.d_model", [1048576])),
        {},
        "space.d_model",
        "1048576 is over the limit of 32768",
    ),
    (
        "n-layers-100000",
        with_(("space.n_layers", [100000])),
        {},
        "space.n_layers",
        "100000 is over the limit of 512",
    ),
    ("head-dim", with_(("space.head_dim", 10**6)), {}, "space.head_dim", "over the limit"),
    (
        "params-target",
        with_(("space.d_model", None), ("space.params_target", {"params": 1e15})),
        {"max_params": 1e11},
        "space.params_target.params",
        "over the limit of 1e+11",
    ),
    (
        "aspect-ratio-width",
        with_(("space.d_model", None), ("space.aspect_ratio", [1e5])),
        {},
        "space.aspect_ratio",
        "over the limit of 32768",
    ),
    (
        "params-per-candidate",
        with_(("space.n_layers", [512]), ("space.d_model", [32768]), ("space.head_dim", 128)),
        {"max_params": 1e11},
        "space",
        "parameters, over the limit of 1e+11",
    ),
    ("seq-len", with_(("training.seq_len", 1e7)), {}, "training.seq_len", "over the limit"),
    ("threads", with_(("training.threads", 1e6)), {}, "training.threads", "over the limit of 64"),
    (
        "batch-size",
        with_(("training.batch_size", 10**6)),
        {},
        "training.batch_size",
        "1000000 is over the limit of 4096",
    ),
    ("cost-seq-len", with_(("cost.seq_len", 10**7)), {}, "cost.seq_len", "over the limit"),
    (
        "decode-context",
        with_(("cost.decode_context", BILLION)),
        {},
        "cost.decode_context",
        "over the limit",
    ),
    ("micro-batch", with_(("cost.micro_batch", 10**6)), {}, "cost.micro_batch", "over the limit"),
    (
        "tokens-1e30",
        with_(("budget", {"tokens": 1e30})),
        {},
        "budget.tokens",
        "1e+30 is over the limit of 1e+13",
    ),
    (
        "tokens-list-over",
        with_(("budget", {"tokens": [10**6, 10**14]})),
        {},
        "budget.tokens",
        "over the limit of 1e+13",
    ),
    (
        "job-compute-flops",
        with_(("budget", {"flops": 1e21}), ("n_trials", 1000), ("seeds", 5)),
        {"max_budget_flops": 1e21},
        "budget",
        "estimated compute",
    ),
    (
        "job-compute-tokens",
        with_(
            ("budget", {"tokens": 10**13}),
            ("space", {"n_layers": [64], "d_model": [4096], "head_dim": 128}),
        ),
        {},
        "budget",
        "is over the limit of 1e+24",
    ),
    (
        "budget-axis-too-long",
        with_(("budget", {"flops": [1e12 + i for i in range(20)]})),
        {"max_axis_values": 10},
        "budget.flops",
        "20 values, over the limit of 10 per axis",
    ),
    (
        "corpus-etc-passwd",
        with_(("training.corpus", "/etc/passwd")),
        {},
        "training.corpus",
        "not a registered corpus",
    ),
]
#: The training axes: values per axis, runs of the job (counted, never built).
TRAINING_CHECK_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "lr-choices-too-many",
        with_(("training.lr", [1e-4 * (i + 1) for i in range(20)])),
        {"max_axis_values": 10},
        "training.lr",
        "20 values, over the limit of 10 per axis",
    ),
    (
        "tune-list-too-long",
        with_(("tune", {"lr": [1e-4 * (i + 1) for i in range(20)]})),
        {"max_axis_values": 10},
        "tune.lr",
        "20 values, over the limit of 10 per axis",
    ),
    (
        "tune-runs-over-the-limit",
        with_(
            ("seeds", 2),
            ("tune", {"lr": [1e-3, 3e-3, 1e-2], "warmup_frac": [i / 400 for i in range(400)]}),
        ),
        {},
        "tune",
        "10 × 2 × 1200 = 24000 training runs, over the limit of 20000 per job",
    ),
    (
        "tune-product-of-a-quintillion",
        with_(
            (
                "tune",
                {
                    "lr": [1e-4 * (i + 1) for i in range(5000)],
                    "depth_lr_mult": [i / 10 for i in range(5000)],
                    "warmup_frac": [i / 5000 for i in range(5000)],
                    "weight_decay": [i / 50 for i in range(5000)],
                },
            ),
        ),
        {},
        "tune",
        "6.25e+15 training runs, over the limit of 20000",
    ),
    (
        "n-trials-runs-over-the-limit",
        with_(("n_trials", 1000), ("seeds", 5)),
        {"max_job_runs": 1000},
        "n_trials",
        "1000 × 5 = 5000 training runs, over the limit of 1000 per job",
    ),
    (
        "job-compute-times-tune",
        with_(("budget", {"flops": 1e21}), ("n_trials", 1000), ("tune", {"lr": [1e-3, 3e-3]})),
        {"max_budget_flops": 1e21},
        "budget",
        "n_trials × seeds × tune settings × 1e+21 FLOPs = 2e+24 FLOPs",
    ),
    (
        "confirm-seeds-over-the-limit",
        with_(("tune", {"lr": [1e-3, 3e-3]}), ("confirm", {"seeds": 9})),
        {"max_seeds": 5},
        "confirm.seeds",
        "9 is over the limit of 5",
    ),
    (
        "confirm-runs-count-against-the-job",
        with_(("n_trials", 100), ("tune", {"lr": [1e-3, 3e-3]}), ("confirm", {"seeds": 4})),
        {"max_job_runs": 500},
        "tune",
        "100 × (1 × 2 + 4) = 600 training runs, over the limit of 500 per job",
    ),
    (
        "confirm-compute-counts-against-the-job",
        with_(
            ("budget", {"flops": 1e21}),
            ("n_trials", 1000),
            ("tune", {"lr": [1e-3, 3e-3]}),
            ("confirm", {"seeds": 3}),
        ),
        {"max_budget_flops": 1e21},
        "budget",
        "n_trials × (seeds × tune settings + confirm.seeds) × 1e+21 FLOPs = 5e+24 FLOPs",
    ),
    (
        "stop-with-two-shapes",
        with_(
            ("stop", {"optimum_interval": 0.2}),
            ("space.n_layers", [2, 4]),
            ("space.d_model", [64]),
        ),
        {},
        "stop.optimum_interval",
        "at least 3 shapes (d_model/L_b) per variant; baseline has 2, block_attnres has 2",
    ),
    (
        "optimum-sampler-with-two-shapes",
        with_(("sampler", "optimum"), ("space.n_layers", [2, 4]), ("space.d_model", [64])),
        {},
        "sampler",
        "at least 3 shapes (d_model/L_b) per variant",
    ),
    (
        "stop-over-several-budgets",
        with_(("stop", {"optimum_interval": 0.2}), ("budget", {"flops": [1e12, 2e12]})),
        {},
        "stop.optimum_interval",
        "located at one budget",
    ),
]
CHECK_CASES += TRAINING_CHECK_CASES
#: Multi-fidelity against the settings: a first rung below one optimizer step of the
#: candidate with the fewest tokens, an artifact store that cannot be written (the folder is
#: a file, or lies under one: nothing can ever be created there, whoever runs the tests).
FIDELITY_CHECK_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "first-rung-under-one-step-flops",
        with_(("fidelity", FIDELITY | {"rungs": [0.001, 1.0]}), WSD),
        {},
        "fidelity.rungs",
        "the first rung, 0.001 of the budget, is 129 tokens of the candidate with the fewest "
        "(129637), fewer than one optimizer step (512 = batch_size × seq_len)",
    ),
    (
        "first-rung-under-one-step-tokens",
        with_(
            ("fidelity", FIDELITY | {"rungs": [0.01, 1.0], "reuse": "retrain"}),
            ("budget", {"tokens": [20_000, 10**6]}),
        ),
        {},
        "fidelity.rungs",
        "is 200 tokens of the candidate with the fewest (20000), fewer than one optimizer "
        "step (512",
    ),
    (
        "artifact-store-is-a-file",
        with_(("fidelity", FIDELITY), WSD),
        {"artifact_store": "/dev/null"},
        "fidelity",
        "the operator's artifact store folder is not writable",
    ),
    (
        "artifact-store-under-a-file",
        with_(("fidelity", FIDELITY), WSD),
        {"artifact_store": str(ROOT / "pyproject.toml" / "artifacts")},
        "fidelity",
        "the operator's artifact store folder is not writable",
    ),
    (
        "artifact-store-unknown-protocol",
        with_(("fidelity", FIDELITY | {"reuse": "retrain"})),
        {"artifact_store": "nope://bucket/prefix"},
        "fidelity",
        "the operator's artifact store (nope) is not usable",
    ),
]
CHECK_CASES += FIDELITY_CHECK_CASES


@pytest.mark.parametrize(
    ("data", "settings", "field", "fragment"),
    [case[1:] for case in CHECK_CASES],
    ids=[case[0] for case in CHECK_CASES],
)
def test_hostile_spec_is_refused_by_check_job(
    data: Any, settings: dict[str, Any], field: str, fragment: str
) -> None:
    spec = parse_spec(data)
    errors, elapsed = refusal(check_job, spec, get_settings(**settings))
    assert_refused(errors, field, fragment)
    assert elapsed < 0.5, f"took {elapsed:.2f} s"


#: The training and fidelity rows again over HTTP: the API's JSON reader refuses a NUL in a key
#: on the mapping holding it and a non-finite number on the element itself (`training.lr.1`).
HTTP_CASES: list[tuple[str, Any, dict[str, Any], str, str]] = (
    [(c[0], c[1], {}, *c[2:]) for c in TRAINING_PARSE_CASES if c[0] != "tune-key-escaped"]
    + TRAINING_CHECK_CASES
    + [(c[0], c[1], {}, *c[2:]) for c in FIDELITY_PARSE_CASES]
    + FIDELITY_CHECK_CASES
)


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., TestClient]]:
    """The app in process on a fresh SQLite file per set of operator settings (no runner)."""
    from fastapi.testclient import TestClient

    from nas_service.api.app import create_app

    made: dict[str, TestClient] = {}
    with contextlib.ExitStack() as stack:

        def client(**settings: Any) -> TestClient:
            key = json.dumps(settings, sort_keys=True)
            if key not in made:
                url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'api.db'}"
                app = create_app(get_settings(database_url=url, **settings))
                made[key] = stack.enter_context(TestClient(app))
            return made[key]

        yield client


@pytest.mark.parametrize(
    ("data", "settings", "field", "fragment"),
    [case[1:] for case in HTTP_CASES],
    ids=[case[0] for case in HTTP_CASES],
)
def test_a_hostile_training_axis_or_fidelity_is_refused_over_http_and_nothing_is_stored(
    clients: Callable[..., TestClient],
    data: Any,
    settings: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    client = clients(**settings)
    sent = json.dumps(data)  # NaN and Infinity as JavaScript writes them
    response = client.post("/v1/jobs", content=sent, headers={"content-type": "application/json"})
    body = error(response, 422)
    assert body["field"] == field or body["field"].startswith(f"{field}."), body
    assert fragment in body["message"], body
    assert client.get("/v1/jobs").json()["total"] == 0


def test_a_billion_wide_range_is_counted_never_expanded() -> None:
    spec = parse_spec(
        with_(
            ("space.n_layers", {"low": 1, "high": BILLION}),
            ("space.d_model", {"low": 64, "high": 64 * BILLION, "step": 64}),
        )
    )
    assert isinstance(spec.space.n_layers, IntRange)
    assert isinstance(spec.space.d_model, IntRange)
    assert spec.space.n_layers.count == BILLION
    assert spec.space.d_model.last == 64 * BILLION
    tracemalloc.start()
    try:
        start = time.perf_counter()
        assert space_size(spec) == BILLION * BILLION * (1 + 3)
        with pytest.raises(SpecError, match="more than 1000 candidates"):
            next(enumerate_candidates(spec, limit=1000))
        with pytest.raises(SpecError):
            check_job(spec, get_settings())
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5
    assert peak < 1 << 20


def test_the_ordinary_limits_still_accept_the_good_spec() -> None:
    assert len(check_job(parse_spec(GOOD), get_settings())) == space_size(parse_spec(GOOD))


def test_spec_error_survives_pickling() -> None:
    err = SpecError([("space.n_layers", "100000 is over the limit of 512"), ("seeds", "x")])
    back = pickle.loads(pickle.dumps(err))
    assert back.errors == err.errors and back.field == "space.n_layers" and str(back) == str(err)


def test_the_artifact_store_s_url_is_never_shown() -> None:
    """The operator's store URL may hold credentials: a refusal names only its kind."""
    spec = parse_spec(with_(("fidelity", FIDELITY), WSD))
    for url, kind in (
        ("nope://AKIAKEY:s3cr3t@bucket.example/prefix", "(nope)"),
        ("simplecache::nope://AKIAKEY:s3cr3t@bucket.example/prefix", "(simplecache::nope)"),
        (str(ROOT / "pyproject.toml" / "s3cr3t"), "folder"),
    ):
        errors, _ = refusal(check_job, spec, get_settings(artifact_store=url))
        assert_refused(errors, "fidelity", f"the operator's artifact store {kind}")
        text = str(errors)
        assert "s3cr3t" not in text and "AKIAKEY" not in text and "bucket" not in text, text


def test_a_job_without_fidelity_never_looks_at_the_artifact_store() -> None:
    assert check_job(parse_spec(GOOD), get_settings(artifact_store="/dev/null"))
