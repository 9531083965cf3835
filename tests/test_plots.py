"""Plots: distinct colours, token-aligned strips, and both figures written as real PNGs."""

import logging

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from diversity_order import plots
from diversity_order.diversity import summarize_windows, window_diversity
from diversity_order.plots import (
    BAND_PERCENTILES,
    MOST_WINDOWS_DRAWN,
    WINDOW_BINS,
    _colour_strip,
    binned_windows,
    cluster_colors,
    cluster_label_anchors,
    plot_cluster_cloud,
    plot_ordering_comparison,
    plot_strategy_distributions,
)


@pytest.mark.parametrize("k", [1, 6, 20, 30, 60])
def test_cluster_colours_are_distinct_up_to_sixty(k):
    colours = cluster_colors(k)
    assert colours.shape == (k, 4)
    assert len({tuple(np.round(c, 4)) for c in colours}) == k


def test_cluster_colours_stay_apart_and_keep_their_colour_whatever_k():
    from diversity_order.plots import _cielab

    # Published CIELAB (D65) values of sRGB white, red and mid grey.
    np.testing.assert_allclose(_cielab(np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.5]])),
                               [[100.0, 0.0, 0.0], [53.24, 80.09, 67.20], [53.39, 0.0, 0.0]], atol=0.05)
    lab = _cielab(cluster_colors(30)[:, :3])
    apart = np.linalg.norm(lab[:, None] - lab[None], axis=2) + np.eye(30) * 1e9
    assert apart.min() >= 25  # tab20 then tab20b, as before: two clusters 9 apart (a light and a dark blue)
    assert np.array_equal(cluster_colors(30), cluster_colors(60)[:30])  # a cluster's colour does not depend on K
    assert (lab[:, 0] >= 30).all() and (lab[:, 0] <= 85).all()  # not black text, not lost on white


def test_colour_strip_follows_tokens_not_documents():
    colours = np.eye(4)
    # One long document of cluster 1, then three short ones of cluster 2: the strip is 3/4 cluster 1.
    strip = _colour_strip(np.array([1, 2, 2, 2]), np.array([300, 33, 33, 34]), colours, width=400)
    chosen = strip[0].argmax(axis=1)
    assert (chosen == 1).sum() == 300 and (chosen == 2).sum() == 100


def test_plots_are_written(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 40)
    counts = rng.integers(1, 500, 200)
    order = rng.permutation(200)
    before, after = window_diversity(labels, counts, 2000), window_diversity(labels, counts, 2000, order)
    plot_ordering_comparison(tmp_path / "o.png", labels, counts, order, 5, before, after,
                             summarize_windows(before), summarize_windows(after), 2000)
    plot_cluster_cloud(tmp_path / "bars.png", labels, 5, None)
    plot_cluster_cloud(tmp_path / "cloud.png", labels, 5, rng.normal(size=(200, 2)))
    for name in ("o.png", "bars.png", "cloud.png"):
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.width > 600


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 40), min_size=1, max_size=300), bins=st.integers(1, 60))
@example(values=list(range(10)), bins=1)  # a percentile falling exactly on a value's share
def test_binned_windows_equal_a_plain_loop(values, bins):
    """Consecutive bins of windows, as equal as they divide, each with its mean and percentiles (the lowest
    value whose share of the bin at or below it reaches the percentile: numpy's inverted CDF)."""
    centres, mean, low, high = binned_windows(np.array(values), bins)
    edges = [0]
    for centre in centres:
        edges.append(round(2 * centre - edges[-1]))
    sizes = np.diff(edges)
    assert edges[-1] == len(values) and len(sizes) == min(bins, len(values))
    assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1
    for i, (start, stop) in enumerate(zip(edges[:-1], edges[1:])):
        chunk = values[start:stop]
        assert mean[i] == pytest.approx(sum(chunk) / len(chunk))
        assert low[i] == np.percentile(chunk, BAND_PERCENTILES[0], method="inverted_cdf")
        assert high[i] == np.percentile(chunk, BAND_PERCENTILES[1], method="inverted_cdf")


