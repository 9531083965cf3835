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


# ---- reserving a matrix file's disk space --------------------------------------------------------


def test_create_npy_reserves_the_rows_and_reads_back_as_zeros_until_written(tmp_path):
    if matrix._FALLOCATE is None:
        pytest.skip("no fallocate on this system")
    path = tmp_path / "m.npy"
    with open(path, "w+b") as handle:
        rows = matrix.create_npy(handle, (1000, 64), np.float32)
        rows[np.arange(10, 20)] = np.ones((10, 64), np.float32)
    allocated = path.stat().st_blocks * 512
    if allocated < 1000 * 64 * 4:
        pytest.skip("this filesystem does not reserve space (the file stays sparse, as designed)")
    loaded = np.load(path)
    assert loaded.shape == (1000, 64) and loaded[10:20].all() and not loaded[:10].any() and not loaded[20:].any()


def _failing_fallocate(code):
    import ctypes

    def fallocate(fd, mode, offset, length):
        ctypes.set_errno(code)
        return -1
    return fallocate


def test_a_full_disk_fails_at_the_start_naming_the_file_and_leaves_no_temp(tmp_path, monkeypatch):
    import errno

    from diversity_order import caches
    from diversity_order.errors import UserError

    monkeypatch.setattr(matrix, "_FALLOCATE", _failing_fallocate(errno.ENOSPC))
    with pytest.raises(UserError, match=r"x_embeddings\.npy: no room on its disk for 21\.97 MiB of rows"):
        caches.Fill(tmp_path / "x_embeddings.npy", (10_000, 576), np.float32)
    assert list(tmp_path.iterdir()) == []


def test_a_filesystem_that_cannot_reserve_leaves_the_file_sparse_and_working(tmp_path, monkeypatch):
    import errno

    monkeypatch.setattr(matrix, "_FALLOCATE", _failing_fallocate(errno.EOPNOTSUPP))
    path = tmp_path / "m.npy"
    with open(path, "w+b") as handle:
        rows = matrix.create_npy(handle, (100, 8), np.float32)
        rows[np.arange(100)] = np.arange(800, dtype=np.float32).reshape(100, 8)
    np.testing.assert_array_equal(np.load(path), np.arange(800, dtype=np.float32).reshape(100, 8))


# ---- rows appended with O_DIRECT -----------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 600), st.integers(1, 40), st.sampled_from([np.float32, np.float16]), st.data())
def test_rows_appended_directly_read_back_as_plain_assignment(tmp_path_factory, n, d, dtype, data):
    """Rows written in file order from row 0 go through the direct appender (small stages, so many
    aligned writes, a header block read back and an unaligned rest), until a write breaks the order:
    the file reads back as plain assignment into zeros, whatever the order of the writes."""
    rng = np.random.default_rng(n * 7 + d)
    expected = np.zeros((n, d), dtype=dtype)
    path = tmp_path_factory.mktemp("direct") / "w.npy"
    with pytest.MonkeyPatch.context() as patch, open(path, "w+b") as handle:
        patch.setattr(matrix.DirectAppender, "STAGE", 2 * matrix.DirectAppender.ALIGN)
        writer = matrix.create_npy(handle, (n, d), dtype)
        writer.append_directly()
        at = 0
        # Each step appends that many rows; 0 writes a few rows anywhere (out of order: the rest is pwrite).
        steps = data.draw(st.lists(st.integers(0, 150), max_size=12))
        for step in [*steps, n]:
            if at >= n:
                break
            if step == 0:
                rows = np.asarray(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=5, unique=True)))
            else:
                rows = np.arange(at, min(at + step, n))
                at = int(rows[-1]) + 1
            values = rng.normal(size=(rows.size, d)).astype(np.float32)
            written = writer.write(rows, values)
            expected[rows] = values
            np.testing.assert_array_equal(written, values.astype(dtype))
        writer.finish()
    loaded = np.load(path)
    assert loaded.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(loaded, expected)


