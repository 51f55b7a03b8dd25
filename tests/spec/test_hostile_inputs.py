"""Hostile inputs beside the spec's fields: corpora only from where the operator allows
(the data folder, registered names; no symlink out), settings from the environment, YAML
without anchors or aliases and of bounded size. Each is refused with its field and reason."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nas_service.settings import ClusterSettings, Settings, get_settings
from nas_service.spec import check_job, parse_spec
from tests.support.hostile import (
    GOOD,
    ROOT,
    assert_refused,
    reason_of,
    refusal,
    with_,
)


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

    monkeypatch.setattr(cli.transport, "_request", no_request)
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

    def fake_request(*a: Any, **k: Any) -> dict[str, Any]:
        sent.append(k["json"])
        return {"id": "1", "name": "q", "n_trials": 1}

    monkeypatch.setattr(cli.transport, "_request", fake_request)
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
        "name: \x07bell\n": "not valid YAML",  # a control character: refused by the reader
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
