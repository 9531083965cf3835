"""Compare every applicable ordering on one dataset (``--compare-strategies``): a strategy table for the user's data.

For each ``seq_len`` and each ordering: unique clusters per window (mean/min/std) and their
efficiency against the bound, the sequences' fill (1 - padding), token-share uniformity (mean/max
over windows), epoch-boundary shift, coverage, the ordering's run time, and which of the three
criteria (``CRITERIA``: as diverse as stratified, clearly more uniform and less shifted than a random
shuffle) it meets.
Written as Markdown (also printed), JSON and a PNG of per-window diversity curves.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from . import diversity
from .atomic import atomic_open, save_json
from .orderings import ORDERINGS, SPECS, OrderingOptions
from .runtime import compile_seconds

log = logging.getLogger(__name__)


def compare_strategies(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, seq_lens: list[int],
                       options: OrderingOptions, names: list[str]) -> tuple[list[dict], dict]:
    """Run each ordering at each ``seq_len``; return (table rows, {(name, seq_len): per-window diversity})."""
    rows: list[dict] = []
    curves: dict = {}
    computed: dict[str, tuple[np.ndarray, float]] = {}
    for seq_len in seq_lens:
        # What the documents' lengths force on every order: how far the orderings' uniformity can still fall.
        bound = diversity.uniformity_lower_bound(labels, token_counts, seq_len, n_clusters, options.packing)
        measured = partial(_measured, labels, token_counts, seq_len, n_clusters, options)
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
                # A path the small warm-up did not take may still compile: its compile time is left out too.
                compiling = compile_seconds()
                started = time.perf_counter()
                order = ORDERINGS[name](labels, token_counts, n_clusters, replace(options, seq_len=seq_len))
                seconds = time.perf_counter() - started - (compile_seconds() - compiling)
                computed[name] = (order, seconds)
            windows = diversity.window_counts(labels, token_counts, seq_len, order, options.packing)
            curves[(name, seq_len)] = windows[0]
            quality = measured(order, windows)
            if name == "random":  # the criteria's baseline: the mean of several shuffles, the first of them this order
                quality = diversity.random_baseline(labels.size, options.seed, measured, first=quality)
            rows.append({"seq_len": seq_len, "ordering": name, "seconds": round(seconds, 3), **quality,
                         "uniformity_bound": bound})
        log.info("Compared %d orderings at seq-len %d", len(names), seq_len)
        most = max(int(r["diversity"]["n_sequences"]) for r in rows if r["seq_len"] == seq_len)
        if most < diversity.FEW_WINDOWS:
            log.warning("At seq-len %d no order makes more than %d window%s: the figures there rest on so few that "
                        "one document moved changes them", seq_len, most, "" if most == 1 else "s")
        random_row = next((r for r in rows if r["seq_len"] == seq_len and r["ordering"] == "random"), None)
        if random_row and uniformity_out_of_reach(bound, random_row["uniformity_mean"]):
            log.warning("At seq-len %d no order of these documents meets U (mean uniformity <= %g x a random "
                        "shuffle's %.4f): their lengths and clusters force at least %.4f", seq_len,
                        UNIFORMITY_RATIO, random_row["uniformity_mean"], bound)
    return rows, curves


def _measured(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, n_clusters: int, options: OrderingOptions,
              order: np.ndarray, windows: tuple | None = None) -> dict:
    """One order's row of measures: ``diversity.ordering_quality`` and the --balance-field ones."""
    return {**diversity.ordering_quality(labels, token_counts, seq_len, order, n_clusters, windows, options.packing),
            **_field_measures(token_counts, seq_len, order, options)}


def _field_measures(token_counts: np.ndarray, seq_len: int, order: np.ndarray, options: OrderingOptions) -> dict:
    """Each --balance-field's categories' token-share uniformity and boundary shift under ``order`` (as
    ``fields``), measured as the clusters' are; {} without one."""
    if options.balance_groups is None:
        return {}
    out = {}
    for column, field in enumerate(options.balance_fields):
        ids = options.balance_groups[:, column]
        q = diversity.ordering_quality(ids, token_counts, seq_len, order, int(ids.max()) + 1, packing=options.packing)
        out[field] = {"uniformity_mean": q["uniformity_mean"], "boundary_shift": q["boundary_shift"]}
    return {"fields": out}


