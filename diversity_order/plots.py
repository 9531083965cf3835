"""Plots: the before/after ordering comparison, the cluster cloud (a 2-D map of the clusters), the
strategy comparison's diversity curves, and the clustering comparison's scatters and heat map.

Matplotlib runs headless (Agg). The colour bars are drawn as one image each, however many
documents there are; scatter points are rasterised so the PNG stays light at any N.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np

from .atomic import atomic_open
from .defaults import DEFAULT_SEED
from .diversity import MEASURED_ORDER_NAMES, measured_order_name
from .orderings import SPECS

log = logging.getLogger(__name__)


# Documents not placed yet (the UMAP video) are drawn in this grey; no cluster colour comes near it.
UNPLACED_RGB = (200, 200, 200)
_MIN_DISTANCE_TO_UNPLACED = 48.0  # RGB distance: clearly another colour
# Channel spread below which a colour reads as grey: a cluster drawn grey looked like padding or empty space.
_MIN_CHROMA = 30.0


_PALETTE_SIZE = 256  # colours chosen apart from each other; more clusters than this take a sweep of turbo
_LIGHTNESS = (30.0, 85.0)  # CIELAB L*: darker reads as black text, lighter vanishes on the white background
# CIELAB chroma at most this: fuller colours glare beside the others and bleed in the videos' 4:2:0 chroma.
_MAX_CHROMA_LAB = 60.0


def cluster_colors(n_clusters: int) -> np.ndarray:
    """RGBA per cluster, all distinct, none grey; cluster i has the same colour whatever K.

    The original toolkit resamples ``tab20`` to K colours, which repeats colours past K = 20 (at the default
    K = 30, ten pairs of clusters look the same) and includes greys that read as "not placed"
    (``UNPLACED_RGB``) or as padding; tab20's light/dark pairs still left near twins. Here each colour in turn
    is the one farthest (CIELAB distance) from those already taken, from white and from ``UNPLACED_RGB``;
    beyond ``_PALETTE_SIZE`` clusters, a shuffled sweep of turbo (which has no greys).
    """
    k = max(n_clusters, 1)
    if k <= _PALETTE_SIZE:
        rgba = np.ones((k, 4))
        rgba[:, :3] = _apart_colours()[:k]
        return rgba
    import matplotlib

    shuffled = np.random.RandomState(0).permutation(k)
    return matplotlib.colormaps["turbo"](shuffled / max(k - 1, 1))


@functools.cache
def _apart_colours() -> np.ndarray:
    """``_PALETTE_SIZE`` sRGB colours (0..1), each the farthest from the ones before (greedy max-min distance in
    CIELAB over a grid of candidates with some colour, in ``_LIGHTNESS``, clear of ``UNPLACED_RGB``)."""
    levels = np.linspace(0.08, 0.92, 15)  # short of the full primaries, which glare and bleed in video
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), axis=-1).reshape(-1, 3)
    rgb255 = grid * 255
    lab = _cielab(grid)
    usable = ((np.linalg.norm(rgb255 - np.asarray(UNPLACED_RGB), axis=1) >= _MIN_DISTANCE_TO_UNPLACED)
              & (np.ptp(rgb255, axis=1) >= _MIN_CHROMA) & (np.hypot(lab[:, 1], lab[:, 2]) <= _MAX_CHROMA_LAB)
              & (lab[:, 0] >= _LIGHTNESS[0]) & (lab[:, 0] <= _LIGHTNESS[1]))
    grid, lab = grid[usable], lab[usable]
    avoid = _cielab(np.array([[1.0, 1.0, 1.0], np.asarray(UNPLACED_RGB) / 255]))
    nearest = np.linalg.norm(lab[:, None, :] - avoid[None, :, :], axis=2).min(axis=1)
    chosen = []
    for _ in range(_PALETTE_SIZE):
        pick = int(np.argmax(nearest))  # ties: the lowest grid index, so the palette is the same everywhere
        chosen.append(pick)
        nearest = np.minimum(nearest, np.linalg.norm(lab - lab[pick], axis=1))
        nearest[pick] = -1.0
    return grid[chosen]


def _cielab(rgb: np.ndarray) -> np.ndarray:
    """sRGB (0..1, rows) to CIELAB under D65: distances there follow how different colours look."""
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    to_xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = linear @ to_xyz.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 120) -> None:
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=dpi, bbox_inches="tight")


def _colour_strip(labels_in_order: np.ndarray, counts_in_order: np.ndarray, colors: np.ndarray,
                  width: int = 4000) -> np.ndarray:
    """An RGBA strip along the token axis: column j shows the document at that token position,
    so the strip lines up with the per-window chart below it."""
    ends = np.cumsum(counts_in_order, dtype=np.int64)
    total = int(ends[-1]) if ends.size else 0
    if total == 0:
        return colors[labels_in_order[:1]][np.newaxis, :, :] if labels_in_order.size else np.ones((1, 1, 4))
    positions = (np.arange(width) + 0.5) * total / width
    doc = np.minimum(np.searchsorted(ends, positions, side="right"), labels_in_order.size - 1)
    return colors[labels_in_order[doc]][np.newaxis, :, :]


# Past this many windows a line per window is a solid band (a user's million windows, a few thousand pixels): each
# curve is then its mean over bins of consecutive windows, with the 10th-90th percentile of each bin shaded.
MOST_WINDOWS_DRAWN = 2000
WINDOW_BINS = 500
BAND_PERCENTILES = (10, 90)


def binned_windows(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per bin of consecutive windows (at most ``bins``, as equal as they divide): its centre on the window
    axis, the mean, and the BAND_PERCENTILES of its values (non-negative integers; the lowest value whose
    share of the bin at or below it reaches the percentile)."""
    values = np.asarray(values, dtype=np.int64)
    bins = max(1, min(bins, values.size))
    edges = np.linspace(0, values.size, bins + 1).round().astype(np.int64)
    which = np.repeat(np.arange(bins), np.diff(edges))
    sizes = np.diff(edges)
    mean = np.bincount(which, weights=values, minlength=bins) / sizes
    span = int(values.max()) + 1 if values.size else 1
    below = np.bincount(which * span + values, minlength=bins * span).reshape(bins, span).cumsum(axis=1)
    low, high = ((below * 100 >= q * sizes[:, None]).argmax(axis=1) for q in BAND_PERCENTILES)
    return (edges[:-1] + edges[1:]) / 2, mean, low, high


