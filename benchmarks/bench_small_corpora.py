"""`paced` on small corpora (a few thousand documents, a window a percent of the tokens): seeded samples of
labelled corpora and synthetic small corpora, against `stratified` and random shuffles, with rules 3-4
walking from both ends (the package's `paced`) and in one pass from the start (as before 2026-11-26).

    .venv/bin/python benchmarks/bench_small_corpora.py --corpora CORPORA \
        [--only stdlib-tests mix-b ...] [--docs 2000] [--draws 1] [--seq-lens 2048 4096 16384] [--synthetic 8]
    .venv/bin/python benchmarks/bench_small_corpora.py --corpus chat LABELS_NPY COUNTS_NPY --docs 0

Each cell (corpus sample x seq-len x packing) gets the D, U and B verdicts of
``ordering_report.criteria`` for both variants (seed 42; B's random baseline is the mean of 5 shuffles),
printed per cell and counted at the end. ``--docs 0`` takes the corpus whole. ``--synthetic N`` adds N
small corpora of 2,000 documents (Zipf cluster sizes, log-normal lengths up to 720 tokens) and reports,
over 8 seeds of `paced` at 2,048 tokens, how many runs meet B in each variant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_ordering_quality as quality  # noqa: E402
import eval_corpora  # noqa: E402

from diversity_order import diversity  # noqa: E402
from diversity_order.orderings import ORDERINGS, OrderingOptions, paced  # noqa: E402
from diversity_order.packing import packing_model  # noqa: E402

K = 30
SHUFFLES = 5


def one_pass_greedy(labels, token_counts, n_clusters, options=None, clear_ends=False, stream_tokens=None):
    """Rules 1-4 with rules 3-4 in one pass from the start: ``paced._paced`` over all pools (after rule
    10's move where asked)."""
    options = options or OrderingOptions()
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    members, pool_starts = paced.paced_pools(labels, counts, n_clusters, options.seed)
    if clear_ends:
        cleared = paced.ends_cleared(members, pool_starts, counts, int(options.seq_len), stream_tokens)
        members = members if cleared is None else cleared
    member_counts = counts[members]
    running = np.concatenate(([0], np.cumsum(member_counts)))
    seq_len = int(options.seq_len)
    return paced._paced(members, pool_starts, member_counts, paced._due_positions(pool_starts, member_counts),
                        running[pool_starts[1:]] - running[pool_starts[:-1]], seq_len, packing_model(options.packing),
                        paced.windows_saturated(labels.size, seq_len, n_clusters, int(running[-1])), seq_len)


def paced_variant(both_ends: bool, labels, counts, seq_len, packing, seed=42):
    """The `paced` ordering, its rules 3-4 from both ends (the package's) or in one pass."""
    original = paced.paced_greedy_order
    if not both_ends:
        paced.paced_greedy_order = one_pass_greedy
    try:
        return ORDERINGS["paced"](labels, counts, K, OrderingOptions(seq_len=seq_len, packing=packing, seed=seed))
    finally:
        paced.paced_greedy_order = original


def cells(name, labels, counts, seq_lens, totals):
    shuffles = [np.random.default_rng(s).permutation(labels.size) for s in range(SHUFFLES)]
    for seq_len in seq_lens:
        for packing in ("whole", "split"):
            randoms = [quality.window_metrics(labels, counts, K, seq_len, packing, o) for o in shuffles]
            random_mean = {m: float(np.mean([r[m] for r in randoms])) for m in randoms[0]}
            options = OrderingOptions(seq_len=seq_len, packing=packing, seed=42)
            stratified = quality.window_metrics(labels, counts, K, seq_len, packing,
                                                ORDERINGS["stratified"](labels, counts, K, options))
            line = []
            for both_ends in (False, True):
                metrics = quality.window_metrics(labels, counts, K, seq_len, packing,
                                                 paced_variant(both_ends, labels, counts, seq_len, packing))
                verdict = quality.verdict(metrics, stratified, random_mean)
                for c in "DUB":
                    totals[both_ends][c] += verdict[c]
                totals[both_ends]["cells"] += 1
                line.append(f"{'both ends' if both_ends else 'one pass '} D {metrics['diversity'] - stratified['diversity']:+.2f}"
                            f" U {metrics['uniformity'] / random_mean['uniformity']:.2f}"
                            f" B {metrics['boundary_shift'] / random_mean['boundary_shift']:.2f} "
                            + "".join(c if verdict[c] else "-" for c in "DUB"))
            print(f"{name:24s} {seq_len:7,d} {packing:5s} windows {stratified['windows']:5d} | " + " | ".join(line),
                  flush=True)


def synthetic_b(n_corpora: int) -> None:
    met = {False: 0, True: 0}
    runs = 0
    for corpus_seed in range(n_corpora):
        rng = np.random.default_rng(corpus_seed)
        sizes = rng.zipf(1.6, K).astype(np.float64)
        labels = rng.choice(K, 2000, p=sizes / sizes.sum()).astype(np.int64)
        counts = np.minimum(rng.lognormal(4.2, 0.9, 2000), 720).astype(np.int64) + 5
        random_shift = np.mean([diversity.boundary_shift(labels, counts, np.random.default_rng(s).permutation(2000), K)
                                for s in range(20)])
        for packing in ("whole", "split"):
            for seed in range(8):
                runs += 1
                for both_ends in (False, True):
                    order = paced_variant(both_ends, labels, counts, 2048, packing, seed)
                    met[both_ends] += diversity.boundary_shift(labels, counts, order, K) <= 0.5 * random_shift
    print(f"synthetic small corpora ({n_corpora} x 2 packings x 8 seeds = {runs} runs at 2,048): B met in "
          f"{met[False]} with one pass, {met[True]} from both ends")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", type=Path, help="folder of labelled corpora (eval_corpora.py all)")
    p.add_argument("--only", nargs="*", default=list(quality.HELD_OUT_CORPORA), help="corpora of --corpora to sample")
    p.add_argument("--corpus", nargs=3, action="append", default=[], metavar=("NAME", "LABELS", "COUNTS"),
                   help="another labelled corpus: its labels and token counts (.npy)")
    p.add_argument("--docs", type=int, default=2000, help="documents per sample (0: the whole corpus)")
    p.add_argument("--draws", type=int, default=1, help="samples per corpus")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 4096, 16384])
    p.add_argument("--synthetic", type=int, default=0, help="synthetic small corpora for the B count")
    args = p.parse_args()
    corpora = []
    if args.corpora is not None:
        corpora += [(name, *eval_corpora.load(args.corpora, name)) for name in args.only]
    corpora += [(name, np.load(labels), np.load(counts)) for name, labels, counts in args.corpus]
    totals = {False: dict.fromkeys("DUB", 0) | {"cells": 0}, True: dict.fromkeys("DUB", 0) | {"cells": 0}}
    for name, labels, counts in corpora:
        counts = np.asarray(counts, dtype=np.int64)
        for draw in range(args.draws if args.docs else 1):
            if args.docs and labels.size > args.docs:
                rows = np.sort(np.random.default_rng(1000 + draw).choice(labels.size, args.docs, replace=False))
                cells(f"{name} [{args.docs} #{draw}]", labels[rows], counts[rows], args.seq_lens, totals)
            else:
                cells(name, labels, counts, args.seq_lens, totals)
    for both_ends in (False, True):
        t = totals[both_ends]
        if t["cells"]:
            print(f"{'both ends' if both_ends else 'one pass'}: of {t['cells']} cells D {t['D']}, U {t['U']}, B {t['B']}")
    if args.synthetic:
        synthetic_b(args.synthetic)


if __name__ == "__main__":
    main()
