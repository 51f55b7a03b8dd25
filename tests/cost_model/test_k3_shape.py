"""Golden figures of a Kimi K3-shaped architecture (`examples/arch/k3_shape.yaml`): 93
Transformer blocks, d = 7168, Block AttnRes with a depth block every 12 Transformer blocks
(block_size 24 sublayers), 9 depth sources. A public K3 estimator gives the pipeline payload
at the first stage boundary as (1 + 1) × 8192 × 7168 × 2 bytes = 224 MiB per 8,192-token
micro-batch in bf16: the embedding and the first block's partial sum. The count of sources
carried is what is pinned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cost_model import ArchConfig, Parallelism, Workload, pipeline_comm
from cost_model.comm import boundary_sources
from nas_service.cli.arch import load_arch_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "arch" / "k3_shape.yaml"
K3 = ArchConfig(**load_arch_file(str(EXAMPLE)))
MIB = 2**20


def test_the_example_is_the_k3_shape() -> None:
    assert (K3.n_layers, K3.d_model, K3.variant, K3.block_size) == (93, 7168, "block_attnres", 24)
    assert K3.n_sublayers == 186
    assert K3.n_blocks == 8  # ceil(186 / 24): 7 blocks of 24 and one of 18
    assert K3.n_blocks + 1 == 9  # with the embedding: 9 depth sources


@pytest.mark.parametrize(
    ("pipeline", "sources"),
    [
        (31, 2),  # 3 blocks (6 sublayers) per stage: the embedding + the first block's partial
        (93, 2),  # 1 block per stage
        (3, 4),  # 31 blocks (62 sublayers): the embedding, 2 finished blocks, a partial
    ],
)
def test_the_first_stage_boundary_carries_the_sources_a_later_stage_reads(
    pipeline: int, sources: int
) -> None:
    wl = Workload(micro_batch=1, seq_len=8192)
    pp = pipeline_comm(K3, Parallelism(pipeline=pipeline), wl)
    assert pp.first_boundary_sources == sources
    assert pp.first_boundary_bytes_per_microbatch == sources * 8192 * 7168 * 2


def test_224_mib_per_microbatch_at_the_first_boundary() -> None:
    pp = pipeline_comm(K3, Parallelism(pipeline=31), Workload(micro_batch=1, seq_len=8192))
    assert pp.first_boundary_bytes_per_microbatch == 224 * MIB
    # a boundary exactly at the end of a depth block carries no partial: 12 blocks = 24 sublayers
    assert boundary_sources(K3, 12) == 2  # the embedding and block 1
    assert boundary_sources(K3, 13) == 3  # … and block 2's partial
    # the other wirings at the same boundary: the hidden state alone, or every output so far
    assert boundary_sources(K3.replace(variant="baseline", block_size=None), 3) == 1
    assert boundary_sources(K3.replace(variant="full_attnres", block_size=None), 3) == 7


def test_the_cli_prints_the_example_s_payload() -> None:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "nas_service.cli", "cost", "--arch", str(EXAMPLE)),
            *("--hardware", "h200", "--pp", "31", "--micro-batch", "1", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    pipeline = json.loads(out.stdout)["cost"]["pipeline"]
    assert pipeline["first_boundary_sources"] == 2
    assert pipeline["first_boundary_bytes_per_microbatch"] == 224 * MIB
