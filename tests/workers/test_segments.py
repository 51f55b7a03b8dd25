"""A WSD run trained in segments (multi-fidelity search): the main line through checkpoints in
the artifact store is the straight-through run, bit for bit; each segment's decay branch and
its accounting; every refusal of a segment, a checkpoint or a store (tiny models, CPU)."""

from __future__ import annotations

import io
import itertools
import os
import pickle
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cost_model import ArchConfig, training_flops_per_token
from workers.checkpoint import FORMAT, Checkpoint, load_checkpoint, save_checkpoint
from workers.contract import EvalPoint, TrainResult, TrainSpec, TrainSpecError, branch_steps
from workers.data import Corpus, load_corpus
from workers.store import ArtifactStore, CheckpointError, StoreError, check_key
from workers.train import train, train_batches

from .support import RecordingCorpus

ARCHS = {
    "baseline": ArchConfig(n_layers=2, d_model=32, n_heads=2, seq_len=32),
    "block_attnres": ArchConfig(
        n_layers=2, d_model=32, n_heads=2, seq_len=32, variant="block_attnres", block_size=2
    ),
}
STEPS = 40  # T; with decay_frac 0.2 the stable phase ends at step 32
S1, S2 = 10, 20


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


@pytest.fixture
def memory_url() -> Iterator[str]:
    url = f"memory://segments-{secrets.token_hex(6)}"
    yield url
    store = ArtifactStore(url)  # the memory file system is the process's: leave it empty
    for key in store.keys():  # noqa: SIM118 (a list of keys, not a dict)
        store.delete(key)


class NotData:
    """An object a checkpoint must not hold (unpickling it would run code of this module)."""


def wsd(**kw: object) -> TrainSpec:
    """A WSD run of `STEPS` steps of the baseline (`kw`: other fields)."""
    base: dict[str, object] = {
        "arch": ARCHS["baseline"],
        "budget_tokens": 4 * 32 * STEPS,
        "batch_size": 4,
        "schedule": "wsd",
        "eval_interval": 5,
        "eval_batches": 2,
        "threads": 1,
    }
    base.update(kw)
    return TrainSpec(**base)  # type: ignore[arg-type]


def segment(
    spec: TrainSpec, store: str, start: int, stop: int | None, corpus: Corpus, **kw: object
) -> TrainResult:
    """Train `spec`'s main line from `start` to `stop` (None: the end) through `store`, the
    checkpoints under `run/step-<n>`."""
    return train(
        spec.replace(
            start_step=start,
            stop_step=stop,
            checkpoint_in=f"run/step-{start}" if start > 0 else None,
            checkpoint_out=f"run/step-{stop}" if stop is not None else None,
            artifact_store=store,
        ),
        corpus=corpus,
        **kw,  # type: ignore[arg-type]
    )


def main_line(curve: list[EvalPoint]) -> list[tuple[float, ...]]:
    """The points of a curve without their wall times."""
    return [(p.step, p.tokens, p.flops, p.val_loss, p.train_loss) for p in curve]


# -- (a) bitwise ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(ARCHS))
def test_segments_end_exactly_where_the_straight_run_ends(
    variant: str, corpus: Corpus, tmp_path: Path
) -> None:
    spec = wsd(arch=ARCHS[variant])
    straight = train(spec, corpus=corpus)
    assert straight.status == "completed" and straight.steps == STEPS
    store = str(tmp_path / "store")
    parts = [
        segment(spec, store, 0, S1, corpus),
        segment(spec, store, S1, S2, corpus),
        segment(spec, store, S2, None, corpus),
    ]
    assert [r.status for r in parts] == ["completed"] * 3
    last = parts[-1]
    assert last.final_val_loss == straight.final_val_loss  # bit for bit
    assert last.steps == straight.steps == STEPS
    assert main_line([p for r in parts for p in r.curve]) == main_line(straight.curve)
    main_tokens = sum(r.tokens_seen - r.branch_steps * spec.tokens_per_step for r in parts)
    assert main_tokens == straight.tokens_seen
    assert [r.checkpoint for r in parts] == ["run/step-10", "run/step-20", None]
    assert ArtifactStore(store).keys() == ["run/step-10", "run/step-20"]
    # the branches are evaluations of their own, not main-line points
    for r, stop in zip(parts[:2], (S1, S2), strict=True):
        assert r.curve[-1].step == stop and r.final_val_loss != r.curve[-1].val_loss