@pytest.mark.parametrize("windows", [MOST_WINDOWS_DRAWN // 2, MOST_WINDOWS_DRAWN * 3])
def test_many_windows_are_drawn_as_bins_with_a_band(tmp_path, monkeypatch, windows):
    """A line per window past a few thousand windows fills the panel: the curves become a mean per bin of
    windows with a shaded band; fewer windows keep their line each."""
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig))
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 8, windows * 4)
    counts = np.full(labels.size, 250)
    order = rng.permutation(labels.size)
    before, after = window_diversity(labels, counts, 1000), window_diversity(labels, counts, 1000, order)
    plot_ordering_comparison(tmp_path / "o.png", labels, counts, order, 8, before, after,
                             summarize_windows(before), summarize_windows(after), 1000)
    curves = drawn[0].axes[2]
    points = sorted(len(line.get_xdata()) for line in curves.get_lines() if line.get_label().endswith("order"))
    if windows > MOST_WINDOWS_DRAWN:
        assert points == [WINDOW_BINS, WINDOW_BINS] and len(curves.collections) == 2
        assert "percentile" in curves.get_title()
    else:
        assert points == [windows, windows] and not curves.collections


def test_the_strategy_plot_gives_each_ordering_a_row_with_its_mean(monkeypatch):
    """Nine orderings as lines along the order were a tangle (a new user could not find paced-polished under
    paced): each ordering is a row per length, in the comparison's order, with its windows' mean beside it."""
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig))
    rng = np.random.default_rng(2)
    names = ["stratified", "paced", "paced-polished", "random", "an-ordering-of-ones-own"]
    curves = {(name, seq_len): rng.integers(1, 9, 40 + 7 * i) for i, name in enumerate(names) for seq_len in (64, 256)}
    plot_strategy_distributions(None, curves, 8, "test")
    panels = drawn[0].axes
    assert [ax.get_title().split(":")[0] for ax in panels] == ["seq-len 64", "seq-len 256"]
    for ax, seq_len in zip(panels, (64, 256)):
        assert [label.get_text() for label in ax.get_yticklabels()] == names
        assert [text.get_text() for text in ax.texts] == [f"{curves[(name, seq_len)].mean():.2f}" for name in names]
    # A reviewer read random 5.80 in the plot and 5.76 in the table: the plot's was one shuffle's, the table's the
    # mean of 100. The table's mean is drawn where given, and the row says what its box is.
    drawn.clear()
    plot_strategy_distributions(None, curves, 8, "test", {("random", 64): 5.76}, {"random": "random (box: 1 of 100)"})
    ax = drawn[0].axes[0]
    assert ax.texts[names.index("random")].get_text() == "5.76"
    assert ax.get_yticklabels()[names.index("random")].get_text() == "random (box: 1 of 100)"
    assert drawn[0].axes[1].texts[names.index("random")].get_text() == f"{curves[('random', 256)].mean():.2f}"


def test_a_cluster_label_sits_on_one_of_its_points():
    # Cluster 0 in two islands (its median between them, where no point is); cluster 2 empty; cluster 3
    # one spot of identical documents.
    projection = np.array([[0.0, 0], [0.1, 0], [10, 10], [10.1, 10], [10.2, 10], [5, -3], [5, -3], [5, -3]])
    labels = np.array([0, 0, 0, 0, 1, 3, 3, 3])
    sizes = np.bincount(labels, minlength=4)
    anchors = cluster_label_anchors(projection, labels, sizes)
    assert anchors.shape == (3, 2)
    for k, anchor in zip((0, 1, 3), anchors, strict=True):
        members = projection[labels == k]
        median = np.median(members, axis=0)
        distances = ((members - median) ** 2).sum(1)
        assert any((anchor == m).all() for m in members)  # a point of its own, not empty space
        assert ((anchor - median) ** 2).sum() == distances.min()  # the nearest such point to the median


