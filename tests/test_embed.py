"""Shallow embeddings: batched tokenization and pooling equal the per-document reference."""

import json

import numpy as np
import torch
from safetensors import safe_open

from diversity_order.embed import embed_and_count, mean_pool_normalized
from diversity_order.records import scan_jsonl
from diversity_order.tokenizer import DocumentTokenizer
from reference_impl import ref_shallow_embedding


def test_pooling_equals_reference_loop_including_clamp_and_empty():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(50, 8)).astype(np.float32)
    docs = [[1, 2, 3], [], [49, 49, 0], [7], [-3, 60, 5]]  # out-of-range ids are clamped
    flat = np.array([i for d in docs for i in d], dtype=np.int64)
    lengths = np.array([len(d) for d in docs])
    ours = mean_pool_normalized(torch.from_numpy(table), flat, lengths)
    assert ours.dtype == np.float32 and not np.isnan(ours).any()
    for row, ids in zip(ours, docs):
        if ids:
            np.testing.assert_allclose(row, ref_shallow_embedding(ids, table), rtol=1e-5, atol=1e-6)
        else:
            assert not row.any()  # the empty document is the zero vector, not NaN


def test_pipeline_embeddings_equal_per_document_reference(tmp_path, tiny_model_dir, caplog):
    texts = ["galaxy nebula orbit", "", "flour butter oven " * 40, "def return yield", "the of and"]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    index = scan_jsonl(src, progress=False)
    tokenizer = DocumentTokenizer(tiny_model_dir)
    with safe_open(tiny_model_dir / "model.safetensors", "pt") as f:
        table = f.get_tensor("model.embed_tokens.weight").float()
    vectors, counts, stats = embed_and_count(index, np.arange(5), tokenizer, table, batch_docs=2, progress=False)
    for i, text in enumerate(texts):
        ids = tokenizer._hf.encode(text, add_special_tokens=False)  # the reference's call
        assert counts[i] == len(ids)
        if ids:
            np.testing.assert_allclose(vectors[i], ref_shallow_embedding(ids, table.numpy()), rtol=1e-5, atol=1e-6)
    assert not vectors[1].any() and counts[1] == 0
    assert stats.empty_rows == [1]
    assert "1 document(s) have no tokens (lines 2)" in caplog.text


def test_batch_encoding_equals_single_encoding(tiny_model_dir):
    tokenizer = DocumentTokenizer(tiny_model_dir)
    texts = ["  leading spaces", "unicode: café ☕ 数据", "", "x" * 5000, "tabs\tand\nnewlines"]
    flat, lengths = tokenizer.encode_batch(texts)
    pieces = np.split(flat, np.cumsum(lengths)[:-1])
    assert [p.tolist() for p in pieces] == [tokenizer.encode(t) for t in texts]
