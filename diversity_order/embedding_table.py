"""The base model's input token-embedding table, read on its own from a safetensors checkpoint.

Documents are embedded as the normalised mean of their tokens' rows in this table, so the
only part of the model we need is one [vocab, hidden] tensor (a few hundred MB even for a
70B model). Loading the model would cost its full size in RAM and minutes of I/O; instead we
list the checkpoint's tensor names from the safetensors headers (or the shard index) and
read just that tensor through safetensors' mmap. The price is having to know which key
holds the table, and that differs per architecture (``model.embed_tokens.weight``,
``transformer.wte.weight``, ``gpt_neox.embed_in.weight``, ...), and sometimes per checkpoint
(saved from the base model without the ``model.`` prefix, nested under ``language_model.``).
Most checkpoints settle it from their keys alone: when exactly one key has a conventional
table name (``embed_tokens``, ``wte``, ...) and the [vocab_size, hidden size] shape that
config.json gives, that is the table. Only when that is ambiguous (no such key, or several) do
we ask transformers itself: the architecture is built on the meta device (no memory, no
weights) and ``get_input_embeddings()`` names the parameter; that name is matched against
the checkpoint's keys by their longest common dotted suffix and checked by shape. Building
costs seconds (importing transformers' modelling code), which is why it is not the first
step. When the architecture can't be built either (an unknown ``model_type``, remote code,
which we never run) we fall back to the conventional names, checked less strictly. Only
``.safetensors`` checkpoints are
supported: ``.bin``/``.pt`` files are pickles, which can't be read one tensor at a time and
can run code when unpickled.

The headers and the table are read straight from the file (a safetensors file is an 8-byte
header length, a JSON header, then the raw tensors), and float tables are widened to float32 in
numpy: on the CPU, embedding needs no torch, whose import alone costs about a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import UserError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

INDEX_NAME = "model.safetensors.index.json"

# Conventional names of input-embedding tables, most specific first, for checkpoints whose
# architecture transformers can't build. Matched on a dotted boundary, so
# "position_embeddings.weight" never matches "embeddings.weight".
KNOWN_EMBEDDING_SUFFIXES = (
    "embed_tokens.weight",  # Llama, Mistral, Qwen, Gemma, Phi, OPT, Mixtral, DeepSeek, ...
    "wte.weight",  # GPT-2, GPT-J, CodeGen, Starcoder, MPT, old Phi
    "embed_in.weight",  # GPT-NeoX / Pythia
    "word_embeddings.weight",  # Falcon, Bloom, BERT-likes, ChatGLM
    "tok_embeddings.weight",  # original Llama/Mistral format, InternLM2
    "token_embedding.weight",
    "embed.weight",
    "emb.weight",  # RWKV
    "embedding.weight",  # Mamba2-style backbones
    "embeddings.weight",  # Mamba
    "shared.weight",  # T5-likes (encoder and decoder share it)
)

# safetensors dtype codes numpy reads and widens to float32 itself (bfloat16 as its raw 16 bits), and
# the dtype's torch name, which is part of the table's fingerprint. Others (float8, integers) are
# converted through torch.
_NUMPY_FLOATS = {"F64": ("<f8", "torch.float64"), "F32": ("<f4", "torch.float32"),
                 "F16": ("<f2", "torch.float16"), "BF16": ("<u2", "torch.bfloat16")}

_CONVERT_HINT = (
    "convert it with: python -c \"from transformers import AutoModelForCausalLM as M; "
    "M.from_pretrained('IN').save_pretrained('OUT')\" (transformers writes safetensors)"
)


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensors with == has no single truth value
class EmbeddingTable:
    """An input-embedding table and where it came from."""

    # [vocab_size, dim] float32: a numpy array on the CPU, a torch tensor on a GPU
    weight: np.ndarray | torch.Tensor = field(repr=False)
    tensor_name: str  # key in the checkpoint, e.g. "model.embed_tokens.weight"
    file: Path  # the .safetensors file that holds it
    source_dtype: str  # dtype in the checkpoint, e.g. "torch.bfloat16"
    vocab_size: int
    dim: int
    fingerprint: str  # short hex hash of the table's content, to key embedding caches


def find_embedding_tensor_name(model_dir: Path) -> tuple[str, Path]:
    """Return (key of the input-embedding tensor, safetensors file that holds it) for ``model_dir``.

    Reads config.json and the safetensors headers only. Raises ``UserError`` naming the
    folder when there is no folder, no safetensors checkpoint, or no embedding-like tensor.
    """
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise UserError(f"--model-dir {model_dir}: folder not found (it must be a local model folder)")
    if not model_dir.is_dir():
        raise UserError(
            f"--model-dir {model_dir}: is a file; pass the model folder (with config.json and *.safetensors)"
        )
    checkpoint = _Checkpoint(model_dir)
    raw_config = _read_raw_config(model_dir)

    if raw_config is not None:
        found = _match_unambiguous_name(checkpoint, *_vocab_and_hidden(raw_config))
        if found is not None:
            return found, checkpoint.file_of(found)

    expected = _expected_from_architecture(model_dir) if raw_config is not None else None
    if expected is not None:
        names, shape = expected
        found = _match_by_suffix(checkpoint, names, shape)
        if found is not None:
            return found, checkpoint.file_of(found)
        # The architecture built but none of its names is in the checkpoint with the right
        # shape (an unusual export): the conventional names below may still find it.
        log.debug("%s: no checkpoint key matches %s with shape %s", model_dir, names, shape)

    if raw_config is None:
        # Our choice: without config.json we can't check the architecture or the vocab size,
        # but the conventional names are specific enough that a checkpoint with one of them
        # is still usable; say so, since a wrong table would silently give poor clusters.
        log.warning("%s has no config.json: picking the embedding table by its name alone", model_dir)
    vocab_size, hidden_size = _vocab_and_hidden(raw_config or {})
    found = _match_known_names(checkpoint, vocab_size, hidden_size)
    if found is not None:
        return found, checkpoint.file_of(found)

    seen = ", ".join(_some_candidates(checkpoint)) or "none"
    want = f" with {vocab_size} rows (config vocab_size)" if vocab_size else ""
    raise UserError(
        f"--model-dir {model_dir}: no input-embedding table{want} found in the safetensors checkpoint "
        f"(tensors seen: {seen})"
    )


def load_embedding_table(model_dir: Path, device: str = "cpu") -> EmbeddingTable:
    """Read only the input-embedding tensor of ``model_dir`` as float32: numpy on the CPU, else torch on ``device``."""
    name, file = find_embedding_tensor_name(model_dir)
    entry = _Checkpoint.read_header(model_dir, file)[name]
    raw = _tensor_bytes(model_dir, file, name, entry)
    shape = tuple(entry.shape)
    if len(shape) != 2:
        raise UserError(f"--model-dir {model_dir}: {name} in {file.name} is not 2-D (shape {shape})")
    if entry.dtype in _NUMPY_FLOATS:
        storage, dtype_name = _NUMPY_FLOATS[entry.dtype]
        stored = raw.view(storage).reshape(shape)
        if entry.dtype == "BF16":  # bfloat16 is the top half of a float32: widening is exact
            widened = np.empty(shape, dtype=np.uint32)
            weight = np.left_shift(stored, 16, out=widened, dtype=np.uint32).view(np.float32)
        else:
            weight = stored.astype(np.float32)  # a copy, so the file's map is not kept open
    else:
        original = _torch_tensor(model_dir, file, name)
        dtype_name = str(original.dtype)
        weight = original.float().numpy()
    fingerprint = _fingerprint(name, shape, dtype_name, raw)
    if str(device) != "cpu":
        import torch

        weight = torch.from_numpy(weight).to(device)
    log.info("Embedding table %s %s (%s) from %s", name, shape, dtype_name, file.name)
    return EmbeddingTable(
        weight=weight,
        tensor_name=name,
        file=file,
        source_dtype=dtype_name,
        vocab_size=int(shape[0]),
        dim=int(shape[1]),
        fingerprint=fingerprint,
    )


def _tensor_bytes(model_dir: Path, file: Path, name: str, entry) -> np.ndarray:
    """The tensor's bytes as stored, memory-mapped (only its pages are read)."""
    size = file.stat().st_size
    if entry.end > size:
        raise UserError(f"--model-dir {model_dir}: cannot read {name} from {file.name} (the file is truncated: "
                        f"{size} bytes, the header places the tensor up to byte {entry.end})")
    if entry.end == entry.begin:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(file, dtype=np.uint8, mode="r", offset=entry.begin, shape=(entry.end - entry.begin,))


