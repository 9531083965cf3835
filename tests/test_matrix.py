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
