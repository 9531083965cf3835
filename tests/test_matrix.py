"""Matrices that need not fit in memory: files read in blocks equal arrays; out-of-core k-means and PCA
equal their in-memory definitions on the same sample."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order import clustering, matrix


def _file(tmp_path, array, name="m.npy"):
    np.save(tmp_path / name, array)
    return matrix.MatrixFile.open(tmp_path / name)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 9), st.integers(1, 70), st.data())
def test_file_blocks_and_rows_equal_the_array(tmp_path_factory, n, d, block_rows, data):
    rng = np.random.default_rng(n * 31 + d)
    array = rng.normal(size=(n, d)).astype(np.float32)
    bad = data.draw(st.lists(st.integers(0, n - 1), max_size=5))
    array[bad] = np.nan
    expected = np.where(np.isfinite(array).all(axis=1, keepdims=True), array, 0)
    file = _file(tmp_path_factory.mktemp("m"), array)
    for source in (array, file):
        got = np.concatenate([block for _, _, block in matrix.blocks(source, block_rows)])
        np.testing.assert_array_equal(got, expected)
        rows = np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=40)), dtype=np.int64)
        np.testing.assert_array_equal(matrix.read_rows(source, rows, block_rows), expected[rows])


def test_out_of_core_plan_and_k_means_on_a_file_equal_the_in_memory_sample_fit(tmp_path):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(loc, 0.1, size=(4000, 8)) for loc in (-2, 0, 2)]).astype(np.float32)
    plan = clustering.plan_for(x, budget=x.nbytes // 4)
    assert not plan.exact and plan.sample == min(x.shape[0], clustering.MIN_FIT_SAMPLE)
    assert clustering.plan_for(x, budget=x.nbytes).exact
    file = _file(tmp_path, x)
    fitted = clustering.kmeans_labels(file, 3, seed=5, fit_sample=2000)
    np.testing.assert_array_equal(fitted, clustering.kmeans_labels(x, 3, seed=5, fit_sample=2000))
    # ... and what that means: centres fitted on the seeded sample, every row to its nearest centre.
    model = clustering.make_kmeans(3, 5).fit(x[clustering.sample_rows(x.shape[0], 2000, 5)])
    nearest = ((x[:, None, :] - model.cluster_centers_[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(fitted, nearest)


def test_out_of_core_pca_is_the_sample_fit_applied_block_by_block(tmp_path):
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(1)
    x = rng.normal(size=(3000, 12)).astype(np.float32) @ rng.normal(size=(12, 12)).astype(np.float32)
    plan = clustering.Plan(False, 1000, "test")
    reduced, info = clustering.reduce_matrix(_file(tmp_path, x), 4, seed=3, plan=plan, scratch=tmp_path / "pca.npy")
    assert isinstance(reduced, matrix.MatrixFile) and info.fit_rows == 1000 and info.n_components == 4
    pca = PCA(4, random_state=3).fit(x[clustering.sample_rows(3000, 1000, 3)])
    expected = pca.transform(x)
    expected /= np.maximum(np.linalg.norm(expected, axis=1, keepdims=True), 1e-8)
    np.testing.assert_allclose(matrix.load(reduced), expected, atol=1e-5)
    exact, exact_info = clustering.reduce_matrix(x, 4, seed=3, plan=clustering.plan_for(x, x.nbytes))
    ref, ref_info = clustering.reduce_with_pca(x, 4, seed=3)
    np.testing.assert_array_equal(exact, ref)
    assert exact_info == ref_info


@pytest.mark.parametrize("text,expected", [("8G", 8 << 30), ("512M", 512 << 20), ("1.5GiB", int(1.5 * (1 << 30))),
                                           ("1000", 1000)])
def test_parse_size(text, expected):
    assert matrix.parse_size(text) == expected


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.integers(1, 7), st.sampled_from([np.float32, np.float16]), st.data())
def test_row_writer_equals_plain_assignment(tmp_path_factory, n, d, dtype, data):
    """Rows written through create_npy/RowWriter (one pwrite per run of consecutive rows, rows in any
    order) read back with np.load exactly as plain assignment into an array of zeros."""
    rng = np.random.default_rng(n * 7 + d)
    expected = np.zeros((n, d), dtype=dtype)
    path = tmp_path_factory.mktemp("w") / "w.npy"
    with open(path, "w+b") as handle:
        rows_out = matrix.create_npy(handle, (n, d), dtype)
        for _ in range(data.draw(st.integers(0, 6))):
            if data.draw(st.booleans()):
                lo = data.draw(st.integers(0, n - 1))
                rows = np.arange(lo, data.draw(st.integers(lo + 1, n)))
            else:
                rows = np.asarray(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20, unique=True)))
            values = rng.normal(size=(rows.size, d)).astype(np.float32)
            rows_out[rows] = values
            expected[rows] = values
    loaded = np.load(path)
    assert loaded.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(loaded, expected)
    np.testing.assert_array_equal(matrix.load(matrix.MatrixFile.open(path)), expected.astype(np.float32))


def test_a_fortran_ordered_file_is_refused_as_a_block_readable_matrix(tmp_path):
    np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((5, 3), np.float32)))
    with pytest.raises(ValueError, match="C-ordered"):
        matrix.MatrixFile.open(tmp_path / "f.npy")


def test_out_of_core_calibration_equals_a_sample_fit_for_each_k(tmp_path):
    """One pass assigning every k at once gives each k the labels kmeans_labels(fit_sample=...) gives it."""
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.normal(loc, 0.3, size=(700, 6)) for loc in (-3, 0, 3)]).astype(np.float32)
    file = _file(tmp_path, x)
    rows, recommended = clustering.calibrate_k(file, sample_size=500, seed=2, k_values=(2, 3, 5), progress=False,
                                               fit_sample=900)
    silhouette = clustering.CosineSilhouette(x, 500, seed=2)
    for row in rows:
        labels = clustering.kmeans_labels(x, row.k, seed=2, fit_sample=900)
        sizes = np.bincount(labels, minlength=row.k)
        assert row == clustering.CalibrationRow(row.k, silhouette.score(labels), int(sizes.min()),
                                                float(np.median(sizes)), int(sizes.max()))
    assert recommended == clustering.recommend_k(rows)
