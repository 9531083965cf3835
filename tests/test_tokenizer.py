"""DocumentTokenizer: batch ids equal one-document-at-a-time ids, and reading tokenizer.json
directly gives exactly what transformers' AutoTokenizer gives, or is not done."""

from __future__ import annotations

import json
import os
import shutil

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


def split_ids(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    return [piece.tolist() for piece in np.split(flat, np.cumsum(lengths)[:-1])] if lengths.size else []


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
def test_smollm2_read_directly_equals_transformers(texts):
    tokenizer = _smollm2()
    assert tokenizer._transformers_tokenizer is None  # its tokenizer.json is used as it is
    assert split_ids(*tokenizer.encode_batch(texts)) == _cached_transformers_ids(tokenizer, texts)


_LOADED: dict[str, DocumentTokenizer] = {}


def _smollm2() -> DocumentTokenizer:
    path = os.environ["DIVERSITY_ORDER_SMOLLM2"]
    if path not in _LOADED:
        _LOADED[path] = DocumentTokenizer(path)
    return _LOADED[path]


# --- tokenizer.json read directly, without transformers -----------------------------------


def transformers_ids(tokenizer: DocumentTokenizer, texts: list[str]) -> list[list[int]]:
    """What the reference computes: AutoTokenizer's encode, one text at a time."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tokenizer.model_dir), local_files_only=True)
    return [hf.encode(text, add_special_tokens=False) for text in texts]


SAMPLE_TEXTS = ["galaxy oven <s> the</s>", "", "  def f(x):\n\treturn x  # 🙂", "<unk><mask> e\u0301 日本語",
                "[MASK] <extra> x"]


def test_a_plain_tokenizer_json_is_read_without_transformers(tiny_tokenizer):
    assert tiny_tokenizer._transformers_tokenizer is None
    assert split_ids(*tiny_tokenizer.encode_batch(SAMPLE_TEXTS)) == transformers_ids(tiny_tokenizer, SAMPLE_TEXTS)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_tokenizer.model_dir), local_files_only=True)
    assert tiny_tokenizer.vocab_size == len(hf)
    # The same fingerprint as when transformers loaded it: token-count caches stay valid.
    via_transformers = DocumentTokenizer.__new__(DocumentTokenizer)
    via_transformers._backend = hf.backend_tokenizer
    via_transformers.model_dir = tiny_tokenizer.model_dir  # its chat template (if any) is part of the fingerprint
    assert via_transformers._fingerprint() == tiny_tokenizer.fingerprint


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=TEXTS)
def test_direct_read_equals_transformers_on_random_text(tiny_tokenizer, texts):
    assert split_ids(*tiny_tokenizer.encode_batch(texts)) == _cached_transformers_ids(tiny_tokenizer, texts)


_HF_CACHE: dict = {}


def _cached_transformers_ids(tokenizer, texts):
    from transformers import AutoTokenizer

    key = str(tokenizer.model_dir)
    if key not in _HF_CACHE:
        _HF_CACHE[key] = AutoTokenizer.from_pretrained(key, local_files_only=True)
    return [_HF_CACHE[key].encode(text, add_special_tokens=False) for text in texts]


def _variant(tiny_model_dir, tmp_path, **config_changes):
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(config_changes)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("changes", [
    {"mask_token": "<mask>"},  # transformers adds a special token tokenizer.json lacks: "<mask>" stays whole
    {"additional_special_tokens": ["<extra>"]},
    {"added_tokens_decoder": {"3": {"content": "[MASK]", "lstrip": False, "normalized": False, "rstrip": False,
                                    "single_word": False, "special": True}}},
    {"tokenizer_class": "GPT2Tokenizer"},  # a model-specific class may rebuild the pipeline
    {"add_prefix_space": True},  # an option we do not know to be harmless
])
def test_configs_that_change_the_pipeline_go_through_transformers(tiny_model_dir, tmp_path, changes):
    folder = _variant(tiny_model_dir, tmp_path, **changes)
    tokenizer = DocumentTokenizer(folder)
    assert tokenizer._transformers_tokenizer is not None
    assert split_ids(*tokenizer.encode_batch(SAMPLE_TEXTS)) == transformers_ids(tokenizer, SAMPLE_TEXTS)


def test_a_special_token_transformers_would_add_changes_the_ids(tiny_model_dir, tmp_path):
    # Why the check above matters: read directly, "<mask>" would be split into pieces.
    folder = _variant(tiny_model_dir, tmp_path, mask_token="<mask>")
    from tokenizers import Tokenizer

    direct = Tokenizer.from_file(str(folder / "tokenizer.json")).encode("a <mask> b", add_special_tokens=False).ids
    assert DocumentTokenizer(folder).encode("a <mask> b") != direct


def test_a_model_folder_without_a_tokenizer_says_which_files_it_lacks(tmp_path, tiny_model_dir):
    from diversity_order.errors import UserError
    from diversity_order.tokenizer import TOKENIZER_FILES, DocumentTokenizer

    folder = tmp_path / "weights_only"
    folder.mkdir()
    shutil.copy(tiny_model_dir / "config.json", folder)
    with pytest.raises(UserError) as caught:
        DocumentTokenizer(folder)
    said = str(caught.value)
    assert said.startswith(f"--model-dir {folder}: cannot load a tokenizer (")
    assert f"it has none of the tokenizer files ({', '.join(TOKENIZER_FILES)})" in said and "\n" not in said
    shutil.copy(tiny_model_dir / "tokenizer_config.json", folder)  # the config without the vocabulary
    with pytest.raises(UserError, match="it has tokenizer_config.json of the tokenizer files"):
        DocumentTokenizer(folder)


def test_special_tokens_a_chat_template_prints_key_its_caches(tiny_model_dir, tmp_path):
    # transformers hands the template the special tokens tokenizer_config.json sets: one it prints changed there
    # alone changes every rendered conversation, so the fingerprint (every cache's key) changes with it.
    folder = _variant(tiny_model_dir, tmp_path)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(bos_token="<s>", eos_token="</s>")
    template = folder / "chat_template.jinja"

    def fingerprint(**changes) -> str:
        config_file.write_text(json.dumps(config | changes))
        return DocumentTokenizer(folder).fingerprint

    template.write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    printed = fingerprint()
    assert fingerprint(bos_token="<unk>") != printed
    assert fingerprint(eos_token="<unk>") == printed  # a token it does not print leaves its caches valid
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<unk>"}))
    assert fingerprint() != printed
    (folder / "special_tokens_map.json").unlink()

    # A named token of extra_special_tokens (transformers hands it to the template by its name)
    template.write_text("{{ image_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    named = fingerprint(extra_special_tokens={"image_token": "<s>"})
    assert fingerprint(extra_special_tokens={"image_token": "</s>"}) != named
    assert fingerprint(extra_special_tokens={"image_token": "<s>", "audio_token": "</s>"}) == named

    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    plain = fingerprint()
    assert fingerprint(bos_token="<unk>") == plain  # a template that prints none keys its caches as before
