"""Plots: distinct colours, token-aligned strips, and both figures written as real PNGs."""

import numpy as np
import pytest
from PIL import Image

from diversity_order.diversity import summarize_windows, window_diversity
from diversity_order.plots import (
    _colour_strip,
    cluster_colors,
    cluster_label_anchors,
    plot_cluster_cloud,
    plot_ordering_comparison,
)


@pytest.mark.parametrize("k", [1, 6, 20, 30, 60])
def test_cluster_colours_are_distinct_up_to_sixty(k):
    colours = cluster_colors(k)
    assert colours.shape == (k, 4)
    assert len({tuple(np.round(c, 4)) for c in colours}) == k


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
