"""The cluster cloud's 2-D projection cache (projection.cached_umap): reused across outputs through the
cache registry, with the log naming where it came from and a copy left beside the new output."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from diversity_order import caches, projection


def test_a_projection_found_through_the_registry_is_named_and_copied(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(tmp_path / "registry"))
    calls = []

    def fake_umap(reducer, points):
        calls.append(reducer.random_state)
        return points[:, :2].astype(np.float32) * 2

    monkeypatch.setattr(projection, "_fit_umap", fake_umap)
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


# ---- after records change: placed among the kept fit, or fitted again ------------------------------


@pytest.fixture()
def fits(monkeypatch):
    """UMAP replaced by a quick stand-in (its first two inputs, stretched), fitted on samples of 50: the calls."""
    calls = []

    def quick_umap(reducer, points):
        calls.append(points.shape[0])
        return (points[:, :2] * 3).astype(np.float32)

    monkeypatch.setattr(projection, "_fit_umap", quick_umap)
    monkeypatch.setattr(projection, "UMAP_FIT_SAMPLE", 50)
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")
    return calls


def clustered(n, seed, dim=64):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(size=(4, dim)) * 5
    return (centres[rng.integers(0, 4, n)] + rng.normal(size=(n, dim))).astype(np.float32)


def placed_by_a_plain_loop(rows, fit, k=10):
    """Where rows sit among the fitted points, written out: PCA by its formula, the k nearest, 1/distance weights."""
    out = []
    for row in rows:
        point = (row.astype(np.float64) - fit.mean) @ fit.components.T
        distance = np.sqrt(((fit.anchors.astype(np.float64) - point) ** 2).sum(axis=1))
        nearest = np.argsort(distance, kind="stable")[:k]
        weights = 1.0 / (distance[nearest] + 1e-6)
        out.append((fit.anchor_xy[nearest] * weights[:, None]).sum(axis=0) / weights.sum())
    return np.array(out)


def test_records_added_later_are_placed_among_the_kept_fit_not_fitted_again(tmp_path, fits, caplog):
    path = tmp_path / "B_umap2d.npy"
    embeddings, fingerprints = clustered(200, 0), np.arange(1, 201, dtype=np.uint64)
    embeddings[180:], fingerprints[180:] = embeddings[:20], fingerprints[:20]  # texts that several records have
    first = projection.cached_umap(path, embeddings, fingerprints, 7)
    assert fits == [50] and projection.fit_path(path).exists()
    fit = projection.load_fit(projection.fit_path(path))
    assert fit.rows == 200 and fit.fingerprints.size == 50 and fit.components.shape == (50, 64)

    caplog.set_level(logging.INFO, logger="diversity_order")
    added = clustered(60, 1)
    more, names = np.concatenate([embeddings, added]), np.concatenate([fingerprints, np.arange(201, 261, dtype=np.uint64)])
    second = projection.cached_umap(path, more, names, 7)
    assert fits == [50]  # not fitted again
    np.testing.assert_array_equal(second[:200], first[caches.match_rows(fingerprints, fingerprints)])  # by text
    np.testing.assert_allclose(second[200:], placed_by_a_plain_loop(added, fit), rtol=1e-4, atol=1e-4)
    assert "60 new or edited record(s) placed among the 50 points UMAP was fitted on" in caplog.text
    assert "for a new layout, delete B_umap2d.npy and B_umap2d.fit.npz" in caplog.text

    # Unchanged since: the cache as it is. Records moved and some removed: their positions follow their texts.
    assert np.array_equal(projection.cached_umap(path, more, names, 7), second)
    keep = np.random.default_rng(2).permutation(260)[:240]
    caplog.clear()
    moved = projection.cached_umap(path, more[keep], names[keep], 7)
    assert fits == [50]
    assert "no new or edited records to place (records were removed or moved), the layout kept" in caplog.text
    assert "0 new or edited" not in caplog.text
    np.testing.assert_array_equal(moved, second[caches.match_rows(names, names[keep])])  # a text's one position


def test_a_layout_is_fitted_again_when_the_kept_fit_no_longer_stands_for_the_input(tmp_path, fits, caplog):
    path = tmp_path / "B_umap2d.npy"
    fit_file = projection.fit_path(path)
    embeddings, fingerprints = clustered(200, 0), np.arange(1, 201, dtype=np.uint64)
    caplog.set_level(logging.INFO, logger="diversity_order")

    def rerun(vectors, names):
        caplog.clear()
        projection.cached_umap(path, vectors, names, 7)
        return caplog.text

    projection.cached_umap(path, embeddings, fingerprints, 7)
    # The same texts embedded otherwise (another model): positions of the earlier layout would not fit them.
    assert "embed differently now" in rerun(embeddings * 2, fingerprints) and fits == [50, 50]
    # More than twice the records fitted for.
    grown = np.concatenate([embeddings * 2, clustered(250, 3)])
    assert "450 records where it was fitted for 200" in rerun(grown, np.arange(1, 451, dtype=np.uint64))
    assert fits == [50, 50, 50]
    # Fewer than half the fitted texts left.
    fitted = projection.load_fit(fit_file).fingerprints
    keep = ~np.isin(np.arange(1, 451, dtype=np.uint64), fitted[:30])
    assert "20 of the 50 texts it was fitted on are left" in rerun(grown[keep], np.arange(1, 451, dtype=np.uint64)[keep])
    assert len(fits) == 4
    # The cached projection replaced by another one: the kept fit is not the one behind its positions.
    names = np.arange(1, 451, dtype=np.uint64)[keep]
    caches.store(path, {"kind": "umap2d", "embeddings": "other", "seed": 7}, names, np.zeros((names.size, 2), np.float32))
    assert "not the one made with it" in rerun(np.concatenate([grown[keep], clustered(5, 4)]),
                                               np.concatenate([names, np.arange(900, 905, dtype=np.uint64)]))
    assert len(fits) == 5
    # Embeddings of another width (--load-embeddings of another model): said, and fitted again.
    wider = np.concatenate([grown[keep], clustered(6, 5)])
    wider = np.concatenate([wider, wider[:, :8]], axis=1)
    names = np.concatenate([names, np.arange(900, 906, dtype=np.uint64)])
    assert "the embeddings are 72 wide, where it was fitted on 64" in rerun(wider, names)
    assert len(fits) == 6
    # A fit file edited into arrays that cannot be one fit: said, and fitted again, never a traceback.
    stored = dict(np.load(fit_file))
    for edit, said in ((dict(stored, components=stored["components"][:, :10]), "its PCA does not match"),
                       (dict(stored, anchor_xy=stored["anchor_xy"][:, :1]), "disagree on the points"),
                       (dict(stored, fingerprints=stored["fingerprints"][None]), "no fitted texts"),
                       (dict(stored, anchor_xy=stored["anchor_xy"] * np.nan), "not finite")):
        np.savez(fit_file, **edit)
        names = np.concatenate([names, np.arange(names.max() + 1, names.max() + 3, dtype=np.uint64)])
        wider = np.concatenate([wider, wider[:2]])
        assert said in rerun(wider, names)
    # A damaged fit file: said, and fitted again.
    fit_file.write_bytes(b"PK\x03\x04 not a zip after all")
    names = np.concatenate([names, np.arange(names.max() + 1, names.max() + 3, dtype=np.uint64)])
    assert "B_umap2d.fit.npz unreadable" in rerun(np.concatenate([wider, wider[:2]]), names)
    assert len(fits) == 11 and projection.load_fit(fit_file) is not None  # written anew


def test_a_projection_taken_from_another_run_brings_its_fit_so_an_append_is_placed(tmp_path, fits, monkeypatch,
                                                                                    caplog):
    """A new user's second output linked the first's projection but not its fit: the next 1% append fitted UMAP
    again (72 s, not 18), and the log blamed changed embeddings."""
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(tmp_path / "registry"))
    embeddings, fingerprints = clustered(200, 0), np.arange(1, 201, dtype=np.uint64)
    first, second = tmp_path / "run1" / "A_umap2d.npy", tmp_path / "run2" / "B_umap2d.npy"
    first.parent.mkdir()
    second.parent.mkdir()
    projection.cached_umap(first, embeddings, fingerprints, 7)
    assert fits == [50]
    caplog.set_level(logging.INFO, logger="diversity_order")
    projection.cached_umap(second, embeddings, fingerprints, 7)
    assert fits == [50] and projection.fit_path(second).read_bytes() == projection.fit_path(first).read_bytes()
    assert f"2-D layout fit: B_umap2d.fit.npz, copied from {projection.fit_path(first)}" in caplog.text
    caplog.clear()
    added = clustered(4, 1)
    more = np.concatenate([embeddings, added])
    names = np.concatenate([fingerprints, np.arange(201, 205, dtype=np.uint64)])
    projection.cached_umap(second, more, names, 7)
    assert fits == [50]  # placed, not fitted again
    assert "4 new or edited record(s) placed among the 50 points UMAP was fitted on" in caplog.text


def test_an_append_without_a_kept_fit_says_so_when_it_fits_again(tmp_path, fits, caplog):
    path = tmp_path / "B_umap2d.npy"
    embeddings, fingerprints = clustered(200, 0), np.arange(1, 201, dtype=np.uint64)
    projection.cached_umap(path, embeddings, fingerprints, 7)
    projection.fit_path(path).unlink()
    caplog.set_level(logging.INFO, logger="diversity_order")
    more = np.concatenate([embeddings, clustered(3, 1)])
    projection.cached_umap(path, more, np.concatenate([fingerprints, np.arange(201, 204, dtype=np.uint64)]), 7)
    assert fits == [50, 50]
    assert "the records changed, and no layout fit is kept (B_umap2d.fit.npz) to place them among" in caplog.text
    assert "the embeddings or --seed changed" not in caplog.text