def _torch_tensor(model_dir: Path, file: Path, name: str):
    """A tensor of a dtype numpy lacks (float8, ...), read by safetensors into torch."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            return handle.get_tensor(name)
    except Exception as exc:  # safetensors' own errors, for a file its header check let through
        raise UserError(f"--model-dir {model_dir}: cannot read {name} from {file.name} ({_first_line(exc)})") from None


# --- the checkpoint's keys, from headers only -------------------------------------------------


class _Checkpoint:
    """Tensor keys of a safetensors checkpoint, and their files and shapes, read lazily from headers."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self._files: dict[str, Path] = {}  # key -> file
        self._shapes: dict[str, tuple[int, ...]] = {}
        index = model_dir / INDEX_NAME
        if not index.is_file():
            others = sorted(model_dir.glob("*.safetensors.index.json"))
            index = others[0] if others else None
        if index is not None:
            # Sharded: the index lists every key without opening any shard. A shard is only
            # checked to exist when a key we need lives in it, so a missing unrelated shard
            # doesn't stop us (we never read it).
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise UserError(f"--model-dir {model_dir}: cannot read {index.name} ({_first_line(exc)})") from None
            self._files = {key: model_dir / shard for key, shard in weight_map.items()}
        else:
            files = sorted(model_dir.glob("*.safetensors"))
            if not files:
                pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
                found = f" (found {', '.join(pickles[:3])}: .bin/.pt checkpoints are not supported; {_CONVERT_HINT})"
                raise UserError(f"--model-dir {model_dir}: no .safetensors checkpoint{found if pickles else ''}")
            # Several unindexed files (e.g. model.safetensors next to consolidated.safetensors):
            # a key found in more than one keeps the first file in name order.
            for path in files:
                for key in self._header(path):
                    self._files.setdefault(key, path)
        self.keys = list(self._files)

    def file_of(self, key: str) -> Path:
        path = self._files[key]
        if not path.is_file():
            raise UserError(
                f"--model-dir {self.model_dir}: the shard index says {key} is in {path.name}, which is missing "
                "(incomplete download?)"
            )
        return path

    def shape(self, key: str) -> tuple[int, ...]:
        if key not in self._shapes:
            self._shapes.update(self._header(self.file_of(key)))
        return self._shapes[key]

    def _header(self, path: Path) -> dict[str, tuple[int, ...]]:
        shapes = {key: entry.shape for key, entry in self.read_header(self.model_dir, path).items()}
        self._shapes.update(shapes)
        return shapes

    @staticmethod
    def read_header(model_dir: Path, path: Path) -> dict[str, _TensorEntry]:
        """Every tensor's dtype, shape and absolute byte span in ``path``, from its header alone."""
        try:
            with open(path, "rb") as handle:
                size = path.stat().st_size
                head = handle.read(8)
                if len(head) < 8:
                    raise ValueError(f"{size} bytes, shorter than a header")
                (length,) = struct.unpack("<Q", head)
                if length > size - 8:
                    raise ValueError(f"header length {length} exceeds the file's {size} bytes")
                header = json.loads(handle.read(length))
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
            entries = {}
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                shape = tuple(int(d) for d in info["shape"])
                entries[key] = _TensorEntry(str(info["dtype"]), shape, 8 + length + int(begin), 8 + length + int(end))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # json's errors are ValueErrors
            raise UserError(f"--model-dir {model_dir}: cannot read {path.name} ({_first_line(exc)})") from None
        return entries