# -- (b) a segment's accounting and its branch -------------------------------------------------
def test_a_segment_accounts_for_its_main_line_and_its_branch(
    corpus: Corpus, tmp_path: Path
) -> None:
    spec = wsd()
    per_token = float(training_flops_per_token(spec.arch, causal=True))
    store = str(tmp_path)
    first = segment(spec, store, 0, S1, corpus)
    second = segment(spec, store, S1, S2, corpus)
    for r, start, stop in ((first, 0, S1), (second, S1, S2)):
        d = max(1, int(spec.decay_frac * stop))
        assert r.start_step == start and r.steps == stop and r.branch_steps == d
        assert r.tokens_seen == (stop - start + d) * spec.tokens_per_step
        assert r.flops_spent == pytest.approx(r.tokens_seen * per_token)
        assert r.flops_budget is None
        assert [p.step for p in r.curve] == [s for s in range(start + 1, stop + 1) if s % 5 == 0]
    assert (first.branch_steps, second.branch_steps) == (2, 4)


def test_branch_steps_follow_the_formula() -> None:
    spec = wsd()
    assert spec.branch_steps() == branch_steps(spec) == 0  # straight through: no branch
    assert spec.replace(stop_step=STEPS).branch_steps() == 0  # the end: no branch either
    for stop, decay_frac, expected in ((10, 0.2, 2), (32, 0.2, 6), (4, 0.2, 1), (30, 0.0, 1)):
        s = spec.replace(
            stop_step=stop, decay_frac=decay_frac, checkpoint_out="k", artifact_store="x"
        )
        assert s.branch_steps() == branch_steps(s) == expected


def test_the_branch_trains_on_the_batches_that_follow(corpus: Corpus, memory_url: str) -> None:
    spec = wsd()
    recording = RecordingCorpus.of(corpus)
    result = segment(spec, memory_url, 0, S1, recording)
    assert result.branch_steps == 2
    expected = itertools.islice(train_batches(corpus, spec), S1 + 2)
    for (x, y), (ex, ey) in zip(recording.drawn, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_a_segment_to_the_end_is_the_straight_run(corpus: Corpus) -> None:
    spec = wsd()
    straight = train(spec, corpus=corpus)
    to_end = train(spec.replace(stop_step=STEPS), corpus=corpus)
    assert to_end.final_val_loss == straight.final_val_loss
    assert (to_end.checkpoint, to_end.branch_steps, to_end.reason) == (None, 0, straight.reason)


def test_a_stopped_or_diverged_segment_saves_nothing(corpus: Corpus, tmp_path: Path) -> None:
    spec = wsd(stop_step=S1, checkpoint_out="run/step-10", artifact_store=str(tmp_path))
    stopped = train(spec, on_eval=lambda point: point.step == S1, corpus=corpus)
    assert stopped.status == "stopped" and stopped.steps == S1
    assert (stopped.checkpoint, stopped.branch_steps) == (None, 0)
    assert stopped.tokens_seen == S1 * spec.tokens_per_step
    diverged = train(spec.replace(divergence_factor=0.1), corpus=corpus)
    assert diverged.status == "diverged" and diverged.checkpoint is None
    assert ArtifactStore(str(tmp_path)).keys() == []


# -- (c) refusals -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"stop_step": 33}, "stop_step"),  # past the stable phase (ends at 32)
        ({"stop_step": 0}, "stop_step"),
        ({"stop_step": STEPS + 1}, "stop_step"),
        ({"start_step": 10, "stop_step": 10, "checkpoint_in": "k"}, "stop_step"),
        ({"start_step": STEPS, "checkpoint_in": "k"}, "start_step"),
        ({"start_step": -1}, "start_step"),
        ({"stop_step": 10, "schedule": "cosine"}, "schedule"),
        ({"start_step": 10, "schedule": "cosine", "checkpoint_in": "k"}, "schedule"),
        ({"start_step": 10}, "checkpoint_in"),
        ({"stop_step": 10, "artifact_store": "x"}, "checkpoint_out"),
        ({"stop_step": 10, "checkpoint_out": "k"}, "artifact_store"),
        ({"start_step": 10, "checkpoint_in": "k"}, "artifact_store"),
        ({"max_checkpoint_bytes": 0}, "max_checkpoint_bytes"),
    ],
)
def test_trainspec_refuses_a_bad_segment(changes: dict[str, object], field: str) -> None:
    with pytest.raises(TrainSpecError) as refused:
        wsd(**changes)
    assert refused.value.field == field, refused.value


