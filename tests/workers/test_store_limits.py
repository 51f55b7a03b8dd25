"""A checkpoint's size limit counts what it decodes to, not the bytes stored (a zip bomb is
refused before it is inflated), and a local store reads no symbolic link: a key that is a
link, or lies under one, is refused, never followed."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest
import torch

from workers.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from workers.store import ArtifactStore, CheckpointError, StoreError

MiB = 2**20


def state(numel: int) -> Checkpoint:
    return Checkpoint(
        step=3,
        fingerprint="f" * 64,
        model={"w": torch.zeros(numel)},
        optimizer={"state": {}, "param_groups": []},
        batch_generator=torch.Generator().get_state(),
    )


def deflated(data: bytes) -> bytes:
    """The same torch zip archive, its entries deflated (torch reads those too)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


def test_a_zip_bomb_checkpoint_is_refused_by_its_decoded_size(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    size = save_checkpoint(store, "real", state(16 * MiB // 4))  # 16 MiB of zeros
    bomb = deflated(store.get("real", 2 * size))
    assert len(bomb) < 100_000  # ~16 MiB inflates from well under 100 kB
    store.put("bomb", bomb)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(store, "bomb", "f" * 64, 3, max_bytes=MiB)
    assert info.value.field == "checkpoint"
    assert "bomb" in info.value.reason and "decodes to" in info.value.reason, info.value.reason
    # under a limit that holds it decoded, the same deflated archive is read: only the size
    # refused it above
    back = load_checkpoint(store, "bomb", "f" * 64, 3, max_bytes=32 * MiB)
    assert back.model["w"].numel() == 16 * MiB // 4
    store.put("junk", b"\x00" * 64)  # not a zip archive at all
    with pytest.raises(CheckpointError, match="junk"):
        load_checkpoint(store, "junk", "f" * 64, 3, max_bytes=MiB)


def test_a_link_inside_the_store_is_refused_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore(str(root))
    save_checkpoint(store, "job/real", state(16))
    secret = tmp_path / "secret"
    secret.write_bytes(b"top secret" * 10)
    (root / "job" / "leak").symlink_to(secret)
    (root / "job" / "inner").symlink_to(root / "job" / "real")  # even one that stays inside
    (root / "alias").symlink_to(root / "job")  # a folder link on the way
    for key in ("job/leak", "job/inner", "alias/real"):
        with pytest.raises(CheckpointError) as info:
            store.get(key, MiB)
        assert key in info.value.reason and "symbolic link" in info.value.reason, info.value
    assert store.get("job/real", MiB)[:2] == b"PK"  # the file itself is read


@pytest.mark.timeout(30)  # opening a FIFO for reading blocks until a writer comes
def test_what_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore(str(root))
    store.put("job/real", b"x")
    os.mkfifo(root / "job" / "pipe")
    for key in ("job/pipe", "job"):
        with pytest.raises(CheckpointError) as info:
            store.get(key, MiB)
        assert key in info.value.reason and "not a regular file" in info.value.reason


def test_a_write_never_follows_a_link_inside_the_store(tmp_path: Path) -> None:
    """A folder link on the way to a key (planted by whoever can write in the store) is
    refused, and nothing is written where it leads; a link at the key itself is replaced
    by the new bytes, its target untouched."""
    root = tmp_path / "store"
    store = ArtifactStore(str(root))
    store.put("job/real", b"first")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "alias").symlink_to(outside)
    with pytest.raises(StoreError) as info:
        store.put("alias/ckpt", b"planted")
    assert "alias" in info.value.reason and "symbolic link" in info.value.reason
    assert list(outside.iterdir()) == []
    secret = tmp_path / "secret"
    secret.write_bytes(b"keep me")
    (root / "job" / "leak").symlink_to(secret)
    store.put("job/leak", b"new bytes")
    assert secret.read_bytes() == b"keep me"
    assert not (root / "job" / "leak").is_symlink() and store.get("job/leak", MiB) == b"new bytes"
    assert store.keys("job") == ["job/leak", "job/real"]  # no temporary left behind
