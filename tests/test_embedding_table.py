"""Finding and reading only the input-embedding table of tiny random checkpoints."""

from __future__ import annotations

import json
import logging
import os
import shutil

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import pytest
import torch
import transformers as tf
from safetensors.torch import save_file

from diversity_order import embedding_table as et
from diversity_order.embedding_table import EmbeddingTable, find_embedding_tensor_name, load_embedding_table
from diversity_order.errors import UserError

VOCAB = 160
HIDDEN = 16
_ATTN = dict(hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)

# One tiny config per architecture family; all build with from_config on transformers 5.x.
CONFIGS = {
    "llama": lambda: tf.LlamaConfig(num_key_value_heads=1, **_ATTN),
    "mistral": lambda: tf.MistralConfig(num_key_value_heads=1, **_ATTN),
    "qwen2": lambda: tf.Qwen2Config(num_key_value_heads=1, **_ATTN),
    "qwen3": lambda: tf.Qwen3Config(num_key_value_heads=1, head_dim=8, **_ATTN),
    "gemma": lambda: tf.GemmaConfig(num_key_value_heads=1, head_dim=8, **_ATTN),
    "gemma2": lambda: tf.Gemma2Config(num_key_value_heads=1, head_dim=8, **_ATTN),
    "gpt2": lambda: tf.GPT2Config(n_embd=HIDDEN, n_layer=1, n_head=2, n_positions=64),
    "gpt_neox": lambda: tf.GPTNeoXConfig(**_ATTN),
    "phi": lambda: tf.PhiConfig(**_ATTN),
    "phi3": lambda: tf.Phi3Config(pad_token_id=0, **_ATTN),
    "opt": lambda: tf.OPTConfig(
        hidden_size=HIDDEN, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2,
        word_embed_proj_dim=HIDDEN, max_position_embeddings=64,
    ),
    "falcon": lambda: tf.FalconConfig(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2),
    "bloom": lambda: tf.BloomConfig(hidden_size=HIDDEN, n_layer=1, n_head=2),
    "gptj": lambda: tf.GPTJConfig(n_embd=HIDDEN, n_layer=1, n_head=2, rotary_dim=4, n_positions=64),
    "bert": lambda: tf.BertConfig(max_position_embeddings=64, **_ATTN),
    "t5": lambda: tf.T5Config(d_model=HIDDEN, d_ff=32, d_kv=8, num_layers=1, num_heads=2),
}


def make_model(arch: str = "llama", seed: int = 0, vocab: int = VOCAB):
    config = CONFIGS[arch]()
    config.vocab_size = vocab
    # Keep special ids inside the tiny vocabulary (defaults like 50256 only cause warnings).
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if getattr(config, attr, None) is not None:
            setattr(config, attr, 0)
    torch.manual_seed(seed)
    try:
        model = tf.AutoModelForCausalLM.from_config(config)
    except ValueError:  # T5 has no causal-LM class
        model = tf.AutoModel.from_config(config)
    return model.eval()


def save(model, path, **kwargs):
    model.save_pretrained(str(path), safe_serialization=True, **kwargs)
    return path


def write_checkpoint(path, tensors: dict[str, torch.Tensor], config: dict | None):
    """A hand-made checkpoint: given tensors in model.safetensors, and config.json if given."""
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


class ReadSpy:
    """Records which tensors' bytes are read from which file."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, str]] = []
        real = et._tensor_bytes

        def spy(model_dir, file, name, entry):
            self.calls.append((file.name, name))
            return real(model_dir, file, name, entry)

        monkeypatch.setattr(et, "_tensor_bytes", spy)


def same(weight, tensor: torch.Tensor) -> bool:
    """``weight`` is a float32 numpy array holding exactly ``tensor``'s values."""
    return isinstance(weight, np.ndarray) and weight.dtype == np.float32 and np.array_equal(
        weight, tensor.detach().float().numpy())


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    model = make_model("llama", seed=1)
    path = save(model, tmp_path_factory.mktemp("llama"))
    return path, model.get_input_embeddings().weight.detach().clone()


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_every_architecture_loads_its_input_embeddings(arch, tmp_path, monkeypatch):
    model = make_model(arch)
    save(model, tmp_path)
    # The name must come from the checkpoint's keys or the architecture, not from the loose
    # fallback over conventional names.
    monkeypatch.setattr(et, "_match_known_names", lambda *a: pytest.fail("fell back to conventional names"))
    table = load_embedding_table(tmp_path)
    expected = model.get_input_embeddings().weight.detach()
    assert isinstance(table, EmbeddingTable)
    assert same(table.weight, expected)
    assert (table.vocab_size, table.dim) == (VOCAB, HIDDEN)
    assert table.source_dtype == "torch.float32"
    assert table.file == tmp_path / "model.safetensors"
    assert len(table.fingerprint) == 16 and int(table.fingerprint, 16) >= 0