def test_place_by_neighbours_puts_anchor_copies_on_their_anchors():
    from diversity_order.projection import place_by_neighbours

    rng = np.random.default_rng(0)
    anchors = rng.normal(size=(50, 8)).astype(np.float32)
    xy = rng.normal(size=(50, 2)).astype(np.float32)
    placed = place_by_neighbours(anchors[[3, 17]], anchors, xy, k=5)
    np.testing.assert_allclose(placed, xy[[3, 17]], atol=2e-2)  # a point on an anchor gets its position


def test_big_inputs_use_a_sample_and_neighbour_placement(monkeypatch):
    from diversity_order import projection

    monkeypatch.setattr(projection, "UMAP_FIT_SAMPLE", 60)
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(loc, 0.05, size=(100, 6)) for loc in (-3, 3)]).astype(np.float32)
    xy = projection.umap_projection(x, seed=0)
    assert xy.shape == (200, 2) and np.isfinite(xy).all()
    # The two far-apart groups stay apart in the picture.
    gap = np.linalg.norm(xy[:100].mean(0) - xy[100:].mean(0))
    assert gap > 3 * max(xy[:100].std(0).max(), xy[100:].std(0).max())


@pytest.mark.parametrize("k", [1, 20, 30, 48, 49, 80])
def test_no_cluster_colour_looks_like_a_point_not_yet_placed(k):
    # The UMAP video draws unplaced points in UNPLACED_RGB; tab20's own grey (199,199,199) once made a
    # cluster that never seemed to light up, and its mid-grey (127,127,127) a cluster of long files that
    # looked like padding in the colour strips.
    from diversity_order.plots import UNPLACED_RGB

    rgb = cluster_colors(k)[:, :3] * 255
    assert np.linalg.norm(rgb - np.asarray(UNPLACED_RGB), axis=1).min() >= 40
    assert (rgb.max(axis=1) - rgb.min(axis=1)).min() >= 30  # no grey


def _boxes(anchors, widths, height, offsets):
    return [(x + dx - w / 2, y + dy, x + dx + w / 2, y + dy + height)
            for (x, y), w, (dx, dy) in zip(anchors, widths, offsets, strict=True)]


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 300), st.floats(0, 300), st.integers(10, 60)), min_size=1, max_size=30))
def test_cluster_names_never_overlap_where_a_free_place_is_near(labels):
    """The cluster cloud's names (a new user's 30 names collided in a dense middle): every name's box is clear of
    the others' (there is always room within the steps tried for 30 names), and a name whose box was free just
    above its anchor stays there."""
    from diversity_order.plots import label_offsets

    anchors = np.array([(x, y) for x, y, _ in labels])
    widths = np.array([w for _, _, w in labels], dtype=float)
    order = np.arange(len(labels))
    offsets = label_offsets(anchors, widths, 12.0, order)
    boxes = _boxes(anchors, widths, 12.0, offsets)
    for i in range(len(boxes)):
        for j in range(i):
            assert not _overlap(boxes[i], boxes[j]), (i, j)
    first = _boxes(anchors[:1], widths[:1], 12.0, [(0.0, 4.0)])[0]
    assert offsets[0].tolist() == [0.0, 4.0] and boxes[0] == first  # the first placed is never moved


