"""Compare every applicable ordering on one dataset (``--compare-strategies``): a strategy table for the user's data.

For each ``seq_len`` and each ordering: unique clusters per window (mean/min/std), token-share
uniformity (mean/max over windows), epoch-boundary shift, coverage and the ordering's run time.
Written as Markdown (also printed), JSON and a PNG of per-window diversity curves.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from . import diversity
from .atomic import atomic_open, save_json
from .orderings import ORDERINGS, SPECS, OrderingOptions

log = logging.getLogger(__name__)


def compare_strategies(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, seq_lens: list[int],
                       options: OrderingOptions, names: list[str]) -> tuple[list[dict], dict]:
    """Run each ordering at each ``seq_len``; return (table rows, {(name, seq_len): per-window diversity})."""
    rows: list[dict] = []
    curves: dict = {}
    computed: dict[str, tuple[np.ndarray, float]] = {}
    for seq_len in seq_lens:
        for name in names:
            if name in computed and not SPECS[name].seq_len_aware:  # computed once
                order, seconds = computed[name]
            else:
                warm = min(labels.size, 64)  # numba compiles on first call: keep that out of the timing
                warm_options = replace(options, seq_len=seq_len,
                                       scores=None if options.scores is None else options.scores[:warm],
                                       balance_groups=None if options.balance_groups is None
                                       else options.balance_groups[:warm])
                ORDERINGS[name](labels[:warm], token_counts[:warm], n_clusters, warm_options)
                started = time.perf_counter()
                order = ORDERINGS[name](labels, token_counts, n_clusters, replace(options, seq_len=seq_len))
                seconds = time.perf_counter() - started
                computed[name] = (order, seconds)
            windows = diversity.window_counts(labels, token_counts, seq_len, order, options.packing)
            curves[(name, seq_len)] = windows[0]
            quality = diversity.ordering_quality(labels, token_counts, seq_len, order, n_clusters, windows,
                                                 options.packing)
            rows.append({"seq_len": seq_len, "ordering": name, "seconds": round(seconds, 3), **quality})
        log.info("Compared %d orderings at seq-len %s", len(names), f"{seq_len:,}")
    return rows, curves


def verdicts(rows: list[dict]) -> dict[int, list[str]]:
    """Per seq_len, the orderings that match or beat stratified on mean unique clusters AND beat
    the random shuffle on mean uniformity AND on boundary shift."""
    out: dict[int, list[str]] = {}
    for seq_len in sorted({r["seq_len"] for r in rows}):
        at = {r["ordering"]: r for r in rows if r["seq_len"] == seq_len}
        if "stratified" not in at or "random" not in at:
            continue
        strat, rand = at["stratified"], at["random"]
        out[seq_len] = [name for name, r in at.items() if name not in ("stratified", "random")
                        and r["diversity"]["mean"] >= strat["diversity"]["mean"]
                        and r["uniformity_mean"] < rand["uniformity_mean"]
                        and r["boundary_shift"] < rand["boundary_shift"]]
    return out


def markdown_table(rows: list[dict], n_clusters: int, title: str, options: dict | None = None) -> str:
    lines = [f"# Ordering strategies: {title}", "",
             f"K = {n_clusters} clusters. Diversity: unique clusters per packed window (higher is better). "
             "Uniformity: per window, the largest |cluster token share - global share| (lower is better). "
             "Shift: total-variation distance between the cluster mix of the first and last 5% of tokens "
             "(lower is better). Coverage: fraction of tokens before the last cluster first appears "
             "(lower is better). Time: the ordering's run time (compiled code warmed up first); orderings that do "
             "not depend on the sequence length run once and show that time at every length.", ""]
    if options:
        shown = ", ".join(f"{k}={v}" for k, v in options.items() if v not in (None, [], ()))
        lines += [f"Options: {shown}.", ""]
    wins = verdicts(rows)
    for seq_len in sorted({r["seq_len"] for r in rows}):
        lines += [f"## seq-len {seq_len:,}", "",
                  "| ordering | diversity mean | min | std | uniformity mean | uniformity max | boundary shift "
                  "| coverage | time (s) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["seq_len"] == seq_len):
            d = r["diversity"]
            lines.append(f"| {r['ordering']} | {d['mean']:.2f} | {d['min']} | {d['std']:.2f} | {r['uniformity_mean']:.4f} "
                         f"| {r['uniformity_max']:.4f} | {r['boundary_shift']:.4f} | {r['coverage']:.4f} "
                         f"| {r['seconds']:.2f} |")
        if seq_len in wins:
            names = ", ".join(wins[seq_len]) or "none"
            lines += ["", f"At least as diverse as stratified and more uniform, with less boundary shift, than "
                          f"random: {names}."]
        lines.append("")
    return "\n".join(lines)


def report_paths(stem: Path) -> dict[str, Path]:
    return {"markdown": Path(f"{stem}_strategies.md"), "json": Path(f"{stem}_strategies.json"),
            "plot": Path(f"{stem}_strategies.png")}


def write_report(stem: Path, rows: list[dict], curves: dict, n_clusters: int, title: str, options: dict | None = None,
                 plot: bool = True) -> tuple[dict[str, Path], str]:
    """Write ``stem_strategies.md``, ``.json`` and (with ``plot``) ``.png``; return (the paths written, the table)."""
    from .plots import plot_strategy_curves

    paths = report_paths(stem)
    if not plot:
        del paths["plot"]
    table = markdown_table(rows, n_clusters, title, options)
    with atomic_open(paths["markdown"], "w") as handle:
        handle.write(table)
    save_json(paths["json"], {"title": title, "n_clusters": n_clusters, "options": options or {}, "rows": rows,
                              "winners": {str(k): v for k, v in verdicts(rows).items()}})
    if plot:
        plot_strategy_curves(paths["plot"], curves, n_clusters, title)
    return paths, table