class BuildSpy:
    """Records whether the architecture was built (the slow path) and what it answered."""

    def __init__(self, monkeypatch, allowed: bool = True):
        self.calls = 0
        real = et._expected_from_architecture

        def spy(model_dir):
            self.calls += 1
            if not allowed:
                pytest.fail("built the architecture although the checkpoint's keys were unambiguous")
            return real(model_dir)

        monkeypatch.setattr(et, "_expected_from_architecture", spy)


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_unambiguous_keys_name_the_table_without_building(arch, tmp_path, monkeypatch):
    model = make_model(arch)
    save(model, tmp_path)
    # What building the architecture would answer, for comparison.
    names, shape = et._expected_from_architecture(tmp_path)
    from_architecture = et._match_by_suffix(et._Checkpoint(tmp_path), names, shape)
    BuildSpy(monkeypatch, allowed=False)
    assert find_embedding_tensor_name(tmp_path)[0] == from_architecture


def test_two_candidate_tables_are_settled_by_the_architecture(tmp_path, monkeypatch):
    model = make_model("llama", seed=11)
    state = dict(model.state_dict())
    # A same-shaped, conventionally named table that is not the model's (say a draft model's).
    state["draft.model.embed_tokens.weight"] = torch.randn(VOCAB, HIDDEN)
    write_checkpoint(tmp_path, state, json.loads(model.config.to_json_string()))
    spy = BuildSpy(monkeypatch)
    assert find_embedding_tensor_name(tmp_path)[0] == "model.embed_tokens.weight"
    assert spy.calls == 1


