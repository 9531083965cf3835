"""k-means, PCA and k calibration equal the reference's definitions."""

import numpy as np
import pytest
from sklearn.cluster import MiniBatchKMeans
from sklearn.metrics import silhouette_score

from diversity_order.clustering import (
    CalibrationRow,
    CosineSilhouette,
    calibrate_k,
    kmeans_labels,
    recommend_k,
    reduce_with_pca,
)
from reference_impl import ref_calibration, ref_pca


def blobs(n=400, dim=24, centres=6, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, dim))
    x = c[rng.integers(0, centres, n)] + 0.4 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_kmeans_labels_are_the_reference_minibatch_kmeans():
    x = blobs()
    expected = MiniBatchKMeans(n_clusters=7, random_state=5, batch_size=4096, n_init=3).fit_predict(x)
    assert np.array_equal(kmeans_labels(x, 7, seed=5), expected)


@pytest.mark.parametrize("n,components", [(400, 10), (8, 50), (400, 100)])
def test_pca_matches_reference(n, components):
    x = blobs(n=n)
    reduced, info = reduce_with_pca(x, components, seed=3)
    expected = ref_pca(x, components, 3)
    assert info.n_components == min(components, n - 1, x.shape[1])
    assert info.original_dim == x.shape[1]
    np.testing.assert_allclose(reduced, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(reduced, axis=1), 1, atol=1e-5)


def test_pca_on_one_row_is_skipped():
    x = blobs(n=1)
    reduced, info = reduce_with_pca(x, 10)
    assert info is None and reduced is x


@pytest.mark.parametrize("sample_size", [None, 150, 5000])
def test_blockwise_silhouette_equals_sklearn(sample_size):
    x = blobs(n=500)
    labels = kmeans_labels(x, 9, seed=1)
    ours = CosineSilhouette(x, sample_size, seed=4, block_rows=64).score(labels)
    expected = silhouette_score(x, labels, metric="cosine", sample_size=sample_size, random_state=4)
    assert ours == pytest.approx(expected, abs=1e-6)
    # Without the kept matrix (blockwise recomputation) the score is the same.
    low_memory = CosineSilhouette(x, sample_size, seed=4, block_rows=64, keep_matrix_bytes=0).score(labels)
    assert low_memory == pytest.approx(expected, abs=1e-6)


def test_silhouette_singletons_and_one_cluster():
    x = blobs(n=30)
    labels = np.zeros(30, int)
    assert CosineSilhouette(x, None).score(labels) is None
    labels[0] = 1  # a singleton cluster scores 0 for its member, as in sklearn
    expected = silhouette_score(x, labels, metric="cosine")
    assert CosineSilhouette(x, None).score(labels) == pytest.approx(expected, abs=1e-6)


def test_calibration_table_matches_reference():
    x = blobs(n=160, centres=12)
    rows, recommended = calibrate_k(x, sample_size=100, seed=2, progress=False)
    expected_rows, expected_k = ref_calibration(x, 100, 2)
    assert [r.k for r in rows] == [r[0] for r in expected_rows]
    assert [r.k for r in rows][-1] == 100  # k >= N would be skipped; 100 < 160 is kept
    for ours, ref in zip(rows, expected_rows):
        assert ours.silhouette == pytest.approx(ref[1], abs=1e-6)
        assert (ours.size_min, ours.size_median, ours.size_max) == ref[2:]
    assert recommended == expected_k


def test_calibration_skips_k_not_below_n():
    rows, _ = calibrate_k(blobs(n=26), sample_size=0, progress=False)
    assert [r.k for r in rows] == [5, 10, 15, 20, 25]


def test_recommend_highest_k_within_five_percent_of_peak():
    rows = [CalibrationRow(k, s, 1, 1, 1) for k, s in [(5, 0.30), (10, 0.31), (20, 0.296), (30, 0.29), (40, 0.2)]]
    assert recommend_k(rows) == 20  # 0.296 >= 0.95 * 0.31 = 0.2945; 0.29 is not
    negative = [CalibrationRow(k, s, 1, 1, 1) for k, s in [(5, -0.1), (10, -0.05)]]
    assert recommend_k(negative) == 10


def test_assign_to_centres_equals_brute_force():
    from diversity_order.clustering import assign_to_centres

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    c = rng.normal(size=(7, 8)).astype(np.float32)
    expected = [int(np.argmin([((row - centre) ** 2).sum() for centre in c])) for row in x]
    assert assign_to_centres(x, c).tolist() == expected


@pytest.mark.parametrize("backend", ["sklearn", "faiss", "torch"])
@pytest.mark.parametrize("fit_sample", [0, 300])
def test_backends_find_the_blobs_with_similar_inertia(backend, fit_sample):
    from sklearn.metrics import adjusted_rand_score

    from diversity_order.clustering import inertia

    if backend == "faiss":
        pytest.importorskip("faiss")
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(6, 16)) * 3
    truth = rng.integers(0, 6, 2000)
    x = (centres[truth] + rng.normal(size=(2000, 16))).astype(np.float32)
    labels = kmeans_labels(x, 6, seed=0, backend=backend, fit_sample=fit_sample)
    assert labels.shape == (2000,) and labels.min() >= 0 and labels.max() < 6
    assert adjusted_rand_score(truth, labels) > 0.95
    reference = inertia(x, kmeans_labels(x, 6, seed=0), 6)
    assert inertia(x, labels, 6) <= reference * 1.05


def test_faiss_fits_few_rows_without_its_own_stderr_line(capfd):
    """faiss writes "please provide at least 39 K training points" straight to stderr (C++, not logging)
    below 39 rows a cluster; the other backends fit few rows silently, and so does faiss here."""
    pytest.importorskip("faiss")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 8)).astype(np.float32)
    labels = kmeans_labels(x, 6, seed=0, backend="faiss")
    assert labels.shape == (60,) and set(labels.tolist()) <= set(range(6))
    err = capfd.readouterr().err
    assert "please provide" not in err and "WARNING clustering" not in err, err


def test_fit_sample_with_sklearn_assigns_to_centres_fitted_on_the_sample():
    from diversity_order.clustering import assign_to_centres, make_kmeans

    x = blobs(n=500)
    rows = np.sort(np.random.RandomState(3).choice(500, 100, replace=False))
    centres = make_kmeans(5, 3).fit(x[rows]).cluster_centers_
    assert np.array_equal(kmeans_labels(x, 5, seed=3, fit_sample=100), assign_to_centres(x, centres))


def test_silhouette_torch_path_equals_numpy_path():
    import torch

    x = blobs(n=300)
    labels = kmeans_labels(x, 6, seed=0)
    numpy_score = CosineSilhouette(x, None, block_rows=50).score(labels)
    # The torch path is taken on a GPU; here it is forced onto CPU tensors to check its arithmetic.
    scorer = CosineSilhouette(x, None, block_rows=50)
    scorer._torch_unit, scorer._matrix = torch.as_tensor(scorer.unit), None
    assert scorer.score(labels) == pytest.approx(numpy_score, abs=1e-6)


def test_one_blas_thread_in_the_fit_gives_the_same_labels():
    # kmeans_labels limits BLAS to one thread inside MiniBatchKMeans (4x faster on a few busy cores);
    # the labels are the plain call's.
    from diversity_order.clustering import make_kmeans

    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(c, 1.0, size=(3000, 24)) for c in range(6)]).astype(np.float32)
    np.testing.assert_array_equal(kmeans_labels(x, 12, seed=3), make_kmeans(12, 3).fit_predict(x))
