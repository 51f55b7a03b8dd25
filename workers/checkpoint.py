"""A main line's state in the artifact store: what a segment of a WSD run leaves for the next.

One checkpoint is one `torch.save` of a dictionary of tensors and plain data (the model's and
the optimizer's state dicts, the batch generator's state, the step, the run's fingerprint,
the format and its version), stored as bytes under one key (`workers.store`). It is read back
with `torch.load(weights_only=True)`, which builds tensors and plain containers only, never
arbitrary objects: a checkpoint is data, not code. Everything that can be wrong with one
(missing, too large, truncated, another format or version, another run's, another step's)
is a `CheckpointError(field="checkpoint", reason)` naming what.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from typing import Any

import torch

from workers.store import ArtifactStore, CheckpointError

FORMAT = "depthscope-checkpoint"
VERSION = 1
MAX_BYTES = 2**30  # the default limit on one checkpoint's size


@dataclass(frozen=True)
class Checkpoint:
    """The main line of a run (`fingerprint`) after `step` optimizer steps: the model's and
    the optimizer's state dicts and the training batches' generator state (a uint8 tensor,
    `torch.Generator.get_state()`)."""

    step: int
    fingerprint: str
    model: dict[str, Any]
    optimizer: dict[str, Any]
    batch_generator: torch.Tensor


def save_checkpoint(
    store: ArtifactStore, key: str, state: Checkpoint, max_bytes: int = MAX_BYTES
) -> int:
    """Store `state` under `key` (atomically: see `ArtifactStore.put`); return its size in
    bytes. A checkpoint over `max_bytes` is refused before anything is written (it could
    never be loaded)."""
    buffer = io.BytesIO()
    torch.save(
        {
            "format": FORMAT,
            "version": VERSION,
            "step": state.step,
            "fingerprint": state.fingerprint,
            "model": state.model,
            "optimizer": state.optimizer,
            "batch_generator": state.batch_generator,
        },
        buffer,
    )
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise CheckpointError(
            "checkpoint", f"the state at step {state.step} is {len(data)} bytes, over {max_bytes}"
        )
    store.put(key, data)
    return len(data)


def load_checkpoint(
    store: ArtifactStore, key: str, fingerprint: str, step: int, max_bytes: int = MAX_BYTES
) -> Checkpoint:
    """The checkpoint under `key`, which must be `fingerprint`'s main line at `step`."""
    data = store.get(key, max_bytes)
    decoded = _decoded_size(key, data)
    if decoded > max_bytes:  # torch inflates compressed entries: the limit is on the result
        raise CheckpointError(
            "checkpoint",
            f"{key} decodes to {decoded} bytes ({len(data)} stored), more than the limit "
            f"{max_bytes}",
        )
    try:
        raw = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, not a torch file, or objects weights_only refuses
        raise CheckpointError("checkpoint", f"{key} is not a readable checkpoint: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError("checkpoint", f"{key} is not a {FORMAT}")
    if raw.get("version") != VERSION:
        raise CheckpointError(
            "checkpoint", f"{key} is version {raw.get('version')!r}, this worker reads {VERSION}"
        )
    missing = [
        name
        for name, kind in _FIELDS.items()
        if not isinstance(raw.get(name), kind) or isinstance(raw.get(name), bool)
    ]
    if missing:
        raise CheckpointError("checkpoint", f"{key} lacks or has malformed {', '.join(missing)}")
    if raw["fingerprint"] != fingerprint:
        raise CheckpointError(
            "checkpoint",
            f"{key} is another run's (fingerprint {raw['fingerprint'][:12]}…, this run's "
            f"{fingerprint[:12]}…)",
        )
    if raw["step"] != step:
        raise CheckpointError("checkpoint", f"{key} holds step {raw['step']}, not {step}")
    return Checkpoint(
        step=raw["step"],
        fingerprint=raw["fingerprint"],
        model=raw["model"],
        optimizer=raw["optimizer"],
        batch_generator=raw["batch_generator"],
    )


def _decoded_size(key: str, data: bytes) -> int:
    """The bytes the zip archive `data` (what `torch.save` writes) holds once inflated: the
    sum of its entries' sizes, which bound what torch's reader allocates for each."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, ValueError, OSError) as exc:  # not a zip, or a broken one
        raise CheckpointError(
            "checkpoint", f"{key} is not a readable checkpoint (not a torch archive: {exc})"
        ) from exc


#: The checkpoint's entries besides format and version, with their types.
_FIELDS: dict[str, type] = {
    "step": int,
    "fingerprint": str,
    "model": dict,
    "optimizer": dict,
    "batch_generator": torch.Tensor,
}