def _field_tables(at: dict[str, dict]) -> list[str]:
    """Per --balance-field, each ordering's uniformity and shift of its categories, and their ratio to the
    random shuffle's (the field is only read by the orderings that say so)."""
    lines = []
    random_row = at.get("random", {})
    for field in next(iter(at.values())).get("fields", {}):
        lines += ["", f"Field '{field}' (its categories' token shares, as the clusters' above; lower is better; "
                      "x: against the random shuffles' mean):", "",
                  "| ordering | uniformity mean | x | boundary shift | x |", "|---|---:|---:|---:|---:|"]
        base = random_row.get("fields", {}).get(field)
        for name, row in at.items():
            q = row["fields"][field]
            ratios = [f"{q[m] / base[m]:.2f}" if base and base[m] > 0 else "-" for m in ("uniformity_mean",
                                                                                       "boundary_shift")]
            lines.append(f"| {name} | {q['uniformity_mean']:.4f} | {ratios[0]} | {q['boundary_shift']:.4f} | "
                         f"{ratios[1]} |")
    return lines


# The bar an ordering has to clear at each seq_len, against the default (stratified) and a random
# shuffle: D keeps stratified's clusters per window, U and B must beat a shuffle by a clear margin.
DIVERSITY_MARGIN = diversity.DIVERSITY_MARGIN  # D: mean unique clusters per window >= stratified's - this
UNIFORMITY_RATIO = 0.8  # U: mean token-share uniformity <= this x the random shuffle's
SHIFT_RATIO = 0.5  # B: boundary shift <= this x the random shuffle's
CRITERIA = (f"D: unique clusters per window >= stratified's - {DIVERSITY_MARGIN:g}; U: mean uniformity <= "
            f"{UNIFORMITY_RATIO:g} x random's; B: boundary shift <= {SHIFT_RATIO:g} x random's")


def criteria(diversity_mean: float, uniformity_mean: float, shift: float, stratified_diversity: float,
             random_uniformity: float, random_shift: float) -> dict[str, bool]:
    """Which of the three criteria (D, U, B; see CRITERIA) one ordering's means meet."""
    return {"D": diversity_mean >= stratified_diversity - DIVERSITY_MARGIN,
            "U": uniformity_mean <= UNIFORMITY_RATIO * random_uniformity,
            "B": shift <= SHIFT_RATIO * random_shift}


def row_criteria(rows: list[dict]) -> dict[int, dict[str, dict[str, bool]]]:
    """Per seq_len with both stratified and random rows and more than one window: each other ordering's criteria
    (see ``criteria``). In one window every order holds the same clusters and U is met by 0 <= 0: no verdict."""
    out: dict[int, dict[str, dict[str, bool]]] = {}
    for seq_len in sorted({r["seq_len"] for r in rows}):
        at = {r["ordering"]: r for r in rows if r["seq_len"] == seq_len}
        if "stratified" not in at or "random" not in at or _one_window(at):
            continue
        strat, rand = at["stratified"], at["random"]
        out[seq_len] = {name: criteria(r["diversity"]["mean"], r["uniformity_mean"], r["boundary_shift"],
                                       strat["diversity"]["mean"], rand["uniformity_mean"], rand["boundary_shift"])
                        for name, r in at.items() if name not in ("stratified", "random")}
    return out


def _one_window(at: dict[str, dict]) -> bool:
    return max(int(r["diversity"]["n_sequences"]) for r in at.values()) <= 1


def verdicts(rows: list[dict]) -> dict[int, list[str]]:
    """Per seq_len, the orderings that meet all three criteria (see ``criteria``)."""
    return {seq_len: [name for name, met in by_name.items() if all(met.values())]
            for seq_len, by_name in row_criteria(rows).items()}


# Rounding in sums of token shares: a bound this far above U's bar is the same figure (where every token fits in one
# window, both are 0 but for it, and an order the table shows meeting U was said to be out of reach).
BOUND_ROUNDING = 1e-9


def uniformity_out_of_reach(bound: float | None, random_uniformity: float | None) -> bool:
    """No order of the documents meets U: the lower bound on their mean uniformity is above U's bar."""
    return bound is not None and random_uniformity is not None and \
        bound > UNIFORMITY_RATIO * random_uniformity + BOUND_ROUNDING


def u_out_of_reach_by_length(rows: list[dict]) -> dict[int, bool]:
    """Per seq_len with a random row and a bound: whether no order of the documents can meet U there."""
    return {r["seq_len"]: uniformity_out_of_reach(r.get("uniformity_bound"), r["uniformity_mean"])
            for r in rows if r["ordering"] == "random" and r.get("uniformity_bound") is not None}


