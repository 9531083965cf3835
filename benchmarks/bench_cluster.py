"""k-means at scale: scikit-learn MiniBatchKMeans (the reference) vs faiss and torch Lloyd.

    .venv/bin/python benchmarks/bench_cluster.py [--n 1000000] [--k 30] [--embeddings demo/out/stdlib_curated_embeddings.npy]
                                                 [--device cuda]   # the torch backend on a GPU (default: cpu)

The rows are real SmolLM2 shallow embeddings of the demo corpus, resampled with small noise to
``--n`` rows and re-normalised, so the cluster structure is that of real text. Reports time and
inertia (sum of squared distances to the cluster means; lower is better) for each backend.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diversity_order.clustering import inertia, kmeans_labels  # noqa: E402


def resampled_embeddings(path: Path, n: int, seed: int = 0) -> np.ndarray:
    """``n`` rows drawn from the embeddings at ``path`` with small noise, re-normalised (float32): real text's
    cluster structure at any size."""
    base = np.load(path)
    rng = np.random.default_rng(seed)
    x = base[rng.integers(0, base.shape[0], n)] + rng.normal(0, 0.01, (n, base.shape[1])).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--k", type=int, default=30)
    p.add_argument("--embeddings", type=Path, default=ROOT / "demo" / "out" / "stdlib_curated_embeddings.npy")
    p.add_argument("--backends", nargs="*", default=["sklearn", "faiss", "torch"])
    p.add_argument("--fit-sample", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the torch backend runs: cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_cluster.json")
    args = p.parse_args()
    x = resampled_embeddings(args.embeddings, args.n)
    if args.device != "cpu" and "torch" in args.backends:
        import torch

        torch.zeros(1, device=args.device)  # the CUDA context starts outside the timed fit
    rows = []
    for backend in args.backends:
        started = time.perf_counter()
        device = args.device if backend == "torch" else "cpu"
        labels = kmeans_labels(x, args.k, 42, backend, args.fit_sample, device=None if device == "cpu" else device)
        seconds = time.perf_counter() - started
        row = {"backend": backend, "device": device, "n": args.n, "k": args.k, "fit_sample": args.fit_sample,
               "seconds": round(seconds, 1), "inertia": round(inertia(x, labels, args.k), 1)}
        rows.append(row)
        print(row, flush=True)
    reference = rows[0]
    for row in rows:
        row["speedup_vs_first"] = round(reference["seconds"] / row["seconds"], 2)
        row["inertia_vs_first"] = round(row["inertia"] / reference["inertia"], 4)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
