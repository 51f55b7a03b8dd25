"""Corpus loading throughput and tokenizer training time on the built-in corpus.

The built-in corpus's documents (the standard library's sources) are written once as a text
folder (one file per module) and as JSON Lines (one record per module; Parquet too when
pyarrow is installed), then each is loaded with `workers.data.load_corpus` in interleaved
rounds, side by side: MB/s of text read, split and tokenised at the byte level. Then the
byte-level BPE (`workers.tokenizer`) is trained on the train split at each vocabulary size,
from a cold cache: seconds to train and to encode both splits, and the compression (bytes
per token).

    python bench/corpora.py [--mb 8 --rounds 3 --vocab 2048 8192] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers import tokenizer
from workers.data import load_corpus, stdlib_documents


def write_formats(folder: Path, max_bytes: int) -> dict[str, str]:
    """The built-in documents as a text folder, JSON Lines and (with pyarrow) Parquet."""
    docs = stdlib_documents(max_bytes)
    text = folder / "text"
    for d in docs:
        path = text / d.doc_id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(d.data)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d.data.decode()}) + "\n")
    paths = {"text folder": "text", "jsonl": "corpus.jsonl"}
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": [d.data.decode() for d in docs]}), folder / "c.parquet")
        paths["parquet"] = "c.parquet"
    except ImportError:
        pass
    return paths


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=float, default=8.0, help="MiB of the built-in corpus")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = write_formats(root, int(args.mb * 2**20))
        seconds: dict[str, list[float]] = {name: [] for name in paths}
        sizes: dict[str, int] = {}
        for _ in range(args.rounds):  # interleaved: each round loads every format once
            for name, rel in paths.items():
                start = time.perf_counter()
                corpus = load_corpus(rel, root=str(root))
                seconds[name].append(time.perf_counter() - start)
                sizes[name] = corpus.info.n_tokens
        loading = {
            name: {
                "text_mb": sizes[name] / 1e6,
                "median_s": statistics.median(s),
                "mb_per_s": sizes[name] / 1e6 / statistics.median(s),
            }
            for name, s in seconds.items()
        }
        byte = load_corpus(paths["jsonl"], root=str(root))
        bpe: dict[str, Any] = {}
        os.environ[tokenizer.CACHE_ENV] = str(root / "cache")
        for vocab in args.vocab:
            tokenizer.forget_cached()
            start = time.perf_counter()
            corpus = load_corpus(
                paths["jsonl"], root=str(root), tokenizer="bpe", tokenizer_vocab=vocab
            )
            total = time.perf_counter() - start
            trained = next(iter(tokenizer._memory.values()))
            bpe[str(vocab)] = {
                "train_text_mb": byte.info.n_train_tokens / 1e6,
                "train_s": trained.train_seconds,
                "load_train_encode_s": total,
                "bytes_per_token": byte.info.n_tokens / corpus.info.n_tokens,
            }
    result = {"loading": loading, "bpe": bpe, "cpus": os.cpu_count()}
    for name, row in loading.items():
        print(
            f"load {name:<12} {row['text_mb']:.2f} MB in {row['median_s']:.3f} s: "
            f"{row['mb_per_s']:.1f} MB/s"
        )
    for vocab, row in bpe.items():
        print(
            f"bpe {vocab:>6}: trained in {row['train_s']:.2f} s on {row['train_text_mb']:.2f} MB, "
            f"load+train+encode {row['load_train_encode_s']:.2f} s, "
            f"{row['bytes_per_token']:.2f} bytes/token"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
