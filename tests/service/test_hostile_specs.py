"""Job specs written by a stranger: every number finite, every size bounded (by a ceiling of
the spec or an operator limit of the settings), strings printable, ranges counted without
being expanded, corpora only from where the operator allows, YAML without anchors or aliases.
Each hostile spec is refused quickly with its field and reason."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nas_service.settings import ClusterSettings, Settings, get_settings
from nas_service.spec import SpecError, check_job, enumerate_candidates, parse_spec, space_size

ROOT = Path(__file__).resolve().parents[2]
GOOD: dict[str, Any] = {
    "name": "t",
    "space": {
        "n_layers": {"low": 2, "high": 6, "step": 2},
        "d_model": [64, 128],
        "head_dim": 32,
        "variants": ["baseline", "block_attnres"],
        "block_sizes": [1, 2, 4],
    },
    "budget": {"flops": 1e12},
    "n_trials": 10,
    "training": {"seq_len": 64, "batch_size": 8},
}
BILLION = 10**9
INF, NAN = float("inf"), float("nan")


def with_(*changes: tuple[str, Any]) -> dict[str, Any]:
    """GOOD with each (dotted path, value) set."""
    spec = copy.deepcopy(GOOD)
    for path, value in changes:
        node = spec
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return spec


def refusal(call: Any, *args: Any) -> tuple[list[tuple[str, str]], float]:
    """The (field, reason) list of the SpecError `call(*args)` raises, and how long it took."""
    start = time.perf_counter()
    with pytest.raises(SpecError) as info:
        call(*args)
    elapsed = time.perf_counter() - start
    return info.value.errors, elapsed


def reason_of(errors: list[tuple[str, str]], field: str) -> str:
    """The reason given for `field` (the only one)."""
    reasons = [r for f, r in errors if f == field]
    assert len(reasons) == 1, errors
    return reasons[0]


def assert_refused(errors: list[tuple[str, str]], field: str, fragment: str) -> None:
    assert any(f == field and fragment in r for f, r in errors), errors


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
]


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


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump({k: v for k, v in data.items() if k not in ("budget",)})


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
        {},
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
        {},
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
        {},
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


def test_a_billion_wide_range_is_counted_never_expanded() -> None:
    spec = parse_spec(
        with_(
            ("space.n_layers", {"low": 1, "high": BILLION}),
            ("space.d_model", {"low": 64, "high": 64 * BILLION, "step": 64}),
        )
    )
    assert spec.space.n_layers.count == BILLION  # type: ignore[union-attr]
    assert spec.space.d_model.last == 64 * BILLION  # type: ignore[union-attr]
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


# -- corpora ----------------------------------------------------------------------------------
@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "folder").mkdir(parents=True)
    (root / "plays.txt").write_text("to be or not to be\n" * 10)
    (root / "folder" / "a.txt").write_text("a\n")
    (tmp_path / "secret.txt").write_text("secret\n")
    (root / "to-passwd").symlink_to("/etc/passwd")
    (root / "to-nowhere").symlink_to("/nonexistent/corpus.txt")
    (root / "to-secret").symlink_to(tmp_path / "secret.txt")
    (root / "inner").symlink_to(root / "plays.txt")
    return root


def test_a_corpus_inside_the_data_folder_is_resolved(data_dir: Path) -> None:
    from nas_service.spec import resolve_corpus

    settings = get_settings(data_dir=data_dir)
    plays = str((data_dir / "plays.txt").resolve())
    assert resolve_corpus(None, settings) is None
    assert resolve_corpus("builtin", settings) is None
    assert resolve_corpus("plays.txt", settings) == plays
    assert resolve_corpus("./folder/../plays.txt", settings) == plays
    assert resolve_corpus(str(data_dir / "plays.txt"), settings) == plays  # absolute, inside
    assert resolve_corpus("inner", settings) == plays  # a symbolic link that stays inside
    assert resolve_corpus("folder", settings) == str((data_dir / "folder").resolve())
    spec = parse_spec(with_(("training.corpus", "plays.txt")))
    assert check_job(spec, settings)


@pytest.mark.parametrize(
    "corpus",
    [
        "/etc/passwd",
        "/nonexistent",
        "/nonexistent/corpus.txt",
        "../../etc/passwd",
        "../secret.txt",
        "folder/../../secret.txt",
        "/proc/self/environ",
        "/",
        "..",
    ],
)
def test_a_corpus_outside_the_data_folder_is_refused_alike(data_dir: Path, corpus: str) -> None:
    from nas_service.spec import resolve_corpus

    settings = get_settings(data_dir=data_dir, corpora={"plays": data_dir / "plays.txt"})
    reason = reason_of(refusal(resolve_corpus, corpus, settings)[0], "training.corpus")
    # the same words whether or not the path exists: nothing about the outside is revealed
    assert reason == (
        f"{corpus!r} is not a registered corpus and not a path inside the data folder"
        " (registered: plays)"
    )
    assert_refused(
        refusal(check_job, parse_spec(with_(("training.corpus", corpus))), settings)[0],
        "training.corpus",
        "not a registered corpus",
    )


@pytest.mark.parametrize("link", ["to-passwd", "to-nowhere", "to-secret"])
def test_a_symlink_leading_out_is_refused_alike(data_dir: Path, link: str) -> None:
    from nas_service.spec import resolve_corpus

    errors, _ = refusal(resolve_corpus, link, get_settings(data_dir=data_dir))
    assert reason_of(errors, "training.corpus") == (
        f"{link!r} leads outside the data folder (a symbolic link)"
    )


def test_what_the_data_folder_does_not_hold(data_dir: Path) -> None:
    from nas_service.spec import resolve_corpus

    settings = get_settings(data_dir=data_dir)
    cases = {
        "missing.txt": "does not exist in the data folder",
        "shakespeare": "is not a registered corpus and does not exist in the data folder",
        "plays.txt/inside": "does not exist in the data folder",
        ".": "is the data folder itself",
        "a.txt\x07": "control character U+0007",
        "a\ud800.txt": "control character U+D800",  # a lone surrogate
    }
    os.mkfifo(data_dir / "pipe")
    cases["pipe"] = "is not a regular file or a folder"
    for corpus, fragment in cases.items():
        assert_refused(refusal(resolve_corpus, corpus, settings)[0], "training.corpus", fragment)


def test_registered_corpora(data_dir: Path, tmp_path: Path) -> None:
    from nas_service.spec import resolve_corpus

    settings = get_settings(
        data_dir=data_dir,
        corpora={
            "plays": Path("plays.txt"),  # relative: inside the data folder
            "elsewhere": tmp_path / "secret.txt",  # the operator's choice: anywhere
            "gone": tmp_path / "gone.txt",
        },
    )
    assert resolve_corpus("plays", settings) == str((data_dir / "plays.txt").resolve())
    assert resolve_corpus("elsewhere", settings) == str((tmp_path / "secret.txt").resolve())
    reason = reason_of(refusal(resolve_corpus, "gone", settings)[0], "training.corpus")
    assert reason == "the registered corpus 'gone' is not available on this service"


def test_corpus_names_are_simple_identifiers() -> None:
    for bad in ("../etc", "a/b", "", "x" * 65, "na\x00me", "1st"):
        with pytest.raises(ValidationError, match="simple identifier"):
            get_settings(corpora={bad: Path("/data/x")})
    assert get_settings(corpora={"plays_v2-en": Path("/data/x")}).corpora


# -- settings from the environment ------------------------------------------------------------
@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.startswith("DEPTHSCOPE_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_a_named_cluster_adds_to_local(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DEPTHSCOPE_CLUSTERS__LAB__ADDRESS", "10.0.0.5:6379")
    settings = get_settings()
    assert set(settings.clusters) == {"local", "lab"}
    assert settings.clusters["local"] == ClusterSettings()
    assert settings.clusters["lab"].address == "10.0.0.5:6379"
    assert check_job(parse_spec(with_(("cluster", "local"))), settings)
    assert check_job(parse_spec(with_(("cluster", "lab"))), settings)


def test_local_configured_explicitly_or_switched_off(clean_env: pytest.MonkeyPatch) -> None:
    assert set(Settings(local_cluster=False).clusters) == set()
    assert set(Settings().clusters) == {"local"}
    clean_env.setenv("DEPTHSCOPE_CLUSTERS__LOCAL__NUM_CPUS", "2")
    assert get_settings().clusters["local"].num_cpus == 2
    clean_env.setenv("DEPTHSCOPE_CLUSTERS__LAB__ADDRESS", "10.0.0.5:6379")
    clean_env.setenv("DEPTHSCOPE_LOCAL_CLUSTER", "false")
    settings = get_settings()
    assert set(settings.clusters) == {"lab"}
    assert_refused(
        refusal(check_job, parse_spec(GOOD), settings)[0], "cluster", "unknown cluster 'local'"
    )


def test_a_corpus_registered_through_the_environment(
    clean_env: pytest.MonkeyPatch, data_dir: Path
) -> None:
    from nas_service.spec import resolve_corpus

    clean_env.setenv("DEPTHSCOPE_CORPORA__SHAKESPEARE", str(data_dir / "plays.txt"))
    clean_env.setenv("DEPTHSCOPE_DATA_DIR", str(data_dir / "folder"))
    settings = get_settings()
    assert settings.corpora == {"shakespeare": data_dir / "plays.txt"}
    assert resolve_corpus("shakespeare", settings) == str((data_dir / "plays.txt").resolve())
    clean_env.setenv("DEPTHSCOPE_CORPORA__NOT_OK__X", "/data/x")  # a nested key is no name
    with pytest.raises(ValidationError):
        get_settings()


# -- YAML -------------------------------------------------------------------------------------
BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "name: *i",
    ]
)


def test_billion_laughs_is_refused_quickly_with_bounded_memory(tmp_path: Path) -> None:
    from nas_service.spec import load_spec

    assert len(BOMB) < 1500
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    tracemalloc.start()
    try:
        errors, elapsed = refusal(load_spec, bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reason_of(errors, "spec").startswith("YAML anchors and aliases are not accepted")
    assert elapsed < 0.5 and peak < 8 << 20


def test_depthscope_submit_reads_specs_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from nas_service import cli

    def no_request(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a refused spec must not be sent")

    monkeypatch.setattr(cli, "_request", no_request)
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    args = argparse.Namespace(spec=str(bomb), wait=False)
    with pytest.raises(cli.CliError, match="spec: YAML anchors and aliases are not accepted"):
        cli._cmd_submit(args)
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "#" * (1 << 20))
    with pytest.raises(cli.CliError, match="over the limit of 1048576 bytes"):
        cli._cmd_submit(argparse.Namespace(spec=str(big), wait=False))
    with pytest.raises(cli.CliError, match="does not exist"):
        cli._cmd_submit(argparse.Namespace(spec=str(tmp_path / "none.yaml"), wait=False))
    sent: list[Any] = []
    monkeypatch.setattr(
        cli,
        "_request",
        lambda *a, **k: sent.append(k["json"]) or {"id": "1", "name": "q", "n_trials": 1},
    )
    assert (
        cli._cmd_submit(argparse.Namespace(spec=str(ROOT / "examples" / "quick.yaml"), wait=False))
        == 0
    )
    assert sent[0]["name"] == "quick-baseline-vs-block"


def test_yaml_text_is_bounded() -> None:
    from nas_service.spec import MAX_SPEC_BYTES, load_yaml_text

    cases = {
        "a: &x 1\nb: 2\n": "YAML anchors and aliases are not accepted",  # an anchor alone
        "<<: *x\n": "YAML anchors and aliases are not accepted",
        "name: " + "[" * 10_000 + "]" * 10_000: "YAML nested deeper than 64 levels",
        "name: x\n" + "#" * MAX_SPEC_BYTES: "over the limit of 1048576 bytes",
        "n: " + "9" * 5000: "not a usable spec",  # more digits than int() takes
        "name: !!python/object:os.system x": "not valid YAML",
        "a: 1\n---\nb: 2\n": "not valid YAML",
    }
    for text, fragment in cases.items():
        errors, elapsed = refusal(load_yaml_text, text, "spec.yaml")
        assert_refused(errors, "spec", fragment)
        assert elapsed < 1.0
    assert load_yaml_text("name: x\nlist: [1, 2]\n") == {"name": "x", "list": [1, 2]}


def test_spec_does_not_load_torch() -> None:
    code = "import sys, nas_service.spec; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0


def test_yaml_exponent_numbers_are_floats() -> None:
    """`5e11` is a float in YAML 1.2 and JSON; YAML 1.1 would make it a string."""
    from nas_service.spec import load_yaml_text

    data = load_yaml_text("budget: {flops: 5e11}\nlist: [1e9, -2E3, 3]\nname: 5e11x\n")
    assert data == {"budget": {"flops": 5e11}, "list": [1e9, -2e3, 3], "name": "5e11x"}
    assert isinstance(data["list"][2], int)
