"""Train a small job on a JSON Lines corpus with a byte-level BPE of 2,048 ids, submitted and
read through the Python client.

    .venv/bin/depthscope serve --port 8000 &        # the service; its data folder:
                                                    # DEPTHSCOPE_DATA_DIR (default depthscope-data)
    .venv/bin/python examples/corpus_bpe.py [URL [DATA_DIR]]

Writes `stdlib.jsonl` into the service's data folder (one record per standard-library
module, its source in the `text` field: the built-in corpus as records), submits a job whose
`training.tokenizer` is `{kind: bpe, vocab_size: 2048}` (the workers train the tokenizer on
the training records only), waits, and prints each trial's loss in nats per token and in bits
per byte (`val_bpb`, the one comparable across tokenizers), its parameters as the cost model
counts them with the 2,048-row embedding, and the corpus identity the runs recorded."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from nas_service import Client, ClientError
from workers.data import stdlib_documents

SPEC = {
    "name": "bpe-2048-jsonl",
    "space": {
        "n_layers": [2],
        "d_model": [64, 128],
        "head_dim": 32,
        "variants": ["baseline", "block_attnres"],
        "block_sizes": [1],
    },
    "budget": {"tokens": 16 * 64 * 60},
    "objectives": ["val_bpb"],
    "sampler": "grid",
    "pruner": "none",
    "n_trials": 4,
    "max_concurrent": 2,
    "training": {
        "corpus": "stdlib.jsonl",
        "tokenizer": {"kind": "bpe", "vocab_size": 2048},
        "seq_len": 64,
        "batch_size": 16,
        "n_evals": 4,
        "threads": 1,
    },
    "cost": {"hardware": "cpu"},
}


def write_corpus(data_dir: Path, max_bytes: int = 2 * 2**20) -> Path:
    """The built-in corpus's documents as JSON Lines records (`text`, `path`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "stdlib.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for doc in stdlib_documents(max_bytes):
            f.write(json.dumps({"text": doc.data.decode(), "path": doc.doc_id}) + "\n")
    return path


def main(url: str | None = None, data_dir: str = "depthscope-data") -> int:
    corpus = write_corpus(Path(data_dir))
    print(f"wrote {corpus.name}: {corpus.stat().st_size / 2**20:.1f} MiB")
    with Client(url) as client:
        try:
            job = client.submit(SPEC)
        except ClientError as exc:
            print(f"refused: {exc.field}: {exc.message}", file=sys.stderr)
            return 1
        done = job.wait(progress=True)
        print(f"job {done.id}: {done.status.value}, {done.progress.counted} trials")
        trials = job.trials()
        print(
            f"{'#':>2} {'variant':<14} {'L':>2} {'d':>4} {'params':>8} "
            f"{'val_loss':>8} {'val_bpb':>7}"
        )
        for t in trials.items:
            m = t.metrics
            loss, bpb = m.get("val_loss") or math.nan, m.get("val_bpb") or math.nan
            print(
                f"{t.number:>2} {t.variant:<14} {t.arch.get('n_layers')!s:>2} "
                f"{t.arch.get('d_model')!s:>4} {m.get('params', 0):>8.0f} "
                f"{loss:>8.4f} {bpb:>7.4f}"
            )
        corpus_id = trials.items[0].train[0].corpus if trials.items else None
        print(f"corpus: {corpus_id}")
    return 0 if done.status.value == "completed" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
