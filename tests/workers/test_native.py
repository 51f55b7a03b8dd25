"""The compiled decoding kernels (`workers.model.native`): the same arithmetic as the torch
operations of `OnlineDepth`, built once per machine into a cache, and a fallback to the torch
operations where they cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from workers.model import build_model, depth_attention, native
from workers.model.depth_attention import OnlineDepth, ScaledQueries
from workers.model.native import NativeDepth

from .test_model import make, perturb, run_schedules

ROOT = Path(__file__).resolve().parents[2]


def drive(depth: OnlineDepth | NativeDepth, sources: list[torch.Tensor], S: int) -> list:
    """A pass of Block AttnRes with block size S over U − 1 sublayers whose outputs are
    `sources` (as if each sublayer returned it): every input the depth path hands out."""
    U = len(depth.inputs)
    seen = []
    partial: torch.Tensor | None = None
    for l in range(U - 1):
        h = depth.input(l) if partial is None else depth.merged(l, partial)
        seen.append(h.clone())
        out = sources[l]
        partial = out if partial is None else partial + out
        if (l + 1) % S == 0 and l + 1 < U - 1:
            depth.push(partial, l + 1)
            partial = None
    assert partial is not None
    seen.append(depth.merged(U - 1, partial))
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1.0, 300.0, 3000.0])  # up to logits of ±1e4
@pytest.mark.parametrize(("U", "S"), [(8, 2), (10, 3), (6, 5)])
def test_kernels_equal_the_torch_operations(
    dtype: torch.dtype, scale: float, U: int, S: int
) -> None:
    """Every input a pass hands out agrees with `OnlineDepth`'s in fp64, to 1e-12 of the
    values' scale in fp64 and 1e-5 in fp32 (where the torch operations themselves are that
    far from fp64); with queries that drive the logits to ±1e4 (saturated σ, softplus past
    its threshold and past exp's range: nothing overflows), a zero source and a source that
    is not contiguous."""
    gen = torch.Generator().manual_seed(U * 10 + S)
    d, B, T = 48, 3, 5
    Q = torch.randn(U, d, generator=gen, dtype=torch.float64) * scale / d**0.5
    first = torch.randn(B, T, d, generator=gen, dtype=torch.float64)
    sources = [
        torch.randn(B, T, d, generator=gen, dtype=torch.float64) * (l + 1) for l in range(U - 1)
    ]
    sources[1] = torch.zeros(B, T, d, dtype=torch.float64)  # key scale 1/√ε, finite
    sources[2] = torch.randn(d, T, B, generator=gen, dtype=torch.float64).permute(2, 1, 0)
    assert not sources[2].is_contiguous()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    with torch.inference_mode():
        ref = drive(OnlineDepth(ScaledQueries(Q), first), sources, S)
        cast = [s.to(dtype) for s in sources]
        assert not cast[2].is_contiguous()  # (a cast keeps the strides)
        for cls in (NativeDepth, OnlineDepth):  # (the torch operations meet the same bound)
            got = drive(cls(ScaledQueries(Q.to(dtype)), first.to(dtype)), cast, S)
            for i, (a, b) in enumerate(zip(got, ref, strict=True)):
                assert a.dtype == dtype and torch.isfinite(a).all(), (cls, i)
                err = (a.double() - b).abs().max().item()
                assert err <= tol * b.abs().max().item(), (cls.__name__, i, err)


def test_result_owns_its_memory_and_inputs_stay_valid() -> None:
    """The aggregation's output is a tensor of its own (keeping it keeps no buffer of the
    pass); the inputs handed to earlier sublayers are not overwritten later in the pass."""
    U, S, d = 7, 2, 16
    gen = torch.Generator().manual_seed(0)
    queries = ScaledQueries(torch.randn(U, d, generator=gen))
    first = torch.randn(2, 1, d, generator=gen)
    sources = [torch.randn(2, 1, d, generator=gen) for _ in range(U - 1)]
    with torch.inference_mode():
        depth = NativeDepth(queries, first)
        handed: list[torch.Tensor] = []
        partial = None
        for l in range(U - 1):
            h = depth.input(l) if partial is None else depth.merged(l, partial)
            handed.append(h)
            partial = sources[l] if partial is None else partial + sources[l]
            if (l + 1) % S == 0:
                depth.push(partial, l + 1)
                partial = None
        last = depth.merged(U - 1, sources[-1])
        ref = drive(OnlineDepth(queries, first), sources, S)
    assert last.untyped_storage().nbytes() == last.numel() * last.element_size()
    for l, h in enumerate(handed):  # as handed out, after the whole pass
        torch.testing.assert_close(h, ref[l], msg=f"use {l}")


def test_decoding_on_the_kernels_equals_the_forward() -> None:
    """End to end through the model, with the kernels serving: prefill and token-by-token
    decode equal the sequential schedule and the training forward."""
    assert native.kernels() is not None
    model = build_model(make("block_attnres", block_size=2, n_layers=4)).eval()
    perturb(model.mixer, 1.0, seed=5)
    idx = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    made = []
    real = NativeDepth.__init__

    def counting(self: NativeDepth, *args: object) -> None:
        made.append(1)
        real(self, *args)  # type: ignore[arg-type]

    NativeDepth.__init__ = counting  # type: ignore[method-assign]
    try:
        out = run_schedules(model, idx)
    finally:
        NativeDepth.__init__ = real  # type: ignore[method-assign]
    assert made
    for key in ("prefill_hidden", "decode_hidden"):
        diff = (out["two_phase"][key] - out["sequential"][key]).abs().max()
        assert diff <= 1e-5, key


@pytest.fixture
def fresh_kernels() -> Iterator[None]:
    """`native.kernels()` is cached per process: cleared around a test that changes how
    they are built."""
    native.kernels.cache_clear()
    yield
    native.kernels.cache_clear()


def test_the_library_is_built_once(tmp_path: Path) -> None:
    """Built into the cache folder under a name of its source, compiler and machine; a second
    call reuses the file; no temporary file is left behind."""
    first = native.build(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert first.parent == tmp_path and first.suffix == ".so"
    assert native.build(tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


def test_concurrent_builds_leave_one_whole_library(tmp_path: Path) -> None:
    """Processes that build at once into an empty cache each load a whole library: each
    writes under a temporary name and renames it."""
    code = (
        "import torch\n"
        "from workers.model import native\n"
        "k = native.kernels()\n"
        "assert k is not None\n"
        "print(k.path)\n"
    )
    env = {**os.environ, "DEPTHSCOPE_CACHE": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    assert [p.name for p in tmp_path.iterdir()] == [Path(paths.pop()).name]


def test_without_a_compiler_decoding_uses_torch_operations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_kernels: None
) -> None:
    """No compiler: one warning naming the cause, and the torch operations serve (same
    results)."""
    monkeypatch.setenv("DEPTHSCOPE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.warns(RuntimeWarning, match="no-such-cc"):
        assert native.kernels() is None
    model = build_model(make("block_attnres", block_size=2, n_layers=3)).eval()
    perturb(model.mixer, 1.0, seed=1)
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    made = []
    real = depth_attention.OnlineDepth.__init__

    def counting(self: OnlineDepth, *args: object) -> None:
        made.append(1)
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(depth_attention.OnlineDepth, "__init__", counting)
    out = run_schedules(model, idx)
    assert made
    diff = (out["two_phase"]["decode_hidden"] - out["sequential"]["decode_hidden"]).abs().max()
    assert diff <= 1e-5
    assert list(tmp_path.iterdir()) == []  # nothing half-built left


def test_an_unusable_cache_folder_means_torch_operations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_kernels: None
) -> None:
    """A cache folder that cannot be made: one warning naming it, no kernels, and no
    library looked for elsewhere."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DEPTHSCOPE_CACHE", str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="DEPTHSCOPE_CACHE"):
        assert native.kernels() is None
    assert not native.serves(ScaledQueries(torch.randn(3, 8)), torch.randn(2, 1, 8))


def test_switched_off_by_the_environment(
    monkeypatch: pytest.MonkeyPatch, fresh_kernels: None
) -> None:
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert native.kernels() is None
    first = torch.randn(2, 1, 8)
    assert not native.serves(ScaledQueries(torch.randn(3, 8)), first)


def test_serves_only_cpu_fp32_and_fp64_matching_the_queries() -> None:
    assert native.kernels() is not None
    q32 = ScaledQueries(torch.randn(3, 8))
    assert native.serves(q32, torch.randn(2, 1, 8))
    assert not native.serves(q32, torch.randn(2, 1, 8, dtype=torch.float64))
    assert not native.serves(q32, torch.randn(2, 1, 8).bfloat16())
    with native.disabled():
        assert not native.serves(q32, torch.randn(2, 1, 8))
    assert native.serves(ScaledQueries(torch.randn(3, 8).double()), torch.randn(2, 1, 8).double())