def test_the_last_stable_step_is_a_segment_stop() -> None:
    spec = wsd(stop_step=32, checkpoint_out="k", artifact_store="x")
    assert spec.branch_steps() == 6


def refused_resume(spec: TrainSpec, store: str, start: int, corpus: Corpus) -> CheckpointError:
    """The CheckpointError of resuming `spec` at `start` from `run/step-<start>`, asserting
    that it came before any training step."""
    steps: list[int] = []
    with pytest.raises(CheckpointError) as refused:
        segment(spec, store, start, None, corpus, on_step=lambda s, t, loss: steps.append(s))
    assert steps == []
    assert refused.value.field == "checkpoint"
    assert isinstance(refused.value, TrainSpecError)
    return refused.value


def test_a_checkpoint_of_another_run_or_step_is_refused(corpus: Corpus, tmp_path: Path) -> None:
    spec = wsd()
    store = str(tmp_path)
    segment(spec, store, 0, S1, corpus)
    assert "another run's" in refused_resume(spec.replace(seed=1), store, S1, corpus).reason
    assert "another run's" in refused_resume(spec.replace(lr=1e-3), store, S1, corpus).reason
    # the same checkpoint presented as another step's
    data = ArtifactStore(store).get(f"run/step-{S1}", 2**30)
    ArtifactStore(store).put("run/step-12", data)
    assert "holds step 10, not 12" in refused_resume(spec, store, 12, corpus).reason
    # evaluation settings do not shape the trajectory: the checkpoint is this run's
    ok = segment(spec.replace(eval_interval=7, eval_batches=1), store, S1, None, corpus)
    assert ok.status == "completed"


