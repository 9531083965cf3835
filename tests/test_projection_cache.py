"""The cluster cloud's 2-D projection cache (projection.cached_umap): reused across outputs through the
cache registry, with the log naming where it came from and a copy left beside the new output."""

from __future__ import annotations

import logging

import numpy as np

from diversity_order import projection


def test_a_projection_found_through_the_registry_is_named_and_copied(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(tmp_path / "registry"))
    calls = []

    def fake_umap(embeddings, seed):
        calls.append(seed)
        return embeddings[:, :2].astype(np.float32) * 2

    monkeypatch.setattr(projection, "umap_projection", fake_umap)
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(40, 8)).astype(np.float32)
    fingerprints = np.arange(1, 41, dtype="<u8")
    first = tmp_path / "run1" / "A_umap2d.npy"
    second = tmp_path / "run2" / "B_umap2d.npy"
    first.parent.mkdir()
    second.parent.mkdir()
    computed = projection.cached_umap(first, embeddings, fingerprints, 7)
    assert calls == [7]
    caplog.set_level(logging.INFO, logger="diversity_order")
    reused = projection.cached_umap(second, embeddings, fingerprints, 7)
    assert calls == [7]  # not computed again
    np.testing.assert_array_equal(reused, computed)
    line = next(r.getMessage() for r in caplog.records if "2-D projection" in r.getMessage())
    assert str(first) in line  # names the file it read (it said only the new output's name, where none was)
    assert second.exists()  # a copy beside the new output: the next run reads it there
    caplog.clear()
    projection.cached_umap(second, embeddings, fingerprints, 7)
    assert calls == [7]
    assert any("B_umap2d.npy" in r.getMessage() for r in caplog.records)


def test_umap_warnings_are_one_log_line_each_not_stderr(capfd, caplog):
    """On many identical documents UMAP's spectral start fails and it warns over several lines (and a
    source line) on stderr; the run logs each warning once, on one line, and the fit's result is kept."""
    import warnings

    class WarningReducer:
        def fit_transform(self, points):
            for _ in range(2):
                warnings.warn("Spectral initialisation failed! The eigenvector solver\nfailed. Consider\n"
                              "adding some noise.\n\nFalling back to random initialisation!", UserWarning, stacklevel=2)
            return np.ones((points.shape[0], 2))

    with caplog.at_level(logging.INFO, logger="diversity_order.projection"):
        xy = projection._fit_umap(WarningReducer(), np.zeros((5, 3)))
    assert xy.dtype == np.float32 and xy.shape == (5, 2) and (xy == 1).all()
    assert capfd.readouterr().err == ""
    lines = [r.getMessage() for r in caplog.records if "UMAP" in r.getMessage()]
    assert lines == ["UMAP (the cluster cloud's layout only): Spectral initialisation failed! The eigenvector "
                     "solver failed. Consider adding some noise. Falling back to random initialisation!"]