@dataclass(frozen=True)
class _TensorEntry:
    dtype: str  # safetensors' code: "BF16", "F32", ...
    shape: tuple[int, ...]
    begin: int  # byte span in the file
    end: int


# --- (1) the checkpoint's keys, when they leave one choice ----------------------------------------


def _has_known_suffix(key: str) -> bool:
    return any(key == suffix or key.endswith("." + suffix) for suffix in KNOWN_EMBEDDING_SUFFIXES)


def _match_unambiguous_name(checkpoint: _Checkpoint, vocab_size: int | None, hidden_size: int | None) -> str | None:
    """The one key with a conventional table name and the configured [vocab_size, hidden] shape, else None.

    Without a vocab size there is nothing to check a name against; two or more such keys (an
    encoder-decoder's copies, a draft model's table) are left to the architecture to decide.
    """
    if not vocab_size:
        return None
    fits = []
    for key in checkpoint.keys:
        if not _has_known_suffix(key):
            continue
        try:
            shape = checkpoint.shape(key)
        except UserError:  # its shard is missing: the slower paths say which file it is
            return None
        if len(shape) == 2 and shape[0] == vocab_size and (hidden_size is None or shape[1] == hidden_size):
            fits.append(key)
    return fits[0] if len(fits) == 1 else None


