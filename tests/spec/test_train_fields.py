"""`TrainSpec`'s declaration (`workers.contract.TRAIN_FIELDS`) is the one the job spec's
training section and `depthscope train`'s flags are made from: a field the contract marks for
a job is a field of `spec.Training` with the declared default, a field it marks for the
command line is a flag with that default, and the section holds nothing the contract lacks."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from cost_model import ArchConfig
from nas_service import cli
from nas_service.cli.arch import arch_values
from nas_service.cli.train import train_values
from nas_service.spec import Training
from workers.contract import TRAIN_FIELDS, TrainField, TrainSpec

SHAPE = ["--n-layers", "1", "--d-model", "16", "--n-heads", "2", "--seq-len", "16"]


def section_gaps(fields: Iterable[TrainField], section: Mapping[str, Any]) -> list[str]:
    """What differs between the contract's job fields and a section's fields (name →
    default): a field missing, a default not the declared one, or a field of its own."""
    gaps: list[str] = []
    job = {f.name: f for f in fields if f.job}
    for name, f in job.items():
        if name not in section:
            gaps.append(f"{name}: missing from the section")
        elif name != "tokenizer" and section[name] != f.job_default:
            gaps.append(f"{name}: default {section[name]!r}, declared {f.job_default!r}")
    own = set(section) - set(job) - Training.ARCH_FIELDS
    gaps += [f"{name}: not a TrainSpec field" for name in sorted(own)]
    return gaps


def training_defaults() -> dict[str, Any]:
    return {
        name: f.get_default(call_default_factory=True) for name, f in Training.model_fields.items()
    }


def train_flags() -> dict[str, argparse.Action]:
    parser = cli.build_parser("train")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices["train"]._option_string_actions)


def test_every_trainspec_field_is_declared_in_the_table() -> None:
    assert list(TRAIN_FIELDS) == [f.name for f in dataclasses.fields(TrainSpec)]
    assert all(f.help for f in TRAIN_FIELDS.values())


def test_the_spec_section_has_every_job_field_of_the_contract() -> None:
    assert section_gaps(TRAIN_FIELDS.values(), training_defaults()) == []
    assert Training().batch_size == TrainSpec.__dataclass_fields__["batch_size"].default
    assert Training().n_evals == 8  # a job's own default, declared beside TrainSpec's 10
    assert Training.model_fields["lr"].description == TRAIN_FIELDS["lr"].help


def test_the_gap_check_finds_a_field_left_out_or_added() -> None:
    """The check above fails on a section that lacks a contract field, has another default
    or holds a field of its own."""
    section = training_defaults()
    lacking = {k: v for k, v in section.items() if k != "decay_frac"}
    assert section_gaps(TRAIN_FIELDS.values(), lacking) == ["decay_frac: missing from the section"]
    assert section_gaps(TRAIN_FIELDS.values(), section | {"batch_size": 32}) == [
        "batch_size: default 32, declared 16"
    ]
    assert section_gaps(TRAIN_FIELDS.values(), section | {"momentum": 0.9}) == [
        "momentum: not a TrainSpec field"
    ]
    extra = dataclasses.replace(TRAIN_FIELDS["seed"], job=True, job_default=0)
    assert section_gaps([*TRAIN_FIELDS.values(), extra], section) == [
        "seed: missing from the section"
    ]


def test_the_train_command_has_a_flag_for_every_cli_field() -> None:
    flags = train_flags()
    for f in TRAIN_FIELDS.values():
        if f.cli:
            assert f.flag in flags, f.flag
            assert flags[f.flag].dest == f.name
            assert flags[f.flag].default == f.default, f.name
            assert f.help in str(flags[f.flag].help)
    cli_fields = {f.name for f in TRAIN_FIELDS.values() if f.cli}
    # every field a job may set is also a flag but the tokenizer (a BPE needs its vocabulary
    # as the architecture's: the job spec's tokenizer section gives both)
    job_fields = {f.name for f in TRAIN_FIELDS.values() if f.job} - {"tokenizer"}
    assert job_fields <= cli_fields


def test_the_flags_reach_the_run() -> None:
    """Every flag of the table parses into the `TrainSpec` the command builds."""
    argv = [
        "train", *SHAPE, "--tokens", "256", "--batch-size", "4", "--lr", "0.01",
        "--schedule", "wsd", "--decay-frac", "0.3", "--n-evals", "3", "--seed", "5",
        "--text-field", "body", "--compile", "--device", "cpu", "--threads", "1",
    ]  # fmt: skip
    args = cli.build_parser("train").parse_args(argv)

    spec = TrainSpec(arch=ArchConfig(**arch_values(args)), **train_values(args))
    assert (spec.batch_size, spec.lr, spec.schedule, spec.decay_frac) == (4, 0.01, "wsd", 0.3)
    assert (spec.n_evals, spec.seed, spec.text_field, spec.compile) == (3, 5, "body", True)
    assert (spec.device, spec.threads, spec.budget_tokens, spec.budget_flops) == (
        "cpu",
        1,
        256,
        None,
    )
