"""Shallow embeddings: batched tokenization and pooling equal the per-document reference."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from diversity_order.embed import embed_and_count, mean_pool_normalized
from diversity_order.records import scan_jsonl
from diversity_order.tokenizer import DocumentTokenizer
from reference_impl import ref_shallow_embedding


@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy table (CPU)", "torch table (GPU path)"])
def test_pooling_equals_reference_loop_including_clamp_and_empty(as_torch):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(50, 8)).astype(np.float32)
    docs = [[1, 2, 3], [], [49, 49, 0], [7], [-3, 60, 5]]  # out-of-range ids are clamped
    flat = np.array([i for d in docs for i in d], dtype=np.int64)
    lengths = np.array([len(d) for d in docs])
    ours = mean_pool_normalized(torch.from_numpy(table) if as_torch else table, flat, lengths)
    assert ours.dtype == np.float32 and not np.isnan(ours).any()
    for row, ids in zip(ours, docs):
        if ids:
            np.testing.assert_allclose(row, ref_shallow_embedding(ids, table), rtol=1e-5, atol=1e-6)
        else:
            assert not row.any()  # the empty document is the zero vector, not NaN


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.lists(st.integers(0, 30), min_size=1, max_size=40),
       st.integers(0, 2**32 - 1))
def test_compiled_pooling_equals_a_plain_loop_and_torch(vocab, dim, lengths, seed):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(vocab, dim)).astype(np.float32)
    table[rng.random(vocab) < 0.1] = 0.0  # zero rows: a document of only those sums to zero
    lengths = np.array(lengths, dtype=np.int64)
    flat = rng.integers(-5, vocab + 5, lengths.sum())  # some out of range: clamped
    ours = mean_pool_normalized(table, flat, lengths)
    at = 0
    for row, n in zip(ours, lengths):
        ids = flat[at: at + n].tolist()
        at += n
        mean = np.mean([table[min(max(i, 0), vocab - 1)] for i in ids], axis=0, dtype=np.float64) if ids else None
        if mean is None or not np.linalg.norm(mean) > 0:
            assert not row.any()
        else:
            np.testing.assert_allclose(row, mean / np.linalg.norm(mean), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours, mean_pool_normalized(torch.from_numpy(table), flat, lengths), rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=0, max_size=80), st.integers(2, 6), st.integers(0, 2**32 - 1))
def test_pooling_on_several_threads_gives_the_same_bits(lengths, threads, seed):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(40, 7)).astype(np.float32)
    lengths = np.array(lengths, dtype=np.int64)
    flat = rng.integers(0, 40, lengths.sum())
    one = mean_pool_normalized(table, flat, lengths)
    several = mean_pool_normalized(table, flat, lengths, threads=threads)
    assert several.shape == one.shape and several.tobytes() == one.tobytes()


def test_one_pooling_thread_per_eight_usable_cores(monkeypatch):
    from diversity_order import embed

    for cores, expected in ((1, 1), (2, 1), (15, 1), (16, 2), (64, 8)):
        monkeypatch.setattr(embed, "usable_cores", lambda cores=cores: cores)
        assert embed.pooling_threads() == expected


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(1, 24), st.lists(st.integers(0, 20), min_size=1, max_size=20),
       st.integers(0, 2**32 - 1))
def test_compiled_pooling_is_bit_for_bit_its_documented_arithmetic(vocab, dim, lengths, seed):
    """float32 sum in token order, float64 sum of squares in dimension order, float32(sum / norm): no step
    whose rounding depends on a SIMD width, so every machine writes the same cache bytes."""
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(vocab, dim)).astype(np.float32)
    lengths = np.array(lengths, dtype=np.int64)
    flat = rng.integers(0, vocab, lengths.sum())
    ours = mean_pool_normalized(table, flat, lengths)
    at = 0
    for row, n in zip(ours, lengths):
        acc = [np.float32(0.0)] * dim
        for t in flat[at: at + n].tolist():
            acc = [np.float32(a + np.float32(v)) for a, v in zip(acc, table[t].tolist())]
        at += n
        squares = 0.0
        for a in acc:
            squares += float(a) * float(a)
        norm = math.sqrt(squares)
        expected = [np.float32(float(a) / norm) if norm > 0 else np.float32(0.0) for a in acc]
        assert row.tobytes() == np.array(expected, dtype=np.float32).tobytes()


def test_embedding_on_the_cpu_never_imports_torch(tmp_path, tiny_model_dir):
    """Its import costs about a second of a 6-second run: a CPU run must not need it."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"galaxy orbit {i} " * (i % 7 + 1)}) + "\n" for i in range(40)))
    script = f"""
import sys
from diversity_order.cli.curate_dataset import main
code = main(["--input", {str(src)!r}, "--output", {str(tmp_path / "out.jsonl")!r}, "--model-dir",
             {str(tiny_model_dir)!r}, "--n-clusters", "3", "--no-plot", "--device", "cpu"])
print("exit", code, "torch imported" if "torch" in sys.modules else "no torch")
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DIVERSITY_ORDER_CACHE_DIR": ""}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.stdout.strip().splitlines()[-1:] == ["exit 0 no torch"], done.stderr[-2000:]


def test_auto_device_without_a_gpu_driver_is_the_cpu_without_asking_torch(monkeypatch):
    from diversity_order import runtime

    monkeypatch.setattr(runtime, "_gpu_driver_present", lambda: False)
    assert runtime.resolve_device("auto", 0) == "cpu"
    assert runtime.resolve_device("cpu", 3) == "cpu"
    with pytest.raises(runtime.UserError, match="--device tpu"):
        monkeypatch.setattr(runtime, "_gpu_driver_present", lambda: True)
        runtime.resolve_device("tpu", 0)


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


def test_prefetched_yields_every_item_in_order_and_raises_where_the_producer_failed():
    import pytest

    from diversity_order.runtime import prefetched

    assert list(prefetched(iter(range(100)), depth=2)) == list(range(100))

    def failing():
        yield from range(5)
        raise ValueError("line 6 is not JSON")

    seen = []
    with pytest.raises(ValueError, match="line 6"):
        for item in prefetched(failing()):
            seen.append(item)
    assert seen == list(range(5))  # every item before the failure arrived first


def test_prefetched_stops_its_producer_when_the_consumer_stops():
    import threading
    import time

    from diversity_order.runtime import prefetched

    produced = []

    def endless():
        while True:
            produced.append(len(produced))
            yield produced[-1]

    items = prefetched(endless(), depth=2)
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    items.close()
    time.sleep(0.5)
    count = len(produced)
    time.sleep(0.3)
    assert len(produced) == count <= 3 + 2 + 2  # nothing more is read once the consumer is gone
    assert not [t for t in threading.enumerate() if t.name == "prefetch"]


def test_behind_runs_jobs_in_order_and_reports_a_jobs_error_at_the_next_step():
    import pytest

    from diversity_order.runtime import Behind

    done = []
    behind = Behind("test")
    for i in range(20):
        behind.submit(done.append, i)
    behind.wait()
    assert done == list(range(20))

    def fail():
        raise RuntimeError("disk full")

    behind.submit(fail)
    with pytest.raises(RuntimeError, match="disk full"):
        behind.submit(done.append, 99)
    assert done[-1] == 19  # the job after the failed one never ran
    behind.submit(fail)
    behind.wait(raise_error=False)  # the caller's own error takes precedence
    behind.wait()


def test_an_error_reading_mid_run_is_the_error_reported_and_batches_before_it_were_finished(tmp_path, tiny_model_dir):
    import pytest

    from diversity_order.errors import UserError

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} about orbits"}) + "\n" for i in range(40)))
    index = scan_jsonl(src, progress=False)

    class FailsAtRow28:
        """The index, except that reading stops with an error at row 28 (as a record changed on disk would)."""

        line_numbers = index.line_numbers

        def iter_documents(self, rows, *limits):
            for batch_rows, texts in index.iter_documents(rows, *limits):
                if batch_rows.max() >= 28:
                    raise UserError(f"{src}:29: the record changed since it was indexed")
                yield batch_rows, texts

    tokenizer = DocumentTokenizer(tiny_model_dir)
    with safe_open(tiny_model_dir / "model.safetensors", "pt") as f:
        table = f.get_tensor("model.embed_tokens.weight").float()
    out = np.zeros((40, table.shape[1]), np.float32)
    with pytest.raises(UserError, match="in.jsonl:29"):
        embed_and_count(FailsAtRow28(), np.arange(40), tokenizer, table, batch_docs=4, progress=False, out=out)
    assert out[:28].any(axis=1).all() and not out[28:].any()  # batches before the error were finished, no later
