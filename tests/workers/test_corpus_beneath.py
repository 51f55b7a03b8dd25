"""A corpus read beneath the data folder (`load_corpus(..., root=...)`, what the service's
workers do): opened once, no symbolic link followed at any component, the descriptor checked
and read; messages and the corpus record name the path relative to the data folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.data import CorpusError, load_corpus

TEXT = b"to be or not to be, that is the question\n" * 40
SECRET = b"root:x:0:0:root:/root:/bin/bash\n" * 40


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "plays").mkdir(parents=True)
    (data / "plays.txt").write_bytes(TEXT)
    (data / "plays" / "act1.txt").write_bytes(TEXT)
    (data / "plays" / "act2.txt").write_bytes(TEXT.upper())
    (tmp_path / "passwd").write_bytes(SECRET)
    return data


def refused(root: Path, source: str, *needles: str, **kwargs: object) -> str:
    with pytest.raises(CorpusError) as info:
        load_corpus(source, root=str(root), **kwargs)  # type: ignore[arg-type]
    reason = info.value.reason
    assert info.value.field == "corpus"
    for needle in needles:
        assert needle in reason, (needle, reason)
    assert str(root) not in reason  # the server's own path is never shown
    return reason


def test_a_file_and_a_folder_beneath_the_root_are_read_and_shown_relative(root: Path) -> None:
    one = load_corpus("plays.txt", root=str(root))
    assert one.info.source == "plays.txt" and one.info.name == "plays.txt"
    assert one.info.n_tokens == len(TEXT)
    folder = load_corpus("plays", root=str(root))
    assert folder.info.source == "plays" and folder.info.n_tokens == 2 * len(TEXT)
    # the same tokens as the same corpus read by its path, so only the shown source differs
    assert one.info.checksum == load_corpus(root / "plays.txt").info.checksum


SWAPPER = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # even where SIGINT came ignored
target, link, plain, outside, text = sys.argv[1:6]
body = open(text, "rb").read()
swaps = 0
print("ready", flush=True)
try:
    while True:
        os.symlink(outside, link)
        os.replace(link, target)  # atomically: the name is now a link out
        with open(plain, "wb") as f:
            f.write(body)
        os.replace(plain, target)  # and a regular file again
        swaps += 1
except KeyboardInterrupt:
    print(swaps, flush=True)
"""


@pytest.mark.timeout(120)
def test_a_swapped_in_link_is_never_followed(root: Path, tmp_path: Path) -> None:
    """Another process swaps the file for a link to a file outside (and back) as fast as it
    can while the loader opens it again and again: every load reads the file or is refused
    naming it; not one reads the link's target."""
    target = root / "swap.txt"
    target.write_bytes(TEXT)
    (tmp_path / "text").write_bytes(TEXT)
    args = [target, root / ".swap-link", root / ".swap-plain", tmp_path / "passwd"]
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, *map(str, args), str(tmp_path / "text")],
        stdout=subprocess.PIPE,
        text=True,
    )
    read = refusals = 0
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                corpus = load_corpus("swap.txt", root=str(root))
            except CorpusError as exc:
                assert "'swap.txt'" in exc.reason and "symbolic link" in exc.reason, exc.reason
                refusals += 1
                continue
            tokens = bytes(corpus.train.astype("uint8")) + bytes(corpus.val.astype("uint8"))
            assert tokens == TEXT  # never the link's target
            read += 1
    finally:
        swapper.send_signal(signal.SIGINT)
        out, _ = swapper.communicate(timeout=30)
    swaps = int(out.split()[-1])
    assert swaps > 20 and read > 0 and refusals > 0, (swaps, read, refusals)


def test_a_link_at_any_component_is_refused(root: Path, tmp_path: Path) -> None:
    (root / "inside.txt").symlink_to(root / "plays.txt")  # even one that stays inside
    refused(root, "inside.txt", "'inside.txt'", "symbolic link")
    (root / "shelf").symlink_to(root / "plays")
    refused(root, "shelf/act1.txt", "'shelf'", "symbolic link")
    (root / "plays" / "out.txt").symlink_to(tmp_path / "passwd")
    refused(root, "plays", "'plays/out.txt'", "symbolic link")  # a link inside a folder


@pytest.mark.parametrize(
    "source", ["../passwd", "plays/../../passwd", "/etc/passwd", "", ".", "./"]
)
def test_a_path_that_leaves_the_root_is_refused_by_its_text(root: Path, source: str) -> None:
    refused(root, source, "inside the data folder")


@pytest.mark.timeout(30)  # opening a FIFO for reading blocks: a regression fails, not hangs
def test_what_is_not_a_regular_file_is_refused(root: Path) -> None:
    os.mkfifo(root / "pipe.txt")
    refused(root, "pipe.txt", "'pipe.txt'", "not a regular file")
    refused(root, "pipe.txt", "'pipe.txt'", "not a regular file", token_dtype="uint16")
    os.mkfifo(root / "plays" / "pipe")
    refused(root, "plays", "'plays/pipe'", "not a regular file")
    refused(root, "plays", "'plays'", "folder", token_dtype="uint16")
    refused(root, "plays.txt/act1.txt", "'plays.txt'", "not a folder")
    refused(root, "missing.txt", "'missing.txt'", "does not exist")
