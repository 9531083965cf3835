"""Where long documents sit along an order: a length curriculum no criterion (D, U, B) sees.

    .venv/bin/python benchmarks/bench_length_position.py --corpora CORPORA [--seq-len 4096] [--packing split]
        [--out benchmarks/results_length_position.json]

For the demo and every real evaluation corpus (built and labelled by eval_corpora.py): the documents over
max(1,024 tokens, the 99th percentile of token counts) are "long"; for random (seed 42), stratified and
paced (seed 42), the share of the long documents' tokens in each tenth of the order (by the token offset of
each document's middle), and its total-variation distance from an even spread (0: long documents sit
anywhere; 0.8: all in one tenth). Prints one row per corpus: each ordering's distance, and the share of the
middle fifth (tenths 5 and 6) under paced and random.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import eval_corpora  # noqa: E402

from diversity_order.orderings import ORDERINGS, OrderingOptions  # noqa: E402

ORDERS = ("random", "stratified", "paced")
LONG_AT_LEAST = 1024  # tokens; or the 99th percentile where that is more


def tenths(counts: np.ndarray, order: np.ndarray, long: np.ndarray) -> np.ndarray:
    """The share of the long documents' tokens in each tenth of the token stream of ``order``."""
    tokens = counts[order].astype(np.float64)
    middle = np.cumsum(tokens) - tokens / 2
    tenth = np.minimum((middle / tokens.sum() * 10).astype(np.int64), 9)
    chosen = long[order]
    weights = np.bincount(tenth[chosen], weights=tokens[chosen], minlength=10)
    return weights / max(weights.sum(), 1e-12)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", type=Path, required=True, help="eval_corpora.py's output folder")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--packing", choices=("split", "whole"), default="split")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_length_position.json")
    args = p.parse_args()
    options = OrderingOptions(seq_len=args.seq_len, packing=args.packing, seed=42)
    print("| corpus | long documents | " + " | ".join(f"{o} TV" for o in ORDERS)
          + " | paced, middle fifth | random, middle fifth |\n|---|---:|" + "---:|" * (len(ORDERS) + 2))
    results = []
    for name in ("demo", *eval_corpora.CORPORA):
        labels, counts = eval_corpora.load(args.corpora, name)
        long = counts > max(LONG_AT_LEAST, np.percentile(counts, 99))
        if not long.any():
            continue
        k = int(labels.max()) + 1
        shares = {o: tenths(counts, ORDERINGS[o](labels, counts, k, options), long) for o in ORDERS}
        distance = {o: float(0.5 * np.abs(share - 0.1).sum()) for o, share in shares.items()}
        print(f"| {name} | {int(long.sum()):,} | " + " | ".join(f"{distance[o]:.2f}" for o in ORDERS)
              + f" | {shares['paced'][4:6].sum():.0%} | {shares['random'][4:6].sum():.0%} |", flush=True)
        results.append({"corpus": name, "seq_len": args.seq_len, "packing": args.packing, "long_documents":
                        int(long.sum()), "distance": distance, "tenths": {o: s.tolist() for o, s in shares.items()}})
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