def _marks(met: dict[str, bool] | None, u_out_of_reach: bool = False) -> str:
    """"D U B" with each missed criterion marked, e.g. "D **U✗** B" ("**U✗** (out of reach)" where no order
    can meet U); "-" for stratified and random."""
    if not met:
        return "-"
    return " ".join(c if ok else f"**{c}✗**" + (" (out of reach)" if c == "U" and u_out_of_reach else "")
                    for c, ok in met.items())


def _fill(row: dict) -> str:
    return f"{row['fill']:.3f}" if "fill" in row else "-"  # rows read back from a report written before it existed


def markdown_table(rows: list[dict], n_clusters: int, title: str, options: dict | None = None) -> str:
    lines = [f"# Ordering strategies: {title}", "",
             f"K = {n_clusters} clusters. Diversity: unique clusters per packed window (higher is better). "
             "Uniformity: per window, the largest |cluster token share - global share| (lower is better). "
             "Shift: total-variation distance between the cluster mix of the first and last 5% of tokens "
             "(lower is better). Coverage: fraction of tokens before the last cluster first appears "
             "(lower is better). Lowest tenth: the mean diversity of the least diverse tenth of the epoch's "
             "windows (a mean over the epoch can hide a stretch less diverse than the rest). "
             "Efficiency: unique clusters over the most any order could put in these windows, "
             "min(clusters, documents in the window), summed over windows (1.0: nothing left to gain). "
             "Fill: share of the packed sequences' tokens that are not padding (packing whole, a window closes when "
             "the next document does not fit, so the order sets how many sequences the data takes). "
             f"Criteria, each ordering against stratified and the random shuffle at the same length: {CRITERIA} "
             "(a missed one is marked ✗; stratified and random, the two they measure against, show -). "
             "The random row is the mean of seeded shuffles (one shuffle's boundary shift swings by 2-5 x from seed "
             f"to seed): {diversity.RANDOM_SHUFFLES_LEAST} of a large corpus, up to {diversity.RANDOM_SHUFFLES_MOST} "
             "of a small one (each figure the mean of the shuffles' own: their lowest tenths, their least diverse windows). "
             "Time: the ordering's run time (compiled code warmed up first); orderings that do not depend on the "
             "sequence length run once and show that time at every length.", ""]
    if options:
        shown = ", ".join(f"{k}={v}" for k, v in options.items() if v not in (None, [], (), {}) and k != "per_ordering")
        lines += [f"Options: {shown}.", ""]
        if options.get("per_ordering"):
            lines += ["Per ordering (its own default where the flag is unset): " + "; ".join(
                f"{name} " + ", ".join(f"{k}={v}" for k, v in values.items())
                for name, values in options["per_ordering"].items()) + ".", ""]
    wins = verdicts(rows)
    met = row_criteria(rows)
    out_of_reach = u_out_of_reach_by_length(rows)
    for seq_len in sorted({r["seq_len"] for r in rows}):
        at = {r["ordering"]: r for r in rows if r["seq_len"] == seq_len}
        random_uniformity = at["random"]["uniformity_mean"] if "random" in at else None
        bound = next((r.get("uniformity_bound") for r in at.values()), None)
        unreachable = out_of_reach.get(seq_len, False)
        lines += [f"## seq-len {seq_len:,}", "",
                  "| ordering | diversity mean | min | std | lowest tenth | efficiency | fill | uniformity mean "
                  "| uniformity max | boundary shift | coverage | criteria | time (s) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
        for r in at.values():
            d = r["diversity"]
            # (rows read back from a report written before each order's own lowest tenth was kept lack it)
            lowest = f"{r.get('diversity_lowest_tenth', min(r['diversity_by_tenth'] or [0])):.2f}" \
                if r.get("diversity_by_tenth") else "-"
            lines.append(f"| {r['ordering']} | {d['mean']:.2f} | {d['min']} | {d['std']:.2f} | {lowest} "
                         f"| {r['efficiency']:.3f} | {_fill(r)} | {r['uniformity_mean']:.4f} "
                         f"| {r['uniformity_max']:.4f} | {r['boundary_shift']:.4f} | {r['coverage']:.4f} "
                         f"| {_marks(met.get(seq_len, {}).get(r['ordering']), unreachable)} | {r['seconds']:.3f} |")
        lines += _field_tables(at)
        most = max(int(r["diversity"]["n_sequences"]) for r in at.values())
        if most <= 1:
            lines += ["", "Every order makes one window at this length: the same clusters in it whatever the order, "
                          "and a uniformity of 0 (the window is the whole corpus), so no order is judged here; a "
                          "shorter length shows each order."]
        elif most < diversity.FEW_WINDOWS:
            lines += ["", f"No order makes more than {most} windows at this length: every "
                          "figure here rests on so few that one document moved changes it, the verdicts too; a shorter "
                          "length shows more of each order."]
        if seq_len in wins:
            verdict = f"Meets all three criteria (D, U, B): {', '.join(wins[seq_len]) or 'none'}."
            near = sorted((at[name]["uniformity_mean"], name) for name, ok in met[seq_len].items()
                          if ok["D"] and ok["B"])
            stratified, shuffled = at["stratified"], at["random"]
            stratified_uniformity = stratified["uniformity_mean"]
            # stratified is the yardstick of D, so it meets D; whether it meets B decides if it is a pick itself
            stratified_meets_b = stratified["boundary_shift"] <= SHIFT_RATIO * shuffled["boundary_shift"]
            if not wins[seq_len] and near and (near[0][0] < stratified_uniformity or not stratified_meets_b):
                verdict += f" Of those meeting D and B, the most uniform: {near[0][1]} ({near[0][0]:.4f})"
                verdict += ("." if near[0][0] < stratified_uniformity else
                            f"; stratified's is {stratified_uniformity:.4f}, but its boundary shift "
                            f"({stratified['boundary_shift']:.4f}) misses B ({SHIFT_RATIO:g} x the shuffle's "
                            f"{shuffled['boundary_shift']:.4f}).")
            elif not wins[seq_len] and near:
                verdict += (f" None of those meeting D and B is more uniform than stratified "
                            f"({stratified_uniformity:.4f}), which meets them too.")
            lines += ["", verdict]
        if bound:  # rows read back from a report written before the bound existed lack it
            floor = (f"No order of these documents has a mean uniformity below {bound:.4f} (a lower bound from the "
                     "documents' lengths and clusters alone: the windows long documents fill, the share of its "
                     "window a document larger than its cluster's share takes, the windows a cluster with few "
                     "documents cannot reach, windows left to one or two documents, and the shortfall of a cluster "
                     "whose long documents hold its tokens in the other windows, in every order).")
            if random_uniformity:
                floor += (f" That is {bound / random_uniformity:.2f} x the random shuffle's {random_uniformity:.4f}; "
                          f"U asks for {UNIFORMITY_RATIO:g} x: "
                          + ("no order of these documents meets U at this length." if unreachable else
                             "the bound does not rule that out."))
            lines += ["", floor]
        elif bound is not None:
            lines += ["", "The documents' lengths and clusters set no floor on uniformity here (no document is long "
                          "enough, and no cluster has too few documents, to force a window off the corpus mix in "
                          "every order)."]
        spread = at.get("random", {}).get("boundary_shift_range")
        if spread:  # rows read back from a report written before the baseline was a mean lack it
            lines += ["", f"The {at['random'].get('shuffles', 'several')} random shuffles' boundary shifts ranged "
                          f"from {spread[0]:.4f} to {spread[1]:.4f}."]
        lines.append("")
    return "\n".join(lines)


def report_paths(stem: Path) -> dict[str, Path]:
    return {"markdown": Path(f"{stem}_strategies.md"), "json": Path(f"{stem}_strategies.json"),
            "plot": Path(f"{stem}_strategies.png")}


def write_report(stem: Path, rows: list[dict], curves: dict, n_clusters: int, title: str, options: dict | None = None,
                 plot: bool = True) -> tuple[dict[str, Path], str]:
    """Write ``stem_strategies.md``, ``.json`` and (with ``plot``) ``.png``; return (the paths written, the table)."""
    from .plots import plot_strategy_distributions

    paths = report_paths(stem)
    if not plot:
        del paths["plot"]
    table = markdown_table(rows, n_clusters, title, options)
    with atomic_open(paths["markdown"], "w") as handle:
        handle.write(table)
    save_json(paths["json"], {"title": title, "n_clusters": n_clusters, "options": options or {}, "rows": rows,
                              "criteria": CRITERIA,
                              "criteria_met": {str(k): v for k, v in row_criteria(rows).items()},
                              "winners": {str(k): v for k, v in verdicts(rows).items()},
                              "u_out_of_reach": {str(k): v for k, v in u_out_of_reach_by_length(rows).items()}})
    if plot:
        # The random row's mean is its shuffles' (the table's); its box, the first shuffle's windows.
        means = {(row["ordering"], row["seq_len"]): row["diversity"]["mean"] for row in rows if "shuffles" in row}
        shuffles = next((row["shuffles"] for row in rows if "shuffles" in row), None)
        labels = {"random": f"random (mean of {shuffles})"} if shuffles else {}
        plot_strategy_distributions(paths["plot"], curves, n_clusters, title, means, labels)
    return paths, table
