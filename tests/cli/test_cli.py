"""The `depthscope` command line: one flag per `ArchConfig` field, `--arch FILE.yaml` read
like a spec and checked field by field, job files validated before they are sent, and no
heavy framework loaded by the commands that do not train."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cost_model import ArchConfig
from nas_service import cli
from nas_service.cli.arch import arch_fields, arch_values

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ["--n-layers", "4", "--d-model", "128", "--n-heads", "4"]


def subparser(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]  # type: ignore[no-any-return]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert cli.main(["cost", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.mark.parametrize("command", ["cost", "train"])
def test_every_arch_field_has_a_flag(command: str) -> None:
    options = subparser(command)._option_string_actions
    names = [f.name for f in dataclasses.fields(ArchConfig)]
    assert [f.name for f in arch_fields()] == names
    for name in names:
        flag = "--" + name.replace("_", "-")
        assert flag in options, flag
        assert options[flag].dest == name
        assert options[flag].help and options[flag].help != name  # a line of help each
    assert "--arch" in options


def test_flags_reach_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    """Two architectures that between them set every field to a value other than its
    default, through the flags: the command prices exactly that ArchConfig."""
    block = ArchConfig(
        n_layers=4,
        d_model=128,
        n_heads=4,
        vocab_size=300,
        seq_len=64,
        n_kv_heads=2,
        ff_ratio=3.0,
        mlp="swiglu",
        norm="layernorm",
        positions="learned",
        bias=True,
        tie_embeddings=False,
        variant="block_attnres",
        block_size=2,
        dtype="bfloat16",
    )
    mhc = ArchConfig(n_layers=2, d_model=64, n_heads=2, d_ff=100, variant="mhc_lite", mhc_streams=3)
    defaults = ArchConfig(n_layers=1, d_model=8, n_heads=1)
    changed = set()
    for arch in (block, mhc):
        flags = []
        for f in dataclasses.fields(ArchConfig):
            value = getattr(arch, f.name)
            if value == getattr(defaults, f.name) and f.name not in ("n_layers", "d_model"):
                continue
            changed.add(f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                flags.append(flag if value else "--no-" + flag[2:])
            else:
                flags += [flag, str(value)]
        assert run_json(capsys, *flags)["arch"] == arch.to_dict()
    assert changed == {f.name for f in dataclasses.fields(ArchConfig)}  # a new field: set it


def test_the_readme_flags_still_work(capsys: pytest.CaptureFixture[str]) -> None:
    arch = run_json(capsys, *SHAPE, "--bias", "--untied")["arch"]
    assert arch["bias"] is True and arch["tie_embeddings"] is False
    arch = run_json(capsys, *SHAPE)["arch"]
    assert arch == ArchConfig(n_layers=4, d_model=128, n_heads=4).to_dict()


def test_arch_file_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "arch.yaml"
    path.write_text(
        "n_layers: 6\nd_model: 192\nn_heads: 3\nvariant: block_attnres\nblock_size: 4\n"
        "ff_ratio: 2\nmlp: swiglu\ntie_embeddings: false\nn_kv_heads: null\n"
    )
    arch = run_json(capsys, "--arch", str(path))["arch"]
    expected = ArchConfig(
        n_layers=6,
        d_model=192,
        n_heads=3,
        variant="block_attnres",
        block_size=4,
        ff_ratio=2.0,
        mlp="swiglu",
        tie_embeddings=False,
    )
    assert arch == expected.to_dict()
    # a flag wins over the file
    arch = run_json(capsys, "--arch", str(path), "--n-layers", "3", "--tie-embeddings")["arch"]
    assert arch == expected.replace(n_layers=3, tie_embeddings=True).to_dict()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n_layers: 4\nd_model: 128\nn_heads: 4\ncolour: blue\n", "colour: not an architecture"),
        ("n_layers: '4'\nd_model: 128\nn_heads: 4\n", "n_layers: must be an integer"),
        ("n_layers: 4.0\nd_model: 128\nn_heads: 4\n", "n_layers: must be an integer"),
        ("n_layers: true\nd_model: 128\nn_heads: 4\n", "n_layers: must be an integer"),
        ("n_layers: null\nd_model: 128\nn_heads: 4\n", "n_layers: must be an integer, got None"),
        ("n_layers: 4\nd_model: 128\nn_heads: 4\nbias: 1\n", "bias: must be true or false"),
        ("n_layers: 4\nd_model: 128\nn_heads: 4\nff_ratio: .inf\n", "ff_ratio: must be a finite"),
        ("n_layers: 4\nd_model: 128\nn_heads: 4\nmlp: [gelu]\n", "mlp: must be a string"),
        ("n_layers: 4\nd_model: 128\nn_heads: 4\nvariant: nope\n", "variant: unknown value 'nope'"),
        ("n_layers: 4\nd_model: 130\nn_heads: 4\n", "n_heads: d_model=130 is not divisible"),
        ("d_model: 128\nn_heads: 4\n", "n_layers: required: give --n-layers or set it in --arch"),
        ("a: &x 1\nb: *x\n", "arch: YAML anchors and aliases are not accepted"),
        ("- 1\n- 2\n", "arch: "),
        ("n_layers: [unclosed\n", "arch: "),
        ("1: 2\n", "1: not an architecture field"),
    ],
)
def test_a_bad_arch_file_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "arch.yaml"
    path.write_text(text)
    assert cli.main(["cost", "--arch", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("depthscope cost: error: ") and message in err, err


def test_arch_files_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("n_layers: 4\n" + "#" * (1 << 20))
    assert cli.main(["cost", "--arch", str(big)]) == 2
    assert "arch: " in (err := capsys.readouterr().err) and "over the limit of" in err
    assert cli.main(["train", "--arch", str(tmp_path / "none.yaml"), "--tokens", "10"]) == 2
    assert "arch: file" in (err := capsys.readouterr().err) and "does not exist" in err


def test_arch_values_merges_flags_over_file_over_defaults(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("n_layers: 2\nd_model: 64\nn_heads: 2\nseq_len: 32\n")
    args = subparser("cost").parse_args(["--arch", str(path), "--seq-len", "16"])
    values = arch_values(args)
    assert values["seq_len"] == 16 and values["n_layers"] == 2
    assert values["vocab_size"] == ArchConfig(n_layers=1, d_model=8, n_heads=1).vocab_size


def test_submit_validates_the_job_file_before_sending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent: list[Any] = []

    def record(args: Any, method: str, path: str, **kwargs: Any) -> Any:
        sent.append(kwargs["json"])
        return {"id": "1", "name": kwargs["json"]["name"], "n_trials": 1}

    monkeypatch.setattr(cli.transport, "_request", record)
    bad = tmp_path / "bad.yaml"
    quick = (ROOT / "examples" / "quick.yaml").read_text()
    bad.write_text(re.sub(r"(?m)^n_trials: .*$", "n_trials: 0", quick) + "colour: blue\n")
    assert cli.main(["submit", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "n_trials: Input should be greater than or equal to 1" in err and sent == []
    assert "colour: Extra inputs are not permitted" in err
    assert cli.main(["submit", str(ROOT / "examples" / "quick.yaml")]) == 0
    assert sent[0]["name"] == "quick-baseline-vs-block"
    assert "colour" not in sent[0] and "n_trials" in sent[0]


HEAVY = ("torch", "ray", "optuna", "sqlalchemy", "fastapi")


@pytest.mark.parametrize(
    "argv",
    [
        ["cost", *SHAPE, "--json"],
        ["cost", *SHAPE, "--variant", "baseline,block_attnres", "--block-size", "2"],
        ["status", "--url", "http://127.0.0.1:9"],
        ["cost", "--help"],
    ],
    ids=["cost", "cost-side-by-side", "status", "help"],
)
def test_commands_that_do_not_train_load_no_heavy_framework(argv: list[str]) -> None:
    code = (
        "import sys, contextlib, io\n"
        "from nas_service.cli import main\n"
        "quiet = io.StringIO()\n"
        "with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):\n"
        "    try:\n"
        f"        main({argv!r})\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "", out.stdout


def test_commands_without_an_architecture_do_not_load_the_cost_model(tmp_path: Path) -> None:
    """`depthscope db` runs from a wheel installed with the database layer only (no numpy)."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    for argv in (["db", "current", "--url", url], ["status", "--url", "http://127.0.0.1:9"]):
        code = (
            "import sys, contextlib, io\n"
            "from nas_service.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({argv!r})\n"
            "print(','.join(m for m in ('numpy', 'cost_model') if m in sys.modules))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
        )
        assert out.stdout.strip() == "", (argv, out.stdout)


