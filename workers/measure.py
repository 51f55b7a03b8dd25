"""What a training run measures of its machine: the device it trains on and its name, the
bytes autograd saves for backward (`SavedTensors`), the training state's bytes, and the
process's resident set."""

from __future__ import annotations

import os
from typing import Any

import torch

from workers.contract import TrainSpecError


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise TrainSpecError("device", "cuda requested but no CUDA device is present")
        return torch.device("cuda")
    return torch.device("cpu")


class SavedTensors:
    """The bytes autograd saves for backward while `hooks()` is active: every distinct
    storage a saved tensor lives in (a storage saved twice, or views of one, counted once, by
    its address), the model's parameters excluded (they are the weights, not activations).
    This is what `cost_model.training_memory` calls `activation_bytes` (the conformance
    suite, `tests/workers/test_model_conformance.py`, checks the two agree per variant). The
    saved tensors are held by the graph until backward, so no two of them share an address.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}  # address -> bytes

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        address = storage.data_ptr()
        if address not in self.parameters:
            self.storages[address] = storage.nbytes()
        return t

    def hooks(self) -> Any:
        """The context in which the saved tensors are counted (the pack hook records and
        returns the tensor itself: nothing is copied)."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of the training state: every parameter, a gradient of each trainable one (of its
    dtype), and the optimizer's state tensors (AdamW: two moments and a step count per
    parameter, once it has stepped)."""
    params = list(model.parameters())
    weights = sum(p.nbytes for p in params)
    grads = sum(p.nbytes for p in params if p.requires_grad)
    optimizer = sum(
        v.nbytes for state in opt.state.values() for v in state.values() if torch.is_tensor(v)
    )
    return int(weights + grads + optimizer)


def device_name(device: torch.device) -> str:
    """The device kind a run records: "cpu", or the CUDA device's name
    (`torch.cuda.get_device_name`, e.g. "NVIDIA H200")."""
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return device.type


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc), 0 where unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