def plot_ordering_comparison(path: Path, labels: np.ndarray, token_counts: np.ndarray, order: np.ndarray,
                             n_clusters: int, diversity_before: np.ndarray, diversity_after: np.ndarray,
                             summary_before: dict, summary_after: dict, seq_len: int,
                             quality: dict | None = None, ordering_name: str = "stratified") -> None:
    """``quality``: {"original": .., "curated": .., "random_shuffle": ..} from diversity.ordering_quality,
    shown as a line per order under the strips."""
    plt = pyplot()
    colors = cluster_colors(n_clusters)
    fig, axes = plt.subplots(3, 1, figsize=(14, 8), gridspec_kw={"height_ratios": [1, 1, 3]}, sharex=True)
    total_windows = float(token_counts.sum()) / seq_len

    def title(name: str, s: dict) -> str:
        return f"{name}: mean diversity {s['mean']:.2f}, min {s['min']}, std {s['std']:.2f} ({s['n_sequences']:,} windows)"

    for ax, order_here, text, n_windows in (
        (axes[0], np.arange(labels.size), title("Input order", summary_before), diversity_before.size),
        (axes[1], order, title(f"Curated order ({ordering_name})", summary_after), diversity_after.size),
    ):
        strip = _colour_strip(labels[order_here], token_counts[order_here], colors)
        # Packing whole, a document that does not fit starts the next window, so windows end part-empty: stretch
        # the token axis over the packed windows so the strip lines up with the per-window curve below.
        ax.imshow(strip, aspect="auto", interpolation="nearest", extent=(0, max(n_windows, total_windows), 0, 1))
        ax.set_yticks([])
        ax.set_title(text, fontsize=10)
    ax = axes[2]
    most = max(diversity_before.size, diversity_after.size)
    binned = most > MOST_WINDOWS_DRAWN
    for values, color, name in ((diversity_before, "tab:red", "input order"), (diversity_after, "tab:blue", "curated order")):
        if binned:
            x, mean, low, high = binned_windows(values, WINDOW_BINS)
            ax.fill_between(x, low, high, color=color, alpha=0.2, lw=0)
            ax.plot(x, mean, lw=1.2, color=color, label=name)
        else:
            ax.plot(np.arange(values.size) + 0.5, values, lw=1, color=color, label=name)
    if binned:
        per_bin = most / min(WINDOW_BINS, most)
        ax.set_title(f"mean over each ~{per_bin:,.0f} windows, shaded: their {BAND_PERCENTILES[0]}th to "
                     f"{BAND_PERCENTILES[1]}th percentile (a line per window would fill the panel)", fontsize=9)
    ax.axhline(n_clusters, ls="--", color="grey", lw=1, label=f"K = {n_clusters}")
    ax.set_xlabel(f"position in the data, in training sequences of {seq_len:,} tokens")
    ax.set_ylabel("unique clusters in sequence")
    # No window holds more than K clusters: the band above the K line holds the legend, in one row, clear
    # of the curves (in a corner it hid their ends).
    ax.set_ylim(0, n_clusters * 1.2 + 1)
    ax.set_xlim(0, max(total_windows, diversity_before.size, diversity_after.size))
    ax.legend(loc="upper right", ncol=3, fontsize=9)
    ax.grid(alpha=0.3)
    fig.suptitle(f"Documents coloured by cluster (K = {n_clusters}) along the token stream, input vs curated order")
    if quality:
        text = "      ".join(
            f"{measured_order_name(key, q)}: {q['uniformity_mean']:.3f} (max {q['uniformity_max']:.2f}), "
            f"shift {q['boundary_shift']:.3f}" for key, q in quality.items() if key in MEASURED_ORDER_NAMES)
        fig.text(0.5, -0.005, "Token-share uniformity, mean over windows (max), and epoch-boundary shift; lower is "
                 "better\n" + text, ha="center", va="top", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def cluster_label_anchors(projection: np.ndarray, labels: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per non-empty cluster (ascending id), its point nearest the median of its points."""
    anchors = []
    for k in np.flatnonzero(sizes):
        points = projection[labels == k]
        anchors.append(points[np.argmin(((points - np.median(points, axis=0)) ** 2).sum(1))])
    return np.asarray(anchors).reshape(-1, 2)


LABEL_FONT_PT = 8


def label_offsets(anchors_pt: np.ndarray, widths_pt: np.ndarray, height_pt: float, order: np.ndarray,
                  max_steps: int = 12) -> np.ndarray:
    """Where each label goes, as an offset in points from its anchor (``anchors_pt``, in points on the page):
    just above it where its box (``widths_pt`` wide, ``height_pt`` high, centred) overlaps no label placed
    before it (``order``: the largest clusters first), else the nearest free place a box height at a time up,
    down, then to either side; where none is free within ``max_steps`` boxes, above it still."""
    placed: list[tuple[float, float, float, float]] = []
    offsets = np.zeros((anchors_pt.shape[0], 2))
    tries = [(0.0, 0.0)] + [(dx * step, dy * step) for step in range(1, max_steps + 1)
                            for dx, dy in ((0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (-1, 1), (1, -1), (-1, -1))]
    for i in order:
        x, y = anchors_pt[i]
        half = widths_pt[i] / 2
        for step_x, step_y in tries:
            dx, dy = step_x * (2 * half + 2), 4 + step_y * (height_pt + 1)
            box = (x + dx - half, y + dy, x + dx + half, y + dy + height_pt)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        else:
            dx, dy = 0.0, 4.0
            box = (x - half, y + dy, x + half, y + dy + height_pt)
        placed.append(box)
        offsets[i] = dx, dy
    return offsets


def _name_clusters(ax, names: list[str], anchors: np.ndarray, sizes: np.ndarray | None = None) -> None:
    """Each name just above its anchor point (``cluster_label_anchors``): centred on a cluster's points, the
    box hid a cluster of identical documents (one dot), and the median of a cluster in several islands fell
    in empty space. Where names would overlap (dense middles), the smaller clusters' move to the nearest free
    place (``label_offsets``), a thin line back to the anchor."""
    fig = ax.figure
    fig.canvas.draw()  # the axes' final size and limits, for the anchors' place on the page
    points_per_pixel = 72.0 / fig.dpi
    anchors_pt = ax.transData.transform(np.asarray(anchors, dtype=np.float64).reshape(-1, 2)) * points_per_pixel
    widths = np.array([0.62 * LABEL_FONT_PT * len(name) + 4 for name in names])
    order = np.argsort(-np.asarray(sizes), kind="stable") if sizes is not None else np.arange(len(names))
    offsets = label_offsets(anchors_pt, widths, 1.5 * LABEL_FONT_PT, order)
    for name, anchor, (dx, dy) in zip(names, anchors, offsets, strict=True):
        moved = abs(dx) > 0 or dy != 4
        ax.annotate(name, anchor, xytext=(dx, dy), textcoords="offset points", fontsize=LABEL_FONT_PT, ha="center",
                    va="bottom", bbox={"boxstyle": "round,pad=0.2", "fc": "white", "alpha": 0.8, "lw": 0},
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.4"} if moved else None)


def plot_cluster_cloud(path: Path, labels: np.ndarray, n_clusters: int, projection: np.ndarray | None) -> None:
    """Scatter of the 2-D projection coloured by cluster; a bar chart of sizes without one."""
    plt = pyplot()
    colors = cluster_colors(n_clusters)
    sizes = np.bincount(labels, minlength=n_clusters)
    if projection is None:
        fig, ax = plt.subplots(figsize=(12, 6))
        by_size = np.argsort(-sizes, kind="stable")
        ax.bar(np.arange(n_clusters), sizes[by_size], color=colors[by_size])
        ax.set_xticks(np.arange(n_clusters), [f"c{k}" for k in by_size], rotation=90, fontsize=8)
        ax.set_ylabel("documents")
        ax.set_title(f"Cluster sizes (K = {n_clusters}); install umap-learn for the 2-D cluster cloud")
    else:
        fig, ax = plt.subplots(figsize=(12, 10))
        n = labels.size
        point = float(np.clip(60000 / max(n, 1), 0.5, 20))
        ax.scatter(projection[:, 0], projection[:, 1], c=colors[labels], s=point, lw=0, alpha=0.8, rasterized=True)
        centres = cluster_label_anchors(projection, labels, sizes)  # where the names go, and what the frame holds
        lo, hi = cloud_frame(projection, labels, centres)
        pad = (hi - lo) * 0.05
        ax.set_xlim(lo[0] - pad[0], hi[0] + pad[0])
        ax.set_ylim(lo[1] - pad[1], hi[1] + pad[1])
        outside = int(np.count_nonzero(((projection < lo - pad) | (projection > hi + pad)).any(axis=1)))
        present = np.flatnonzero(sizes)
        _name_clusters(ax, [f"c{k} ({sizes[k]})" for k in present],
                       np.clip(centres, lo, hi), sizes[present])
        ax.set_xticks([])
        ax.set_yticks([])
        off = f"; {outside:,} stray points ({outside / n:.1%}) outside the frame" if outside else ""
        ax.set_title(f"{n:,} documents, PCA -> UMAP, coloured by cluster (K = {n_clusters}){off}")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def cloud_frame(projection: np.ndarray, labels: np.ndarray, centres: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) corners framing the cluster cloud: the 0.5th-99.5th percentiles of all points (a few far
    outliers would otherwise squeeze the picture), widened to every cluster's centre point (its point nearest the
    median of its points), so no cluster is left out of the picture: the demo's cluster of 13 lay far below the
    rest, and the percentiles alone cut it off, its name pinned to the edge. (Dense cells of a histogram kept it, but
    on mix-b took in far islands of identical records, and the cloud shrank to a third of the picture.)"""
    lo, hi = np.percentile(projection, [0.5, 99.5], axis=0)
    if centres is None:  # (``cluster_label_anchors``, where the caller has not made them)
        centres = cluster_label_anchors(projection, labels, np.bincount(labels))
    if centres.size:
        lo, hi = np.minimum(lo, centres.min(axis=0)), np.maximum(hi, centres.max(axis=0))
    return lo, hi


def plot_strategy_distributions(path: Path, curves: dict, n_clusters: int, title: str, means: dict | None = None,
                                labels: dict | None = None) -> None:
    """One panel per seq_len, one row per ordering: how its windows' unique clusters spread. The box runs from
    the 25th to the 75th percentile, the whiskers to the 10th and 90th, a tick marks the median and a diamond
    the mean (its value at the right). Rows keep the comparison's order, top to bottom.

    ``curves``: {(ordering, seq_len): per-window diversity}. (A line per ordering along the order, even
    smoothed, was a tangle at nine orderings: one hid another.) ``means``: {(ordering, seq_len): the mean the
    table gives}, where it is not the curve's (the random baseline: the mean of several shuffles, its curve one
    of them); ``labels``: {ordering: its row's name}, where not its name.
    """
    means, labels = means or {}, labels or {}
    plt = pyplot()
    seq_lens = sorted({seq_len for _, seq_len in curves})
    names = list(dict.fromkeys(name for name, _ in curves))
    panel = 1.2 + 0.34 * len(names)
    # constrained layout sizes the room above the panels to the title's lines (tight_layout took a guess)
    fig, axes = plt.subplots(len(seq_lens), 1, figsize=(11, panel * len(seq_lens) + 0.6), squeeze=False,
                             layout="constrained")
    right = n_clusters * 1.13
    for ax, seq_len in zip(axes[:, 0], seq_lens):
        for row, name in enumerate(names):
            values = np.asarray(curves[(name, seq_len)], dtype=np.float64)
            if values.size == 0:
                continue
            low, q1, median, q3, high = np.percentile(values, [10, 25, 50, 75, 90])
            spec = SPECS.get(name)
            color = spec.color if spec is not None else plt.get_cmap("tab20")(row % 20)
            bold = spec is not None and spec.highlight
            ax.hlines(row, low, high, color=color, lw=1.4)
            ax.barh(row, max(q3 - q1, 0.05), left=q1, height=0.56, color=color, alpha=0.55 if bold else 0.3,
                    edgecolor=color, lw=1.2)
            ax.vlines(median, row - 0.28, row + 0.28, color=color, lw=2.4)
            mean = means.get((name, seq_len), values.mean())
            ax.plot(mean, row, marker="D", ms=4.5, color="black", zorder=3)
            ax.text(right - n_clusters * 0.01, row, f"{mean:.2f}", va="center", ha="right", fontsize=8.5,
                    fontweight="bold" if bold else "normal")
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([labels.get(name, name) for name in names], fontsize=9)
        for label, name in zip(ax.get_yticklabels(), names):
            spec = SPECS.get(name)
            if spec is not None and spec.highlight:
                label.set_fontweight("bold")
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.axvline(n_clusters, ls=":", color="grey", lw=1)
        ax.set_xlim(0, right)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"seq-len {seq_len:,}: unique clusters per window (box: 25th-75th percentile, whiskers: "
                     f"10th-90th, tick: median, diamond and right: mean; dotted: K)", fontsize=9.5)
    axes[-1, 0].set_xlabel("unique clusters in a window")
    bold = [name for name in names if SPECS.get(name) is not None and SPECS[name].highlight]
    several = [labels[name] for name in names if name in labels and any((name, s) in means for s in seq_lens)]
    fig.suptitle(f"Ordering strategies on {title} (K = {n_clusters})"
                 + (f"\nin bold: {', '.join(bold)} (the default, the README's choices and a shuffle, the yardstick)"
                    if bold else "")
                 + (f"\n{', '.join(several)}: the diamond and figure are the mean over its orders, as in the table; "
                    "the box is the first one's windows" if several else ""))
    save_figure(fig, path)
    plt.close(fig)


def plot_umap_side_by_side(path: Path, shallow: np.ndarray, deep: np.ndarray, result,
                           seed: int = DEFAULT_SEED, projector=None) -> None:
    """Two scatters: the shallow space coloured by shallow clusters, the deep space by deep ones."""
    from .projection import umap_projection

    projector = projector or (lambda x: umap_projection(x, seed))
    plt = pyplot()
    k = result.table.shape[0]
    colors = cluster_colors(max(result.table.shape))
    fig, axes = plt.subplots(1, 2, figsize=(18, 8.5))
    n = result.shallow_labels.size
    point = float(np.clip(60000 / max(n, 1), 0.5, 20))
    for ax, x, labels, name in ((axes[0], shallow, result.shallow_labels, "Shallow"),
                                (axes[1], deep, result.deep_labels, "Deep")):
        xy = projector(x)
        ax.scatter(xy[:, 0], xy[:, 1], c=colors[labels], s=point, lw=0, alpha=0.8, rasterized=True)
        # The two panels' colours are unrelated cluster ids: names (s3, d7, as in the report and the heat
        # map) tie each panel to the contingency table.
        sizes = np.bincount(labels, minlength=colors.shape[0])
        if np.count_nonzero(sizes) <= 60:
            _name_clusters(ax, [f"{name[0].lower()}{c}" for c in np.flatnonzero(sizes)],
                           cluster_label_anchors(xy, labels, sizes), sizes[sizes > 0])
        # k-means may have run on a PCA of the embeddings: say so beside their own width
        pca = result.report[name.lower()]["pca"]
        space = f"{x.shape[1]} dims" + (f", clustered on PCA {pca['n_components']}" if pca else "")
        ax.set_title(f"{name} embeddings ({space}), coloured by {name.lower()} clusters "
                     f"({name[0].lower()}0, {name[0].lower()}1, ...)")
        ax.set_xticks([])
        ax.set_yticks([])
    r = result.report
    fig.suptitle(f"{n:,} documents, K = {k}: ARI {r['ari']:.3f}, NMI {r['nmi']:.3f} — {r['verdict']}")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_contingency(path: Path, result) -> None:
    """Heat map of the row-normalised contingency table (share of each shallow cluster in each
    deep cluster), rows and columns ordered so splits and merges are visible as blocks."""
    plt = pyplot()
    table = result.table
    rows, cols = result.display_order()
    shares = (table / np.maximum(table.sum(1, keepdims=True), 1))[np.ix_(rows, cols)]
    k_s, k_d = table.shape
    size = float(np.clip(0.3 * max(k_s, k_d), 6, 24))
    fig, ax = plt.subplots(figsize=(size + 2, size))
    image = ax.imshow(shares, cmap="viridis", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    sizes_s, sizes_d = table.sum(1), table.sum(0)
    fontsize = 8 if max(k_s, k_d) <= 40 else 5
    ax.set_yticks(np.arange(k_s), [f"s{i} ({sizes_s[i]})" for i in rows], fontsize=fontsize)
    ax.set_xticks(np.arange(k_d), [f"d{j} ({sizes_d[j]})" for j in cols], fontsize=fontsize, rotation=90)
    ax.set_ylabel("shallow cluster (documents)")
    ax.set_xlabel("deep cluster (documents)")
    if max(k_s, k_d) <= 30:
        cell_font = 9 if max(k_s, k_d) <= 15 else 7
        for (y, x), v in np.ndenumerate(shares):
            if v >= 0.05:  # percent, as the colour bar's ticks
                ax.text(x, y, f"{v:.0%}"[:-1], ha="center", va="center", fontsize=cell_font,
                        color="white" if v < 0.6 else "black")
    from matplotlib.ticker import PercentFormatter

    fig.colorbar(image, ax=ax, fraction=0.04, format=PercentFormatter(1.0),
                 label="share of the shallow cluster's documents (cells: %)")
    r = result.report
    ax.set_title(f"Where each shallow cluster goes in the deep space (ARI {r['ari']:.3f}, NMI {r['nmi']:.3f}).\n"
                 f"One row spread over several columns = a split; one column fed by several rows = a merge.",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