def test_python_dash_m_runs_the_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nas_service.cli", "cost", *SHAPE, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["arch"]["n_layers"] == 4


def documented_commands() -> list[list[str]]:
    """The `depthscope` command lines of the README and the Makefile, as argument lists."""
    import shlex

    text = (ROOT / "README.md").read_text() + "\n" + (ROOT / "Makefile").read_text()
    text = text.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        for prefix in (".venv/bin/depthscope ", "$(VENV)/bin/depthscope "):
            if line.startswith(prefix):
                out.append(shlex.split(line.removeprefix(prefix).replace("[JOB]", "JOB")))
    return out


def test_the_documented_command_lines_parse_and_cost_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = documented_commands()
    assert {c[0] for c in commands} >= {
        "cost",
        "serve",
        "submit",
        "status",
        "pareto",
        "runner",
        "compare",
        "sensitivity",
    }
    for argv in commands:
        if argv[0] == "cost":
            assert cli.main(argv) == 0, capsys.readouterr().err
        else:
            parse(argv)  # exits (and fails the test) on an unknown flag


def parse(argv: list[str]) -> argparse.Namespace:
    """The namespace `main` would run (the commands not called)."""
    args, rest = cli.build_parser().parse_known_args(argv)
    assert not rest or getattr(args, "forward", False), rest
    return args


