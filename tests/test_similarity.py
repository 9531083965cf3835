"""Blockwise similarity statistics give exactly the numbers of the dense matrix they replace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order.diversity import similarity_stats


def _stats(upper: np.ndarray, size: int) -> dict:
    return {
        "sample_size": int(size),
        "mean": round(float(upper.mean()), 4),
        "std": round(float(upper.std()), 4),
        "median": round(float(np.median(upper)), 4),
        "n_above_0.9": int((upper > 0.9).sum()),
        "n_pairs": int(upper.size),
    }


def _sample(embeddings: np.ndarray, seed: int, max_samples: int) -> np.ndarray:
    n = embeddings.shape[0]
    rows = np.random.RandomState(seed).choice(n, min(max_samples, n), replace=False)
    return np.asarray(embeddings[rows], dtype=np.float32)


NO_PAIRS = {"mean": None, "std": None, "median": None, "n_above_0.9": 0, "n_pairs": 0}


def dense_similarity_stats(embeddings: np.ndarray, seed: int = 42, max_samples: int = 5000) -> dict:
    """The plain definition: the whole matrix (products exact in float64, each rounded once to
    float32), its upper triangle, numpy's float32 statistics."""
    sample = _sample(embeddings, seed, max_samples)
    size = sample.shape[0]
    if size < 2:
        return {"sample_size": size, **NO_PAIRS}
    wide = sample.astype(np.float64)
    cosine = (wide @ wide.T).astype(np.float32)
    return _stats(cosine[np.triu_indices(size, k=1)], size)


def previous_similarity_stats(embeddings: np.ndarray, seed: int = 42, max_samples: int = 5000) -> dict:
    """What similarity_stats was before it went blockwise: a dense float32 matrix product."""
    sample = _sample(embeddings, seed, max_samples)
    size = sample.shape[0]
    if size < 2:
        return {"sample_size": size, **NO_PAIRS}
    return _stats((sample @ sample.T)[np.triu_indices(size, k=1)], size)


def unit_rows(n: int, dim: int, seed: int, duplicates: int = 0, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    if n:
        x[: min(duplicates, n)] = x[0]  # identical rows: similarities of exactly 1, pairs above 0.9
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(dtype)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 160), dim=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       duplicates=st.integers(0, 30), max_samples=st.integers(1, 200), block_rows=st.integers(1, 70),
       sample_seed=st.integers(0, 1000))
def test_blockwise_equals_dense(n, dim, seed, duplicates, max_samples, block_rows, sample_seed):
    x = unit_rows(n, dim, seed, duplicates)
    ours = similarity_stats(x, seed=sample_seed, max_samples=max_samples, block_rows=block_rows)
    assert ours == dense_similarity_stats(x, seed=sample_seed, max_samples=max_samples)


@pytest.mark.parametrize("block_rows", [1, 2, 255, 256, 4096])
def test_block_edges_and_a_sample_of_the_rows(block_rows):
    x = unit_rows(1500, 64, seed=5, duplicates=40)
    ours = similarity_stats(x, seed=3, max_samples=1100, block_rows=block_rows)
    assert ours == dense_similarity_stats(x, seed=3, max_samples=1100)
    assert ours["n_pairs"] == 1100 * 1099 // 2 and ours["n_above_0.9"] > 0


def test_rows_that_are_not_float32_or_not_unit_length():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(400, 24))  # float64, norms around 5: similarities well outside [-1, 1]
    x[::7] = 0.0  # zero vectors (empty documents) have similarity 0 with everything
    assert similarity_stats(x, seed=1, block_rows=33) == dense_similarity_stats(x, seed=1)


def test_same_numbers_as_the_dense_float32_version_on_embedding_like_rows():
    # 5,000 of 20,000 rows in 30 tight clusters: many pairs above 0.9, as in real corpora. The
    # dense float32 product rounds each similarity's last bit differently depending on BLAS
    # tiling and thread count, so a pair within a float32 step of 0.9 may count on one side or
    # the other: the count may move by a few pairs of 12.5 million; the rest are equal.
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(30, 96))
    x = centres[rng.integers(0, 30, 20_000)] * 3 + rng.normal(size=(20_000, 96))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    ours, before = similarity_stats(x), previous_similarity_stats(x)
    assert ours["n_pairs"] == before["n_pairs"] == 5000 * 4999 // 2
    assert ours["n_above_0.9"] > 100_000
    assert abs(ours.pop("n_above_0.9") - before.pop("n_above_0.9")) <= 5
    assert ours == before


def test_fewer_than_two_rows_have_no_pairs():
    for n in (0, 1):
        stats = similarity_stats(np.ones((n, 4), np.float32))
        assert stats == dense_similarity_stats(np.ones((n, 4), np.float32))
        assert stats["n_pairs"] == 0 and stats["mean"] is None
