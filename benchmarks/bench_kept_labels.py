"""An unchanged rerun's clustering: fitting k-means again vs keeping the labels (``B_kmeans.npy``).

    .venv/bin/python benchmarks/bench_kept_labels.py [--n 1000000] [--k 30] [--repeats 3]

The rows are real SmolLM2 shallow embeddings of the demo corpus, resampled with small noise to ``--n`` rows
(as ``bench_cluster.py`` makes them), held as a ``.npy`` file read in blocks: what a run clusters when the
embeddings come from their cache. Times, in one process: the fit a run without kept labels makes
(``clustering.kmeans_labels``, the exact path: the file loaded, then MiniBatchKMeans), and what a rerun with kept
labels does instead (the key, i.e. a digest of every byte of the file, then the cache lookup). Each is repeated;
the table gives the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_cluster import resampled_embeddings  # noqa: E402 (this folder, the script's own)

from diversity_order import caches, clustering, matrix  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--k", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--embeddings", type=Path, default=ROOT / "demo" / "out" / "stdlib_curated_embeddings.npy")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_kept_labels.json")
    args = p.parse_args()
    x = resampled_embeddings(args.embeddings, args.n)
    dim = x.shape[1]
    fingerprints = np.random.default_rng(1).integers(1, 2**63, args.n, dtype=np.int64).astype(np.uint64)
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as folder:
        path = Path(folder) / "b_embeddings.npy"
        np.save(path, x)
        del x
        embeddings = matrix.MatrixFile.open(path)
        kept = Path(folder) / "b_kmeans.npy"
        fit_s, keep_s = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            labels = clustering.kmeans_labels(embeddings, args.k, 42)
            fit_s.append(time.perf_counter() - started)
            key = clustering.labels_key(embeddings, fingerprints, args.k, 42, "sklearn", 0)
            caches.store(kept, key, fingerprints, labels)
            started = time.perf_counter()
            key = clustering.labels_key(embeddings, fingerprints, args.k, 42, "sklearn", 0)
            found = caches.lookup(kept, key, fingerprints, dtype=np.int64, row_shape=())
            reused = clustering.kept_labels(found, args.k)
            keep_s.append(time.perf_counter() - started)
            assert reused is not None and np.array_equal(reused, labels)
    row = {"n": args.n, "k": args.k, "dim": int(dim), "repeats": args.repeats,
           "fit_seconds_median": round(statistics.median(fit_s), 2), "fit_seconds": [round(s, 2) for s in fit_s],
           "kept_seconds_median": round(statistics.median(keep_s), 2), "kept_seconds": [round(s, 2) for s in keep_s]}
    row["fit_over_kept"] = round(row["fit_seconds_median"] / max(row["kept_seconds_median"], 1e-9), 1)
    print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
