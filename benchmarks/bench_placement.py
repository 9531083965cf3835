"""Placing points among the UMAP sample (``projection.place_by_neighbours``) against the form it replaced.

    .venv/bin/python benchmarks/bench_placement.py [--points 100000] [--anchors 10000] [--dim 50] [--rounds 3]

Every record beyond the 10,000 UMAP is fitted on is placed at the distance-weighted mean of its 10 nearest fitted
points (after the plot's PCA to 50 dimensions); at 1M records that is most of the cluster cloud's time after the fit.
The baseline is the earlier form, kept here: the whole squared distance (five passes over each batch x anchors
block) before choosing the nearest. Both run in this process on the same random points, alternating; the table
gives each one's median and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diversity_order.projection import place_by_neighbours  # noqa: E402


def earlier_form(points, anchors, anchor_xy, k=10, batch=2048):
    k = min(k, anchors.shape[0])
    anchor_sq = (anchors * anchors).sum(1)
    out = np.empty((points.shape[0], 2), dtype=np.float32)
    for lo in range(0, points.shape[0], batch):
        chunk = points[lo : lo + batch]
        dist_sq = np.maximum(anchor_sq[None, :] - 2 * chunk @ anchors.T + (chunk * chunk).sum(1)[:, None], 0)
        nearest = np.argpartition(dist_sq, k - 1, axis=1)[:, :k]
        weights = 1.0 / (np.sqrt(np.take_along_axis(dist_sq, nearest, axis=1)) + 1e-6)
        out[lo : lo + batch] = (anchor_xy[nearest] * weights[:, :, None]).sum(1) / weights.sum(1, keepdims=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", type=int, default=100_000)
    p.add_argument("--anchors", type=int, default=10_000)
    p.add_argument("--dim", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_placement.json")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    anchors = rng.standard_normal((args.anchors, args.dim), dtype=np.float32)
    xy = rng.standard_normal((args.anchors, 2), dtype=np.float32)
    points = rng.standard_normal((args.points, args.dim), dtype=np.float32)
    seconds = {"earlier": [], "now": []}
    for round_ in range(args.rounds):
        pair = [("earlier", earlier_form), ("now", place_by_neighbours)]
        for name, place in pair if round_ % 2 == 0 else pair[::-1]:
            started = time.perf_counter()
            place(points, anchors, xy)
            seconds[name].append(round(time.perf_counter() - started, 2))
    row = {"points": args.points, "anchors": args.anchors, "dim": args.dim, "seconds": seconds,
           "earlier_median": statistics.median(seconds["earlier"]), "now_median": statistics.median(seconds["now"])}
    row["speedup"] = round(row["earlier_median"] / row["now_median"], 2)
    print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
