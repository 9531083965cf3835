"""A tried-and-dropped idea for token-share uniformity (U): pairing large documents after `paced`.

    .venv/bin/python benchmarks/bench_pairing.py --corpora CORPORA [mix-b files packages]

Packing whole, at 4,096 and 16,384 tokens, takes `paced`'s order (seed 42) and moves each document
of at least theta x seq-len tokens (and at most seq-len) next to the previous such document when
their clusters differ, both fit in one window, and they lie within `reach` windows of each other
(theta 0.2 / 0.3, reach 4 / 16). Prints D (unique clusters per window), U / random and B / random
(random: the mean of 3 seeded shuffles) for `paced` and each variant. BENCHMARKS.md, "Why `paced`
misses U where it does", has the result: U barely moves, D falls.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import eval_corpora  # noqa: E402
from bench_ordering_quality import SEED, window_metrics  # noqa: E402

from diversity_order.orderings import ORDERINGS, OrderingOptions  # noqa: E402


def paired(order: np.ndarray, labels: np.ndarray, counts: np.ndarray, seq_len: int, theta: float,
           reach: int) -> np.ndarray:
    """``order`` with each large document moved right after the previous large one it can pair with."""
    tokens = counts[order]
    ends = np.cumsum(tokens)
    large = np.flatnonzero((tokens >= theta * seq_len) & (tokens <= seq_len))
    follower, moved = {}, np.zeros(order.size, dtype=bool)
    i = 0
    while i < large.size - 1:
        a, b = large[i], large[i + 1]
        if (labels[order[a]] != labels[order[b]] and tokens[a] + tokens[b] <= seq_len
                and ends[b] - ends[a] <= reach * seq_len):
            follower[a], moved[b] = b, True
            i += 2
        else:
            i += 1
    out = []
    for position in range(order.size):
        if not moved[position]:
            out.append(order[position])
            if position in follower:
                out.append(order[follower[position]])
    return np.asarray(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", type=Path, required=True, help="eval_corpora.py's output folder")
    p.add_argument("names", nargs="*", default=["mix-b", "files", "packages"])
    args = p.parse_args()
    for name in args.names:
        labels, counts = eval_corpora.load(args.corpora, name)
        k = int(labels.max()) + 1
        for seq_len in (4096, 16384):
            base = ORDERINGS["paced"](labels, counts, k, OrderingOptions(seq_len=seq_len, packing="whole", seed=SEED))
            shuffles = [window_metrics(labels, counts, k, seq_len, "whole", np.random.default_rng(s).permutation(labels.size))
                        for s in range(3)]
            u_random = np.mean([m["uniformity"] for m in shuffles])
            b_random = np.mean([m["boundary_shift"] for m in shuffles])

            def row(order, labels=labels, counts=counts, k=k, seq_len=seq_len, u=u_random, b=b_random):
                m = window_metrics(labels, counts, k, seq_len, "whole", order)
                return f"D {m['diversity']:.2f} U {m['uniformity'] / u:.3f} B {m['boundary_shift'] / b:.3f}"

            line = f"{name} {seq_len}: paced {row(base)}"
            for theta in (0.2, 0.3):
                for reach in (4, 16):
                    order = paired(base, labels, counts, seq_len, theta, reach)
                    assert np.array_equal(np.sort(order), np.arange(labels.size))
                    line += f" | theta {theta} reach {reach}: {row(order)}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