def test_table_narrower_than_the_hidden_size_is_settled_by_the_architecture(tmp_path, monkeypatch):
    # OPT-350m projects 512-wide embeddings to a 1024-wide model: the shape check cannot use
    # hidden_size, so the architecture decides.
    config = tf.OPTConfig(hidden_size=HIDDEN, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2,
                          word_embed_proj_dim=HIDDEN // 2, max_position_embeddings=64, vocab_size=VOCAB,
                          bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = tf.AutoModelForCausalLM.from_config(config)
    save(model, tmp_path)
    spy = BuildSpy(monkeypatch)
    table = load_embedding_table(tmp_path)
    assert table.tensor_name == "model.decoder.embed_tokens.weight" and spy.calls == 1
    assert same(table.weight, model.get_input_embeddings().weight.detach())


def test_only_one_tensor_is_read(llama_dir, monkeypatch):
    path, expected = llama_dir
    spy = ReadSpy(monkeypatch)
    table = load_embedding_table(path)
    assert spy.calls == [("model.safetensors", "model.embed_tokens.weight")]
    assert same(table.weight, expected)


def test_sharded_checkpoint(tmp_path, monkeypatch):
    model = make_model("llama", seed=2)
    save(model, tmp_path, max_shard_size="4KB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(shards) > 2
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    spy = ReadSpy(monkeypatch)
    table = load_embedding_table(tmp_path)
    assert table.tensor_name == "model.embed_tokens.weight"
    assert table.file == tmp_path / weight_map["model.embed_tokens.weight"]
    assert spy.calls == [(table.file.name, "model.embed_tokens.weight")]
    assert same(table.weight, model.get_input_embeddings().weight.detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_half_and_double_precision_tables_widen_exactly_to_float32(dtype, tmp_path):
    model = make_model("qwen2", seed=3).to(dtype)
    save(model, tmp_path)
    table = load_embedding_table(tmp_path)
    assert table.source_dtype == str(dtype)
    assert same(table.weight, model.get_input_embeddings().weight)
    assert table.weight.flags["C_CONTIGUOUS"]


def test_a_dtype_numpy_lacks_is_read_through_torch(tmp_path):
    torch.manual_seed(11)
    embed = torch.randn(VOCAB, HIDDEN).to(torch.float8_e4m3fn)
    write_checkpoint(tmp_path, {"model.embed_tokens.weight": embed}, {"vocab_size": VOCAB, "hidden_size": HIDDEN})
    table = load_embedding_table(tmp_path)
    assert table.source_dtype == "torch.float8_e4m3fn"
    assert same(table.weight, embed.float())


def test_fingerprint_is_the_one_earlier_versions_computed_through_torch(tmp_path):
    # Vector caches are keyed by it: reading the table without torch must not invalidate them.
    import hashlib

    from safetensors import safe_open

    from diversity_order.caches import BLAKE2B, digest_buffer

    model = make_model("qwen2", seed=12).to(torch.bfloat16)
    save(model, tmp_path)
    name = "model.embed_tokens.weight"
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        tensor = handle.get_tensor(name)
    content = digest_buffer(tensor.contiguous().view(torch.uint8).numpy(), BLAKE2B)
    key = f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|{content}"
    assert load_embedding_table(tmp_path).fingerprint == hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def test_a_device_other_than_the_cpu_gets_a_torch_tensor(llama_dir):
    path, expected = llama_dir
    table = load_embedding_table(path, device="meta")  # stands in for a GPU: a torch device without data
    assert isinstance(table.weight, torch.Tensor) and table.weight.device.type == "meta"
    assert tuple(table.weight.shape) == tuple(expected.shape) and table.weight.dtype == torch.float32


def test_checkpoint_saved_from_the_base_model_without_prefix(tmp_path):
    model = make_model("llama", seed=4)
    model.model.save_pretrained(str(tmp_path))  # LlamaModel: keys lack "model."
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert find_embedding_tensor_name(tmp_path) == ("embed_tokens.weight", tmp_path / "model.safetensors")
    assert same(load_embedding_table(tmp_path).weight, model.get_input_embeddings().weight.detach())


def test_nested_prefix_and_shape_check(tmp_path):
    model = make_model("llama", seed=5)
    state = {f"language_model.{k}": v for k, v in model.state_dict().items()}
    # A same-named table of another shape (say a vision tower's) must not be picked.
    state["vision_tower.model.embed_tokens.weight"] = torch.randn(7, HIDDEN)
    config = json.loads(model.config.to_json_string())
    write_checkpoint(tmp_path, state, config)
    name, _ = find_embedding_tensor_name(tmp_path)
    assert name == "language_model.model.embed_tokens.weight"
    assert same(load_embedding_table(tmp_path).weight, model.get_input_embeddings().weight.detach())


def test_tied_table_stored_only_under_lm_head(tmp_path):
    model = make_model("gpt2", seed=6)  # wte and lm_head share one parameter
    weight = model.get_input_embeddings().weight.detach()
    state = {k: v for k, v in model.state_dict().items() if k != "transformer.wte.weight"}
    state["lm_head.weight"] = weight.clone()
    write_checkpoint(tmp_path, state, json.loads(model.config.to_json_string()))
    name, _ = find_embedding_tensor_name(tmp_path)
    assert name == "lm_head.weight"
    assert same(load_embedding_table(tmp_path).weight, weight)


def test_unknown_model_type_uses_conventional_names(tmp_path):
    torch.manual_seed(7)
    embed = torch.randn(VOCAB, HIDDEN)
    tensors = {
        "backbone.tok_embeddings.weight": embed,
        "backbone.pos_embedding.weight": torch.randn(64, HIDDEN),
        "backbone.layers.0.mixer.weight": torch.randn(HIDDEN, HIDDEN),
        # Right name, wrong row count for this config's vocabulary: skipped.
        "draft.embed_tokens.weight": torch.randn(VOCAB // 2, HIDDEN),
    }
    write_checkpoint(tmp_path, tensors, {"model_type": "no-such-arch", "vocab_size": VOCAB, "hidden_size": HIDDEN})
    table = load_embedding_table(tmp_path)
    assert table.tensor_name == "backbone.tok_embeddings.weight"
    assert same(table.weight, embed)


def test_remote_code_config_is_not_run(tmp_path):
    torch.manual_seed(8)
    embed = torch.randn(VOCAB, HIDDEN)
    config = {"model_type": "my-remote-lm", "auto_map": {"AutoConfig": "configuration_x.XConfig"}, "vocab_size": VOCAB}
    write_checkpoint(tmp_path, {"transformer.wte.weight": embed}, config)
    assert find_embedding_tensor_name(tmp_path)[0] == "transformer.wte.weight"


def test_no_config_json_falls_back_to_names_with_a_warning(tmp_path, caplog):
    embed = torch.randn(VOCAB, HIDDEN)
    write_checkpoint(tmp_path, {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(HIDDEN)}, None)
    with caplog.at_level(logging.WARNING, logger="diversity_order.embedding_table"):
        table = load_embedding_table(tmp_path)
    assert table.tensor_name == "model.embed_tokens.weight" and same(table.weight, embed)
    assert "no config.json" in caplog.text


# --- errors: a UserError whose one-line message names the folder ----------------------------


def _assert_user_error(path, *words):
    with pytest.raises(UserError) as info:
        load_embedding_table(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    for word in words:
        assert word in message
    return message


def test_error_missing_folder(tmp_path):
    _assert_user_error(tmp_path / "nope", "not found")


def test_error_path_is_a_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    _assert_user_error(tmp_path / "model.safetensors", "folder")


def test_error_no_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _assert_user_error(tmp_path, "no .safetensors")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not really")
    _assert_user_error(tmp_path, "pytorch_model.bin", "not supported", "save_pretrained")


def test_error_no_embedding_like_tensor(tmp_path):
    tensors = {"encoder.layer.0.dense.weight": torch.randn(HIDDEN, HIDDEN), "encoder.norm.weight": torch.ones(HIDDEN)}
    write_checkpoint(tmp_path, tensors, {"model_type": "no-such-arch", "vocab_size": VOCAB})
    _assert_user_error(tmp_path, "no input-embedding table", "encoder.layer.0.dense.weight")


def test_error_known_architecture_without_its_table(llama_dir, tmp_path):
    # A real Llama config over a checkpoint holding no table of the configured shape.
    shutil.copy(llama_dir[0] / "config.json", tmp_path / "config.json")
    save_file({"model.embed_tokens.weight": torch.randn(VOCAB + 1, HIDDEN)}, str(tmp_path / "model.safetensors"))
    _assert_user_error(tmp_path, f"{VOCAB} rows", "model.embed_tokens.weight [161, 16]")


def test_error_index_points_to_missing_shard(tmp_path):
    model = make_model("llama", seed=9)
    save(model, tmp_path, max_shard_size="4KB")
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    missing = weight_map["model.embed_tokens.weight"]
    (tmp_path / missing).unlink()
    _assert_user_error(tmp_path, missing, "missing")


def test_error_corrupt_safetensors(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    _assert_user_error(tmp_path, "model.safetensors")


@pytest.mark.parametrize("damage", ["header", "data", "not-json"])
def test_error_truncated_or_damaged_safetensors(llama_dir, tmp_path, damage):
    path, _ = llama_dir
    folder = shutil.copytree(path, tmp_path / "copy")
    target = folder / "model.safetensors"
    data = target.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    if damage == "header":
        target.write_bytes(data[: header_end - 5])
    elif damage == "data":
        target.write_bytes(data[: header_end + 10])  # the header is whole; the tensors are cut
    else:
        target.write_bytes(data[:8] + b"{" * (header_end - 8) + data[header_end:])
    _assert_user_error(folder, "model.safetensors")


# --- fingerprint ---------------------------------------------------------------------------


def test_fingerprint_identifies_the_table(llama_dir, tmp_path):
    path, _ = llama_dir
    first = load_embedding_table(path).fingerprint
    assert load_embedding_table(path).fingerprint == first
    copy = shutil.copytree(path, tmp_path / "copy")
    assert load_embedding_table(copy).fingerprint == first
    other = save(make_model("llama", seed=123), tmp_path / "other")
    assert load_embedding_table(other).fingerprint != first


def test_fingerprint_covers_every_row(tmp_path):
    # A fine-tune that moved one rare token's row (anywhere in a large vocabulary) is another table.
    torch.manual_seed(10)
    embed = torch.randn(10_000, 8).to(torch.bfloat16)
    config = {"model_type": "no-such-arch", "vocab_size": 10_000}
    base = load_embedding_table(write_checkpoint(tmp_path / "a", {"wte.weight": embed}, config)).fingerprint
    for row in (0, 1, 4097, 9_998, 9_999):  # rows a strided sample of ~4096 would skip, and both ends
        changed = embed.clone()
        changed[row, 7] += 1
        folder = write_checkpoint(tmp_path / f"r{row}", {"wte.weight": changed}, config)
        assert load_embedding_table(folder).fingerprint != base, row