def test_a_dense_middle_gets_every_name_readable(tmp_path, monkeypatch):
    """Thirty clusters whose anchors fall within a few points of each other: the saved plot's names do not
    overlap (measured on the rendered text boxes)."""
    import matplotlib.pyplot as plt

    from diversity_order.plots import plot_cluster_cloud

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(30), 50)
    projection = rng.normal(0, 1, (1500, 2)) * 0.05 + rng.normal(0, 1, (30, 2))[labels] * 0.02
    projection[:5] += 40  # far outliers, as UMAP leaves
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)  # the figure, as saved
    plot_cluster_cloud(tmp_path / "cloud.png", labels, 30, projection)
    fig = kept[0]
    renderer = fig.canvas.get_renderer()
    boxes = [text.get_bbox_patch().get_window_extent(renderer) for text in fig.axes[0].texts]  # the white boxes
    assert len(boxes) == 30
    overlapping = [(i, j) for i in range(30) for j in range(i) if boxes[i].overlaps(boxes[j])]
    assert not overlapping, overlapping
    monkeypatch.undo()
    plt.close(fig)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60), st.integers(1, 40), st.integers(1, 7), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_place_by_neighbours_equals_a_plain_loop(n_points, n_anchors, dim, k, seed):
    from diversity_order.projection import place_by_neighbours

    rng = np.random.default_rng(seed)
    anchors = rng.normal(size=(n_anchors, dim)).astype(np.float32)
    xy = rng.normal(size=(n_anchors, 2)).astype(np.float32)
    points = rng.normal(size=(n_points, dim)).astype(np.float32)
    expected = []
    for point in points.astype(np.float64):  # each point: its k nearest anchors, weighted by 1 / distance
        distances = np.sqrt(((anchors.astype(np.float64) - point) ** 2).sum(1))
        nearest = np.argsort(distances)[: min(k, n_anchors)]
        weights = 1.0 / (distances[nearest] + 1e-6)
        expected.append((xy[nearest] * weights[:, None]).sum(0) / weights.sum())
    placed = place_by_neighbours(points, anchors, xy, k=k, batch=7)
    np.testing.assert_allclose(placed, np.array(expected), rtol=1e-3, atol=1e-3)


def test_placing_many_points_shows_progress(monkeypatch, caplog):
    from diversity_order import projection

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(projection, "UMAP_FIT_SAMPLE", 60)
    monkeypatch.setattr(projection, "PLACED_QUIETLY", 150)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 6)).astype(np.float32)
    projection.fitted_projection(x, seed=0, progress=False)
    assert "Placing points among the 60 UMAP was fitted on: " in caplog.text and "of 400 points" in caplog.text
    caplog.clear()
    projection.fitted_projection(x[:150], seed=0, progress=False)
    assert "Placing points" not in caplog.text  # a few points: done in moments, said nothing


def test_the_cloud_frame_keeps_small_far_clusters_and_leaves_stray_points_out(tmp_path, monkeypatch):
    """The demo's cluster of 13 lay far below the rest, and a frame of all points' 0.5th-99.5th percentiles cut it
    off (its name was pinned to the edge, its points out of the picture). Stray points of a big cluster, far out one
    by one, still do not stretch the frame; the title counts them."""
    import matplotlib.pyplot as plt

    from diversity_order.plots import cloud_frame, plot_cluster_cloud

    rng = np.random.default_rng(0)
    bulk = rng.normal(0, 1, (5000, 2))
    far_cluster = rng.normal(0, 0.02, (13, 2)) + [0, -30]
    strays = np.column_stack([np.linspace(-60, 60, 20), np.full(20, 45.0)])  # of the big cluster, one by one
    projection = np.concatenate([bulk, far_cluster, strays])
    labels = np.concatenate([np.zeros(5000, int), np.ones(13, int), np.zeros(20, int)])
    lo, hi = cloud_frame(projection, labels)
    assert ((far_cluster >= lo) & (far_cluster <= hi)).all(axis=1).sum() >= 6  # its centre, and about half of it
    assert (bulk >= lo).mean() > 0.99 and (bulk <= hi).mean() > 0.99
    assert not ((strays >= lo) & (strays <= hi)).all(axis=1).any()
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    plot_cluster_cloud(tmp_path / "cloud.png", labels, 2, projection)
    title = kept[0].axes[0].get_title()
    outside = int(title.split("; ")[1].split()[0])
    assert outside >= 20 and title.endswith("outside the frame")  # the strays, and the bulk's far tail
    monkeypatch.undo()
    plt.close(kept[0])