def test_a_missing_truncated_or_foreign_checkpoint_is_refused(
    corpus: Corpus, tmp_path: Path
) -> None:
    spec = wsd()
    store = ArtifactStore(str(tmp_path))
    assert "is not in" in refused_resume(spec, str(tmp_path), S1, corpus).reason
    segment(spec, str(tmp_path), 0, S1, corpus)
    data = store.get(f"run/step-{S1}", 2**30)
    store.put(f"run/step-{S1}", data[: len(data) // 2])
    assert "not a readable checkpoint" in refused_resume(spec, str(tmp_path), S1, corpus).reason
    store.put(f"run/step-{S1}", b"")
    assert "not a readable checkpoint" in refused_resume(spec, str(tmp_path), S1, corpus).reason

    def saved(obj: object) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    for obj, words in (
        ({"format": "something-else"}, f"not a {FORMAT}"),
        ([1, 2, 3], f"not a {FORMAT}"),
        ({"format": FORMAT, "version": 2}, "version 2"),
        ({"format": FORMAT, "version": 1, "step": S1}, "lacks or has malformed fingerprint"),
        (NotData(), "not a readable checkpoint"),  # an object: weights_only refuses it
    ):
        store.put(f"run/step-{S1}", saved(obj))
        assert words in refused_resume(spec, str(tmp_path), S1, corpus).reason


def test_a_checkpoint_that_does_not_fit_the_model_is_refused(
    corpus: Corpus, tmp_path: Path
) -> None:
    spec = wsd()
    store = ArtifactStore(str(tmp_path))
    segment(spec, str(tmp_path), 0, S1, corpus)
    state = load_checkpoint(store, f"run/step-{S1}", spec.fingerprint(), S1)
    model = dict(state.model)
    model.pop(next(iter(model)))
    broken = Checkpoint(S1, state.fingerprint, model, state.optimizer, state.batch_generator)
    save_checkpoint(store, f"run/step-{S1}", broken)
    assert "does not fit this run" in refused_resume(spec, str(tmp_path), S1, corpus).reason


def test_checkpoint_size_limits(corpus: Corpus, tmp_path: Path) -> None:
    spec = wsd()
    store = ArtifactStore(str(tmp_path))
    with pytest.raises(CheckpointError) as refused:  # too large to save: nothing written
        segment(spec.replace(max_checkpoint_bytes=1000), str(tmp_path), 0, S1, corpus)
    assert refused.value.field == "checkpoint" and "over 1000" in refused.value.reason
    assert store.keys() == []
    segment(spec, str(tmp_path), 0, S1, corpus)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(store, f"run/step-{S1}", spec.fingerprint(), S1, max_bytes=1000)
    assert "more than the limit 1000" in refused.value.reason


def test_a_segment_refuses_an_unusable_store_before_training(
    corpus: Corpus, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("not a folder")
    steps: list[int] = []
    with pytest.raises(StoreError) as refused:
        segment(
            wsd(),
            str(tmp_path / "file" / "store"),
            0,
            S1,
            corpus,
            on_step=lambda *a: steps.append(1),
        )
    assert refused.value.field == "artifact_store" and steps == []
    with pytest.raises(StoreError) as bad_key:
        train(
            wsd(stop_step=S1, checkpoint_out="../up", artifact_store=str(tmp_path)), corpus=corpus
        )
    assert bad_key.value.field == "key"


# -- (d) the store ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key", ["", "/a", "a/", "a//b", "..", "../x", "a/./b", "a/..", "a b", "a\\b", "é", "a/b?"]
)
def test_bad_keys_are_refused(key: str, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path))
    for use in (
        lambda: check_key(key),
        lambda: store.put(key, b"x"),
        lambda: store.get(key, 10),
        lambda: store.exists(key),
        lambda: store.delete(key),
        lambda: store.delete_prefix(key),
        lambda: store.keys(key),
    ):
        with pytest.raises(StoreError) as refused:
            use()
        assert refused.value.field == "key"
    assert os.listdir(tmp_path) == []


def test_good_keys_are_accepted() -> None:
    for key in ("a", "job-1/trial_2/seed.0/step-10.ckpt", "A.B_C-D", "..a", "a.."):
        assert check_key(key) == key


def test_put_is_atomic_and_replaces(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "root"))
    store.put("a/b/c", b"one")
    store.put("a/b/c", b"two")
    assert store.get("a/b/c", 3) == b"two"
    assert sorted(os.listdir(tmp_path / "root" / "a" / "b")) == ["c"]  # no temporary left
    (tmp_path / "root" / "a" / "b" / "c.tmp-0123456789abcdef").write_bytes(b"half")
    assert store.keys() == ["a/b/c"]  # a write in progress is no key


def test_a_remote_store_reads_within_the_limit_only() -> None:
    store = ArtifactStore(f"memory://limits-{secrets.token_hex(6)}")
    store.put("j/t/s1", b"12345")
    assert store.get("j/t/s1", 5) == b"12345"
    with pytest.raises(CheckpointError) as large:
        store.get("j/t/s1", 4)
    assert "holds 5 bytes, more than the limit 4" in large.value.reason
    with pytest.raises(CheckpointError) as missing:
        store.get("j/t/s2", 10)
    assert missing.value.field == "checkpoint" and "is not in" in missing.value.reason


