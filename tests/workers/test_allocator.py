"""The training process's C heap (workers/allocator.py), measured in fresh processes: with the
trainer's settings a training step reuses the pages of the one before, and `release` gives
freed memory back."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the heap settings are glibc's",
)

STEPS = """
import json, resource, sys
import torch
from cost_model import ArchConfig
from workers import allocator
from workers.model import build_model

tuned = sys.argv[1] == "tuned" and allocator.for_training()
torch.manual_seed(0)
cfg = ArchConfig(n_layers=2, d_model=256, n_heads=4, seq_len=256, variant="mhc_lite")
model = build_model(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, 256, (8, 256))

def step():
    _, loss = model(x, x)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

for _ in range(5):
    step()
per_step = []
for _ in range(7):
    start = faults()
    step()
    per_step.append(faults() - start)
# the median step: a step that grows the heap once more (now and then, as the order of
# allocations shifts) faults its new pages in, and is not the typical step
print(json.dumps({"tuned": tuned, "faults_per_step": sorted(per_step)[3], "steps": per_step}))
"""

RELEASE = """
import json
import torch
from workers import allocator

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

assert allocator.for_training()
block = torch.ones(32 << 20)  # 128 MiB, under the mmap threshold: from the heap
held = rss()
del block
kept = rss()
released = allocator.release()
print(json.dumps({"held": held, "kept": kept, "after": rss(), "released": released}))
"""


def run(script: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def test_training_steps_reuse_their_pages() -> None:
    default = run(STEPS, "default")
    tuned = run(STEPS, "tuned")
    assert tuned["tuned"] and not default["tuned"]
    # glibc's defaults map large blocks afresh every step; the trainer's settings keep them
    assert default["faults_per_step"] > 500, default
    assert tuned["faults_per_step"] < default["faults_per_step"] / 5, (default, tuned)


def test_freed_memory_is_kept_until_released() -> None:
    out = run(RELEASE)
    mib = 1 << 20
    assert out["kept"] > out["held"] - 16 * mib  # freed, and still resident for reuse
    assert out["released"]
    assert out["after"] < out["kept"] - 96 * mib  # handed back
