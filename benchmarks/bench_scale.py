"""Whole-pipeline scale benchmark: wall time and peak memory per stage of curate_dataset.py.

    .venv/bin/python benchmarks/bench_scale.py --docs 1000000 [--plots] [--model demo/SmolLM2-135M]

Builds a synthetic JSONL of ``--docs`` records by cutting the demo corpus (real stdlib text)
into pieces of 200-2000 characters, source-grouped, then runs the real script in a
subprocess and reports each stage's time and the peak resident memory after it (from the
metadata), next to the size of the embedding matrix, which is the floor any run must hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def build_corpus(source: Path, target: Path, docs: int, seed: int = 0) -> int:
    texts = [json.loads(line)["text"] for line in source.read_text().splitlines()]
    rng = np.random.default_rng(seed)
    written = 0
    with open(target, "w") as out:
        while written < docs:
            for text in texts:  # source order: grouped by module, the "bad" order
                if written >= docs:
                    break
                size = int(rng.integers(200, 2000))
                start = int(rng.integers(0, max(1, len(text) - size)))
                out.write(json.dumps({"text": text[start : start + size], "id": written}) + "\n")
                written += 1
    return target.stat().st_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--corpus", type=Path, default=ROOT / "demo" / "stdlib.jsonl")
    p.add_argument("--model", type=Path, default=ROOT / "demo" / "SmolLM2-135M")
    p.add_argument("--work", type=Path, default=Path("/tmp/diversity_order_bench"))
    p.add_argument("--plots", action="store_true", help="also draw the plots (UMAP on a sample + transform)")
    p.add_argument("--extra", nargs="*", default=[], help="extra curate_dataset.py flags")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = args.work / f"synthetic_{args.docs}.jsonl"
    if not data.exists():
        started = time.perf_counter()
        size = build_corpus(args.corpus, data, args.docs)
        print(f"built {data} ({size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s", flush=True)
    out = args.work / f"synthetic_{args.docs}_curated.jsonl"
    cmd = [sys.executable, str(ROOT / "curate_dataset.py"), "--input", str(data), "--output", str(out),
           "--model-dir", str(args.model), "--seq-len", "131072", "--no-progress", *args.extra]
    if not args.plots:
        cmd.append("--no-plot")
    started = time.perf_counter()
    subprocess.run(cmd, check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    wall = time.perf_counter() - started
    meta = json.loads(Path(str(out).replace(".jsonl", "_meta.json")).read_text())
    embeddings_mb = meta["input_count"] * 576 * 4 / 2**20
    print(f"\n{meta['input_count']:,} documents, {meta['total_tokens']:,} tokens, "
          f"{data.stat().st_size / 1e9:.2f} GB JSONL, wall {wall:.0f} s; embeddings matrix {embeddings_mb:.0f} MB")
    print("| stage | seconds | peak RSS after (MB) |\n|---|---|---|")
    for stage, seconds in meta["timings_seconds"].items():
        print(f"| {stage} | {seconds:.1f} | {meta['peak_rss_mb'][stage]:.0f} |")
    d = meta["token_window_diversity"]
    print(f"diversity per 131072-token window: {d['original']['mean']} -> {d['curated']['mean']}")


if __name__ == "__main__":
    main()