def test_store_get_exists_delete_and_keys(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path))
    assert store.keys() == [] and not store.exists("x")
    with pytest.raises(CheckpointError) as missing:
        store.get("x", 10)
    assert missing.value.field == "checkpoint" and "is not in" in missing.value.reason
    for key in ("j1/t1/s10", "j1/t1/s20", "j1/t2/s10", "j10/t1/s10"):
        store.put(key, key.encode())
    assert store.exists("j1/t1/s10") and not store.exists("j1/t1")  # a folder is no key
    assert store.keys("j1") == ["j1/t1/s10", "j1/t1/s20", "j1/t2/s10"]
    assert store.keys("j1/t1") == ["j1/t1/s10", "j1/t1/s20"]
    assert store.keys("nothing") == []
    with pytest.raises(CheckpointError) as large:
        store.get("j1/t1/s10", 3)
    assert "more than the limit 3" in large.value.reason
    store.delete("j1/t1/s10")
    store.delete("j1/t1/s10")  # missing is fine
    store.delete_prefix("j1/t1")
    assert store.keys() == ["j1/t2/s10", "j10/t1/s10"]
    store.delete_prefix("j1")
    store.delete_prefix("j1")  # nothing left is fine
    assert store.keys() == ["j10/t1/s10"]  # a sibling sharing the prefix's letters stays


def test_check_accepts_a_folder_and_refuses_an_unwritable_one(tmp_path: Path) -> None:
    ArtifactStore(str(tmp_path / "new")).check()  # creates the folder
    assert os.listdir(tmp_path / "new") == []  # the probe is gone
    (tmp_path / "file").write_text("a file, not a folder")
    with pytest.raises(StoreError) as refused:
        ArtifactStore(str(tmp_path / "file" / "store")).check()
    assert refused.value.field == "artifact_store"
    assert "cannot write" in refused.value.reason
    with pytest.raises(StoreError) as unknown:
        ArtifactStore("nosuchprotocol://bucket/x")
    assert unknown.value.field == "artifact_store"


def test_a_memory_store_works(memory_url: str) -> None:
    store = ArtifactStore(memory_url)
    store.check()
    store.put("a/b", b"\x00\x01")
    assert store.get("a/b", 2) == b"\x00\x01" and store.exists("a/b")
    assert store.keys() == ["a/b"] and store.keys("a") == ["a/b"]
    store.delete_prefix("a")
    assert store.keys() == []


def test_a_file_url_is_the_folder(tmp_path: Path) -> None:
    ArtifactStore(f"file://{tmp_path}").put("k", b"v")
    assert ArtifactStore(str(tmp_path)).get("k", 1) == b"v"


# -- (e) errors cross processes ---------------------------------------------------------------
def test_store_errors_survive_pickling() -> None:
    for error in (CheckpointError("checkpoint", "gone"), StoreError("artifact_store", "no")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error)
        assert (back.field, back.reason, str(back)) == (error.field, error.reason, str(error))
    assert isinstance(
        pickle.loads(pickle.dumps(CheckpointError("checkpoint", "x"))), TrainSpecError
    )


# -- the fingerprint --------------------------------------------------------------------------
def test_the_fingerprint_is_the_trajectory() -> None:
    spec = wsd()
    fp = spec.fingerprint()
    assert len(fp) == 64 and int(fp, 16) >= 0
    same = (
        {"eval_interval": 7},
        {"n_evals": 3},
        {"eval_batches": 1},
        {"device": "cpu"},
        {"threads": 2},
        {"stop_step": 10, "checkpoint_out": "k", "artifact_store": "x"},
    )
    for changes in same:
        assert spec.replace(**changes).fingerprint() == fp, changes
    other = (
        {"seed": 1},
        {"lr": 1e-3},
        {"budget_tokens": 4 * 32 * 41},
        {"decay_frac": 0.3},
        {"beta2": 0.99},
        {"corpus": "elsewhere"},
        {"arch": ARCHS["block_attnres"]},
        {"arch": ARCHS["baseline"].replace(dtype="bfloat16")},
    )
    prints = {spec.replace(**changes).fingerprint() for changes in other}
    assert fp not in prints and len(prints) == len(other)


def test_the_store_does_not_import_torch() -> None:
    code = "import sys, workers.store; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