# --- (2) ask the architecture ---------------------------------------------------------------------


def _expected_from_architecture(model_dir: Path) -> tuple[list[str], tuple[int, int]] | None:
    """Names the input-embedding parameter has in the model (first = its own), and its shape.

    None when transformers can't build the architecture from config.json.
    """
    try:
        import torch
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
    except ImportError:
        return None
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # building a model warns about things irrelevant here
    try:
        # trust_remote_code=False: never run code shipped with a checkpoint (and never prompt).
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
        # The meta device allocates nothing, so this costs milliseconds even for a 70B config.
        with torch.device("meta"):
            try:
                model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
            except ValueError:  # encoders and encoder-decoders have no causal-LM class
                model = AutoModel.from_config(config, trust_remote_code=False)
        module = model.get_input_embeddings()
        weight = module.weight
    except Exception as exc:  # unknown model_type, remote code, missing optional deps, ...
        log.debug("%s: cannot build the architecture (%s); using conventional names", model_dir, exc)
        return None
    finally:
        hf_logging.set_verbosity(verbosity)
    own = [f"{name}.weight" if name else "weight" for name, m in model.named_modules() if m is module][:1]
    # Tied weights (lm_head, T5's encoder/decoder copies) share the parameter: a checkpoint
    # may store it under one of those names only.
    aliases = [name for name, p in model.named_parameters(remove_duplicate=False) if p is weight]
    names = own + [name for name in aliases if name not in own]
    if not names or weight.ndim != 2:
        return None
    return names, (int(weight.shape[0]), int(weight.shape[1]))


def _suffix_len(a: str, b: str) -> int:
    """Number of trailing dotted components ``a`` and ``b`` share."""
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[-1 - n] == pb[-1 - n]:
        n += 1
    return n