def test_the_runner_gets_its_arguments_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    import nas_service.runner.loop

    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setattr(nas_service.runner.loop, "main", fake_main)
    assert cli.main(["runner", "--cluster", "lab", "--forever"]) == 0
    assert cli.main(["runner"]) == 0
    assert seen == [["--cluster", "lab", "--forever"], []]
    with pytest.raises(SystemExit):
        cli.main(["status", "--colour", "blue"])


def test_side_by_side_the_conditional_fields_go_to_their_variants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    both = "baseline,mhc_lite,block_attnres"
    out = run_json(capsys, *SHAPE, "--variant", both, "--mhc-streams", "3", "--block-size", "2")
    assert out["mhc_lite"]["arch"]["mhc_streams"] == 3
    assert out["block_attnres"]["arch"]["block_size"] == 2
    assert out["baseline"]["arch"]["mhc_streams"] is None
    assert out["baseline"]["arch"]["block_size"] is None
    assert cli.main(["cost", *SHAPE, "--block-size", "2"]) == 2
    assert "block_size: only block_attnres has a block size" in capsys.readouterr().err
    assert cli.main(["cost", *SHAPE, "--variant", "baseline", "--mhc-streams", "2"]) == 2
    assert "mhc_streams: only mhc_lite has streams" in capsys.readouterr().err
    # one architecture (train): a conditional field for the wrong variant is refused
    assert cli.main(["train", *SHAPE, "--block-size", "2", "--tokens", "10"]) == 2
    assert "block_size: variant 'baseline' has no block size" in capsys.readouterr().err


def test_train_takes_the_depth_mixing_learning_rate(capsys: pytest.CaptureFixture[str]) -> None:
    """`depthscope train --depth-lr-mult` reaches the run (refused with the field when
    negative) and trains with it."""
    tiny = ["--n-layers", "1", "--d-model", "16", "--n-heads", "2", "--seq-len", "16"]
    args = ["train", *tiny, "--variant", "full_attnres", "--tokens", "256", "--batch-size", "4"]
    assert cli.main([*args, "--depth-lr-mult", "-1"]) == 2
    assert "depth_lr_mult" in capsys.readouterr().err
    assert cli.main([*args, "--depth-lr-mult", "0", "--quiet", "--json", "--threads", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 4 and result["status"] == "completed"
