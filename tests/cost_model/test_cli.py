"""`depthscope cost` as a user runs it: a real process, table and JSON, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys

from cost_model import ArchConfig, price


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nas_service.cli", "cost", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_json_output_matches_the_library() -> None:
    out = run(
        "--n-layers",
        "8",
        "--d-model",
        "256",
        "--n-heads",
        "4",
        "--variant",
        "block_attnres",
        "--block-size",
        "4",
        "--pp",
        "2",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    cfg = ArchConfig(n_layers=8, d_model=256, n_heads=4, variant="block_attnres", block_size=4)
    assert data["arch"]["variant"] == "block_attnres"
    assert data["cost"]["metrics"]["params"] == price(cfg).metrics()["params"]


def test_table_compares_variants() -> None:
    out = run(
        "--n-layers",
        "4",
        "--d-model",
        "128",
        "--n-heads",
        "4",
        "--variant",
        "baseline,full_attnres,block_attnres",
        "--block-size",
        "2",
    )
    assert out.returncode == 0, out.stderr
    header = next(line for line in out.stdout.splitlines() if line.startswith("metric"))
    assert header.split()[1:] == ["baseline", "full_attnres", "block_attnres"]
    assert any(line.startswith("residual_io_bytes_per_token") for line in out.stdout.splitlines())


def test_errors_name_the_field() -> None:
    out = run("--n-layers", "4", "--d-model", "130", "--n-heads", "4")
    assert out.returncode == 2
    assert "n_heads: d_model=130 is not divisible by n_heads=4" in out.stderr
    out = run("--n-layers", "4", "--d-model", "128", "--n-heads", "4", "--variant", "nope")
    assert out.returncode == 2 and "variant: unknown value 'nope'" in out.stderr
    out = run("--n-layers", "4", "--d-model", "128", "--n-heads", "4", "--recompute", "some")
    assert out.returncode == 2 and "recompute" in out.stderr
    out = run("--n-layers", "4", "--d-model", "128", "--n-heads", "4", "--hardware", "tpu")
    assert out.returncode == 2 and "hardware: unknown preset 'tpu'" in out.stderr


def test_a_length_past_learned_positions_is_refused_naming_the_field() -> None:
    """A learned position table of seq_len = 16 runs no longer prefill or decode context,
    with a fixed layout or the searched one; RoPE runs both."""
    arch = ("--n-layers", "2", "--d-model", "64", "--n-heads", "4", "--seq-len", "16")
    for flag, field, value in (
        ("--prefill-tokens", "prefill_tokens", "17"),
        ("--decode-context", "decode_context", "32"),
    ):
        for layout in ((), ("--layout", "auto", "--devices", "2")):
            out = run(*arch, "--positions", "learned", flag, value, *layout)
            assert out.returncode == 2, out.stdout
            assert f"{field}: {value} exceeds the architecture's seq_len = 16" in out.stderr
            assert "learned positions" in out.stderr
            assert run(*arch, flag, value, *layout).returncode == 0