def _match_by_suffix(checkpoint: _Checkpoint, names: list[str], shape: tuple[int, int]) -> str | None:
    """The checkpoint key that best matches one of ``names`` and has ``shape``.

    Keys may differ from the model's names by prefixes (saved from the base model without
    "model.", nested under "language_model."), so the best key shares the longest dotted
    suffix; at least the module name plus "weight" must agree, since "weight" alone says
    nothing. The model's own name is tried before its tied aliases.
    """
    for name in names:
        scored = [(_suffix_len(key, name), key) for key in checkpoint.keys]
        scored = [(n, key) for n, key in scored if n >= 2]
        # Longest shared suffix first, then the shortest key (fewest extra prefixes), then by name.
        scored.sort(key=lambda item: (-item[0], len(item[1]), item[1]))
        for _, key in scored:
            if checkpoint.shape(key) == shape:
                return key
    return None


# --- (3) conventional names -------------------------------------------------------------------


def _match_known_names(checkpoint: _Checkpoint, vocab_size: int | None, hidden_size: int | None) -> str | None:
    for suffix in KNOWN_EMBEDDING_SUFFIXES:
        keys = [key for key in checkpoint.keys if key == suffix or key.endswith("." + suffix)]
        fits = []
        for key in keys:
            shape = checkpoint.shape(key)
            if len(shape) != 2:
                continue
            if vocab_size and shape[0] != vocab_size:
                continue
            if hidden_size and shape[1] != hidden_size:
                continue
            fits.append((shape[0], key))
        if fits:
            # Without a vocab size to check, the table with the most rows is the likeliest
            # token table (vision/position tables are smaller); ties go to the shortest key.
            fits.sort(key=lambda item: (-item[0], len(item[1]), item[1]))
            return fits[0][1]
    return None


def _read_raw_config(model_dir: Path) -> dict | None:
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"--model-dir {model_dir}: cannot read config.json ({_first_line(exc)})") from None
    return data if isinstance(data, dict) else {}


def _vocab_and_hidden(config: dict) -> tuple[int | None, int | None]:
    """vocab_size and hidden size from a raw config, looking into a multimodal text_config too."""
    for cfg in (config, config.get("text_config"), config.get("llm_config"), config.get("language_config")):
        if not isinstance(cfg, dict):
            continue
        vocab = cfg.get("vocab_size") or cfg.get("padded_vocab_size")
        if isinstance(vocab, int) and vocab > 0:
            sizes = (cfg.get(k) for k in ("hidden_size", "n_embd", "d_model", "dim"))
            hidden = next((size for size in sizes if isinstance(size, int)), None)
            return vocab, hidden
    return None, None


def _some_candidates(checkpoint: _Checkpoint, limit: int = 6) -> list[str]:
    """A few keys with their shapes worth showing when nothing matched: embedding-ish names first."""
    keys = checkpoint.keys
    embeddingish = [k for k in keys if any(word in k.lower() for word in ("emb", "wte", "shared"))]
    chosen = set(embeddingish)
    shown = (embeddingish + [k for k in keys if k not in chosen and k.endswith("weight")])[:limit]
    described = []
    for key in shown:
        try:
            described.append(f"{key} {list(checkpoint.shape(key))}")
        except UserError:  # its shard is missing: the name alone still helps
            described.append(key)
    return described + ([f"... {len(keys) - len(shown)} more"] if len(keys) > len(shown) else [])


# --- fingerprint ------------------------------------------------------------------------------


def _fingerprint(name: str, shape: tuple[int, ...], dtype_name: str, raw: np.ndarray) -> str:
    """Short hash of the table: name, shape, dtype and every byte of it.

    Every row counts: a fine-tune that changed a few rare tokens' rows must not reuse vectors
    made with the old ones. Its 64 MiB chunks are hashed in parallel, so even a 2 GB table adds seconds to a run.
    The bytes are those of the checkpoint's own dtype, so the same table gives the same
    fingerprint whatever dtype it is converted to later.
    """
    from .caches import BLAKE2B, digest_buffer

    # blake2b, as always for this key: caches of vectors made with this table stay valid (the table
    # is small; the cache files' own digests are XXH3).
    content = digest_buffer(raw, BLAKE2B)
    key = f"{name}|{shape}|{dtype_name}|{content}"
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
