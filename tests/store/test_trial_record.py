"""The record of a trial has one home (`nas_service.store.records`): every attribute the
runner writes is a `TrialAttr` and a `TrialRecord` field, a record written as attributes
reads back equal (through Optuna's storage too), and the read schema the API answers with
shows every field the runner writes."""

from __future__ import annotations

import dataclasses
import math
import typing

import optuna

from nas_service.results.answers import _row
from nas_service.search.study import train_summary
from nas_service.store.records import (
    SHOWN_AS,
    ConfirmRead,
    ConfirmRecord,
    RungRead,
    RungRecord,
    SeedStats,
    SettingRead,
    SettingRecord,
    TrainRun,
    TrainRunRead,
    TrialAttr,
    TrialRead,
    TrialRecord,
)
from workers.contract import EvalPoint, TrainResult


def _result() -> TrainResult:
    return TrainResult(
        status="completed",
        reason="",
        final_val_loss=3.5,
        best_val_loss=3.4,
        final_train_loss=3.3,
        curve=[
            EvalPoint(step=10, tokens=1280, flops=1e9, val_loss=3.5, train_loss=3.3, elapsed_s=2.0)
        ],
        steps=10,
        tokens_seen=1280,
        flops_spent=1e9,
        flops_budget=1e9,
        wall_time_s=2.0,
        eval_time_s=0.5,
        tokens_per_s=853.3,
        peak_memory_bytes=1 << 20,
        memory_kind="cpu_peak_rss",
        device="cpu",
        params=1000,
        corpus={"name": "tiny", "checksum": "abc"},
        device_name="cpu",
        saved_tensor_bytes=4096,
        state_bytes=8192,
        peak_rss_bytes=1 << 21,
        final_val_bpb=1.2,
        best_val_bpb=1.1,
    )


def _full_record() -> TrialRecord:
    """A record with every field set, as the runner writes a completed multi-fidelity
    trial that retries a lost one."""
    setting = {"lr": 0.001, "warmup_frac": 0.1}
    run: TrainRun = train_summary(_result()) | {
        "seed": 0,
        "setting": setting,
        "rung": 0,
        "curve": [[10.0, 1280.0, 1e9, 3.5]],
    }
    stats: SeedStats = {
        "mean": 3.5,
        "std": 0.1,
        "min": 3.4,
        "max": 3.6,
        "values": [3.6, 3.4],
        "seeds": [1, 2],
    }
    settings: list[SettingRecord] = [{"setting": setting, "losses": [3.5], "mean": 3.5}]
    confirm: ConfirmRecord = {
        "setting": setting,
        "seeds": [1, 2],
        "losses": [3.6, 3.4],
        "mean": 3.5,
    }
    rung: RungRecord = {
        "rung": 0,
        "fraction": 1.0,
        "loss": 3.5,
        "values": [3.5],
        "steps": 10,
        "tokens": 1280,
        "given_up": [],
        "promoted": False,
    }
    return TrialRecord(
        arch={"variant": "baseline", "n_layers": 2, "d_model": 64},
        costs={"params": 1000.0, "train_memory_bytes": 1e6},
        outcome="completed",
        reason="",
        train=[run],
        curve=[[10.0, 1280.0, 1e9, 3.5]],
        setting=setting,
        settings=settings,
        seeds=stats,
        confirm=confirm,
        bpb=1.2,
        rungs=[rung],
        waiting=0,
        lost=False,
        retry_of=3,
        suspect=1,
    )


def test_every_attribute_is_a_record_field() -> None:
    names = {f.name for f in dataclasses.fields(TrialRecord)} - {"nulls"}
    assert names == {a.name.lower() for a in TrialAttr}
    assert len({a.value for a in TrialAttr}) == len(TrialAttr)  # no key named twice


def test_the_full_record_sets_every_field() -> None:
    record = _full_record()
    assert all(getattr(record, a.name.lower()) is not None for a in TrialAttr)
    assert set(record.to_attrs()) == {a.value for a in TrialAttr}
    assert set(record.train[0]) == set(typing.get_type_hints(TrainRun))  # type: ignore[index]


def test_a_record_reads_back_equal_from_its_attributes() -> None:
    record = _full_record()
    assert TrialRecord.from_attrs(record.to_attrs()) == record


def test_a_record_reads_back_equal_through_optunas_storage() -> None:
    """Written on a trial as its user attributes and read back from the storage: the same
    record, nulls included (a promoted trial's `waiting`, a loss without bits per byte)."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    record = dataclasses.replace(
        _full_record(), waiting=None, bpb=None, nulls=frozenset({TrialAttr.WAITING, TrialAttr.BPB})
    )
    trial = study.ask()
    for key, value in record.to_attrs().items():
        trial.set_user_attr(key, value)
    study.tell(trial, 3.5)
    stored = study.get_trials()[0].user_attrs
    assert stored[TrialAttr.WAITING] is None and stored[TrialAttr.BPB] is None
    assert TrialRecord.from_attrs(stored) == record


def test_a_partial_record_writes_only_its_fields() -> None:
    """A field left None is not written (what is stored stays), a null one is."""
    assert TrialRecord(lost=True).to_attrs() == {"ds_lost": True}
    promoted = TrialRecord(rungs=[], nulls=frozenset({TrialAttr.WAITING}))
    assert promoted.to_attrs() == {"rungs": [], "waiting": None}
    assert TrialRecord.from_attrs({"waiting": True, "rungs": [1, {"rung": 0}]}) == TrialRecord(
        rungs=[{"rung": 0}]  # type: ignore[typeddict-item]
    )


def test_the_read_schema_shows_every_field_the_runner_writes() -> None:
    """Every attribute (`TrialRecord`'s fields) has its `TrialRead` field, and every field of
    a run, a rung and a setting record its field in the run's, rung's and setting's read."""
    shown = {a: SHOWN_AS.get(a, a.name.lower()) for a in TrialAttr}
    assert {a: f for a, f in shown.items() if f not in TrialRead.model_fields} == {}
    for record, read in (
        (TrainRun, TrainRunRead),
        (RungRecord, RungRead),
        (SettingRecord, SettingRead),
        (ConfirmRecord, ConfirmRead),
    ):
        missing = set(typing.get_type_hints(record)) - set(read.model_fields)
        assert missing == set(), (record.__name__, missing)


def test_the_api_shows_a_full_record() -> None:
    """A trial with the full record, decoded as results decode it and validated as the API
    answers it: every field the runner wrote is in the answer."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    record = _full_record()
    trial = study.ask()
    for key, value in record.to_attrs().items():
        trial.set_user_attr(key, value)
    study.tell(trial, 3.5)
    read = TrialRead.model_validate(_row(study.get_trials()[0], ["val_loss"], None).as_dict())
    assert record.train is not None and record.seeds is not None
    run = read.train[0].model_dump()
    assert {k: run[k] for k in record.train[0]} == record.train[0]
    assert read.metrics["val_bpb"] == record.bpb and read.metrics["params"] == 1000.0
    assert read.lost is False and read.retry_of == 3 and read.suspect == 1
    shown = {k: v for k, v in record.seeds.items() if k not in ("values", "seeds")}
    assert read.seed_stats == shown
    # scored on the confirmation seeds, which the confirmation names
    assert read.seeds == [3.6, 3.4] and read.waiting == 0
    assert read.confirm is not None and read.confirm.model_dump() == record.confirm
    assert read.rungs[0].model_dump() == record.rungs[0]  # type: ignore[index]
    assert not math.isnan(read.train[0].final_val_bpb or math.nan)