def test_a_device_refusing_the_alignment_gets_the_rows_through_the_page_cache(tmp_path, monkeypatch):
    import errno
    import os

    real_pwrite, real_open = os.pwrite, os.open
    direct, refused = set(), []

    def open_(path, flags, *args):
        fd = real_open(path, flags, *args)
        if flags & os.O_DIRECT:
            direct.add(fd)
        return fd

    def pwrite(fd, data, at):
        if fd in direct:
            refused.append(at)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, at)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(matrix.DirectAppender, "STAGE", matrix.DirectAppender.ALIGN)
    values = np.arange(3000 * 5, dtype=np.float32).reshape(3000, 5)
    path = tmp_path / "m.npy"
    with open(path, "w+b") as handle:
        writer = matrix.create_npy(handle, values.shape, np.float32)
        if not writer.append_directly():
            pytest.skip("no O_DIRECT here")
        for lo in range(0, 3000, 700):
            writer[np.arange(lo, min(lo + 700, 3000))] = values[lo: lo + 700]
        writer.finish()
    assert len(refused) == 1  # the first direct write failed; the appender used the page cache after it
    np.testing.assert_array_equal(np.load(path), values)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 400), st.integers(1, 40), st.sampled_from(["float32", "float16"]), st.data())
def test_direct_block_reads_and_parallel_row_runs_equal_the_array(tmp_path_factory, n, d, dtype, data):
    """Blocks read with O_DIRECT (a span not aligned to the file's blocks) and scattered rows read as
    runs by several threads give the rows as stored."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matrix, "DIRECT_READ_BYTES", 1)
        patch.setattr(matrix, "READ_THREADS", 3)
        _check_direct_and_parallel_reads(tmp_path_factory, n, d, dtype, data)


def _check_direct_and_parallel_reads(tmp_path_factory, n, d, dtype, data):
    array = np.random.default_rng(n * 7 + d).normal(size=(n, d)).astype(dtype)
    file = _file(tmp_path_factory.mktemp("d"), array)
    lo = data.draw(st.integers(0, n - 1))
    hi = data.draw(st.integers(lo, n))
    np.testing.assert_array_equal(file.block(lo, hi), array[lo:hi])
    picked = np.unique(np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=60)), dtype=np.int64))
    np.testing.assert_array_equal(file.rows(picked), array[picked])
    rows = np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=60)), dtype=np.int64)
    np.testing.assert_array_equal(matrix.read_rows(file, rows, 16), array[rows].astype(np.float32))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 40), st.integers(1, 12), st.sampled_from(["float16", "float32", "float64"]), st.data())
def test_non_finite_rows_are_the_rows_holding_nan_or_inf(n, d, dtype, data):
    """The sum test finds exactly the rows a value-by-value check finds, whatever the values: NaN, inf
    beside -inf (their sum is NaN), and finite values whose sum overflows (kept)."""
    finfo = np.finfo(dtype)
    values = st.sampled_from([0.0, 1.0, -2.5, np.nan, np.inf, -np.inf, float(finfo.max), -float(finfo.max)])
    block = np.asarray(data.draw(st.lists(st.lists(values, min_size=d, max_size=d), min_size=n, max_size=n)),
                       dtype=dtype).reshape(n, d)
    expected = np.flatnonzero(~np.isfinite(block).all(axis=1))
    np.testing.assert_array_equal(matrix.non_finite_rows(block, step=data.draw(st.integers(1, 8))), expected)


def test_sizes_in_the_log_keep_small_ones_apart():
    from diversity_order.clustering import plan_for_shape
    from diversity_order.matrix import size_text

    assert [size_text(n) for n in (0, 1023, 1024, 5 << 20, (3 << 30) // 2)] == \
        ["0 bytes", "1023 bytes", "1.00 KiB", "5.00 MiB", "1.50 GiB"]
    # A reviewer's --memory-budget 2M beside 11 MB of embeddings read "0.01 GiB ... exceed ... 0.00 GiB".
    assert plan_for_shape(5000, 576, 2 << 20).reason.startswith(
        "10.99 MiB of embeddings exceed the memory budget of 2.00 MiB")
    assert plan_for_shape(5000, 50, 2 << 20).reason == "976.56 KiB of embeddings fit the memory budget of 2.00 MiB"
