"""DocumentTokenizer.encode_batch: the same ids as encoding each document on its own."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diversity_order.tokenizer import DocumentTokenizer

# Words of the tiny tokenizer's training text, its special tokens, code, and arbitrary Unicode.
PIECES = st.one_of(
    st.sampled_from(["galaxy", "oven", "the", " of", "def", "return", "<s>", "</s>", "<unk>", "  ", "\n", "\t",
                     "x = 1  # ok", "日本語", "e\u0301", "🙂", "\u00a0", "\r\n"]),
    st.text(max_size=12),
)
TEXTS = st.lists(st.lists(PIECES, max_size=12).map("".join), min_size=0, max_size=20)


def plain_loop(tokenizer: DocumentTokenizer, texts: list[str]) -> tuple[list[int], list[int]]:
    """One document at a time, the way the reference counts and embeds."""
    ids = [tokenizer.encode(text) for text in texts]
    return [i for doc in ids for i in doc], [len(doc) for doc in ids]


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    return DocumentTokenizer(tiny_model_dir)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=TEXTS)
def test_batch_equals_one_document_at_a_time(tiny_tokenizer, texts):
    flat, lengths = tiny_tokenizer.encode_batch(texts)
    assert flat.dtype == np.int64 and lengths.dtype == np.int64
    assert (flat.tolist(), lengths.tolist()) == plain_loop(tiny_tokenizer, texts)


@pytest.mark.skipif(not os.environ.get("DIVERSITY_ORDER_SMOLLM2"), reason="set DIVERSITY_ORDER_SMOLLM2=model folder")
@settings(max_examples=100, deadline=None)
@given(texts=TEXTS)
def test_batch_equals_one_document_at_a_time_smollm2(texts):
    tokenizer = _smollm2()
    flat, lengths = tokenizer.encode_batch(texts)
    assert (flat.tolist(), lengths.tolist()) == plain_loop(tokenizer, texts)


_LOADED: dict[str, DocumentTokenizer] = {}


def _smollm2() -> DocumentTokenizer:
    path = os.environ["DIVERSITY_ORDER_SMOLLM2"]
    if path not in _LOADED:
        _LOADED[path] = DocumentTokenizer(path)
    return _LOADED[path]
