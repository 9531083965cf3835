"""Tokenizer wrapper: texts in batches -> flat token ids + per-document lengths.

One tokenization pass feeds both the token counts and the embeddings (the reference encodes
every document twice, one at a time). Batches go to the fast (Rust) tokenizer's
``encode_batch_fast``, which spreads them over all cores and, unlike ``encode_batch``, does
not compute each token's character offsets, which we never read. The ids are exactly
``tokenizer.encode(text, add_special_tokens=False)``: no special tokens, no truncation.

Loading through transformers' ``AutoTokenizer`` costs ~3 CPU-seconds and ~170 MB (importing
transformers, then building the tokenizer object), ten times what the Rust tokenizer needs to
read tokenizer.json itself. So when the folder's tokenizer_config.json says transformers would
use tokenizer.json as it is (see ``_verbatim_tokenizer_json``), we read it with ``tokenizers``
alone; anything else (another tokenizer class, options that change the pipeline, special
tokens that transformers would add) goes through ``AutoTokenizer`` as before.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import time
from pathlib import Path

import numpy as np

from .errors import UserError

log = logging.getLogger(__name__)


# Words a BPE model has split already are remembered (the same ids, without the merges again). tokenizers
# keeps 10,000; code and prose repeat many more distinct words (identifiers, names): with 100,000 the
# tokenizer took 4-6% less CPU on a mixed 100K-document corpus, for ~60 MB that stay resident (shrinking the
# cache afterwards returned none of it to the system: the heap is fragmented by then).
BPE_WORD_CACHE = 100_000


def _enlarge_word_cache(backend) -> None:
    resize = getattr(getattr(backend, "model", None), "_resize_cache", None)  # BPE models only (tokenizers >= 0.20)
    if resize is not None:
        resize(BPE_WORD_CACHE)


# The files a Hugging Face tokenizer is read from (tokenizer.json alone suffices for a fast tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt")


class DocumentTokenizer:
    """A local Hugging Face tokenizer, used only to turn documents into ids."""

    def __init__(self, model_dir: Path | str):
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise UserError(f"--model-dir {model_dir}: folder not found")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        self.model_dir = model_dir
        self._transformers_tokenizer = None
        self._backend = _verbatim_tokenizer_json(model_dir)
        if self._backend is None:
            hf = self._hf  # loads through transformers
            self._backend = getattr(hf, "backend_tokenizer", None) if hf.is_fast else None
        if self._backend is not None:
            _enlarge_word_cache(self._backend)
            # Same ids as encode_batch (tokenizers >= 0.21 has it); offsets come back as zeros.
            self._encode_ids_batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        self.fingerprint = self._fingerprint()

    @property
    def _hf(self):
        """The transformers tokenizer, loaded on first use (never, when tokenizer.json was read directly)."""
        if self._transformers_tokenizer is None:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            # The "sequence longer than the model's maximum" warning is noise here: we never
            # feed these ids to the model, and the reference does not truncate either.
            hf_logging.set_verbosity_error()
            try:
                self._transformers_tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), local_files_only=True)
            except Exception as exc:  # transformers raises many types for a bad folder
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                present = [name for name in TOKENIZER_FILES if (Path(self.model_dir) / name).is_file()]
                files = (f"it has {', '.join(present)} of the tokenizer files" if present else
                         f"it has none of the tokenizer files ({', '.join(TOKENIZER_FILES)})")
                raise UserError(f"--model-dir {self.model_dir}: cannot load a tokenizer ({first_line}); {files}: "
                                "copy the tokenizer of the model's Hugging Face folder beside its weights") from None
        return self._transformers_tokenizer

    @property
    def vocab_size(self) -> int:
        if self._transformers_tokenizer is None and self._backend is not None:
            return self._backend.get_vocab_size(with_added_tokens=True)
        return len(self._hf)

    def _fingerprint(self) -> str:
        """A short hash of everything that decides the ids, to key token-count caches (the chat
        template too, when the folder has one: it decides a conversation's tokens)."""
        digest = hashlib.blake2b(digest_size=8)
        if self._backend is not None:
            digest.update(self._backend.to_str().encode("utf-8"))
        else:
            digest.update(json.dumps(sorted(self._hf.get_vocab().items())).encode("utf-8"))
            digest.update(type(self._hf).__name__.encode())
        template, _ = _chat_template(self.model_dir)
        if template:
            digest.update(b"\0chat template\0" + template.encode("utf-8"))
            printed = _special_tokens_printed(self.model_dir, template)
            if printed:
                digest.update(b"\0special tokens the template prints\0" + printed.encode("utf-8"))
        return digest.hexdigest()

    def prepare_chat(self) -> None:
        """Load what rendering conversations takes (transformers' tokenizer: seconds, its import most of them)
        now, so that the first batch's progress line does not count it into the rate and the ETA; said, where it
        is loaded now, so the pause is not a silent one."""
        if self._transformers_tokenizer is not None:
            return
        log.info("Loading the tokenizer that renders the chat template (transformers) ...")
        started = time.perf_counter()
        self._hf  # noqa: B018 (loaded on first use)
        log.info("Chat template ready in %.1f s", time.perf_counter() - started)

    def render_chat(self, messages: list[dict], where: str = "", arguments: dict | None = None) -> str:
        """A conversation as the trainer's text: the tokenizer's own chat template, not tokenized, called with the
        record's ``arguments`` (``tools=...``, its chat_template_kwargs). ``where``: the record's place
        (``file:line``), for the error when the template refuses it."""
        hf = self._hf
        if not getattr(hf, "chat_template", None):
            raise UserError(f"--model-dir {self.model_dir}: the tokenizer has no chat template, so a conversation "
                            "field cannot be rendered as a chat trainer would; give a model folder whose tokenizer "
                            "has one (chat_template.jinja or tokenizer_config.json's chat_template), or a text field")
        try:
            return hf.apply_chat_template(messages, tokenize=False, **(arguments or {}))
        except Exception as exc:  # noqa: BLE001 - a template raises what its Jinja code raises
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            whose = "the record's own chat template (its chat_template_kwargs' chat_template)" \
                if "chat_template" in (arguments or {}) else f"the chat template of --model-dir {self.model_dir}"
            raise TemplateRefused(f"{where + ': ' if where else ''}{whose} cannot render this conversation "
                                  f"({reason})") from None

    def special_tokens_per_document(self, mode: str) -> tuple[list[int], list[int]]:
        """The ids the trainer adds before and after each document (see ``SPECIAL_TOKEN_MODES``)."""
        if mode == "none":
            return [], []
        if mode in ("eos", "bos-eos"):
            names = ("bos_token", "eos_token") if mode == "bos-eos" else ("eos_token",)
            ids = [self._special_id(name) for name in names]
            if None in ids:
                missing = names[ids.index(None)].split("_")[0].upper()
                raise UserError(f"--count-special-tokens {mode}: the tokenizer of {self.model_dir} has no {missing} token")
            return ids[:-1], ids[-1:]
        plain = self._encode_one("a", False)
        full = self._encode_one("a", True)
        at = next(i for i in range(len(full) + 1) if full[i: i + len(plain)] == plain)
        return full[:at], full[at + len(plain):]

    def _encode_one(self, text: str, add_special_tokens: bool) -> list[int]:
        if self._transformers_tokenizer is None and self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self._hf.encode(text, add_special_tokens=add_special_tokens))

    def _special_id(self, name: str) -> int | None:
        config_file = self.model_dir / "tokenizer_config.json"
        token = None
        if self._backend is not None and config_file.is_file():
            token = json.loads(config_file.read_text(encoding="utf-8")).get(name)
            token = token.get("content") if isinstance(token, dict) else token
            return self._backend.token_to_id(token) if token else None
        return getattr(self._hf, f"{name}_id", None)

    def encode_batch(self, texts: list) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of all ``texts`` concatenated (int64), and each text's token count.

        A ``fields.Conversation`` is rendered with the chat template first."""
        return self.ids_and_lengths(self.encode_texts(texts))

    def encode_texts(self, texts: list):
        """The first half of ``encode_batch``: the tokenizer's work, in the Rust tokenizer without
        the GIL, so another thread may run Python meanwhile; ``ids_and_lengths`` finishes it."""
        if any(not isinstance(text, str) for text in texts):
            from .fields import render

            texts = [render(text, self) for text in texts]
        if self._backend is not None:
            return self._encode_ids_batch(texts, add_special_tokens=False)
        return [self._hf.encode(text, add_special_tokens=False) for text in texts]

    def ids_and_lengths(self, encoded: list) -> tuple[np.ndarray, np.ndarray]:
        """``encode_texts``' result as (flat int64 ids, per-text counts)."""
        id_lists = [encoding.ids for encoding in encoded] if self._backend is not None else encoded
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        # chain.from_iterable walks the lists in C: half the time of a generator expression.
        flat = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """How each token reads on its own (e.g. " the"), for reports; one batched call."""
        singles = [[int(t)] for t in token_ids]
        if self._backend is not None:
            return self._backend.decode_batch(singles, skip_special_tokens=False)
        return [self._hf.decode(ids) for ids in singles]

    def encode(self, text: str) -> list[int]:
        """One document's ids, the way the reference computes them."""
        if self._transformers_tokenizer is None and self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self._hf.encode(text, add_special_tokens=False))


# What the trainer adds to each document, counted in every token count and window with
# --count-special-tokens: nothing; the tokens the tokenizer adds with add_special_tokens=True (BOS
# and/or EOS, as its post-processor says); one EOS separator (Megatron's --append-eod, nanoGPT,
# TRL SFT); or BOS and EOS (torchtitan's encode(add_bos=True, add_eos=True)).
SPECIAL_TOKEN_MODES = ("none", "tokenizer", "eos", "bos-eos")


class TemplateRefused(UserError):
    """A chat template that raised on a conversation (many raise on a role they were not written for)."""


def chat_template_source(model_dir: Path) -> dict | None:
    """Where the folder's chat template is written and a short hash of it, for the log and metadata; None
    where it has none."""
    template, file = _chat_template(model_dir)
    if not template:
        return None
    return {"file": str((model_dir / file).absolute()),
            "blake2b": hashlib.blake2b(template.encode("utf-8"), digest_size=8).hexdigest()}


def say_chat_template(field, model_dir: Path) -> dict | None:
    """``chat_template_source``, said in the log: the conversations of ``field`` are rendered with it."""
    source = chat_template_source(Path(model_dir))
    if source is not None:
        # Several fields (prompt and completion) are one conversation: named as the flags give them.
        field = "', '".join(field) if isinstance(field, tuple | list) else field
        log.info("Conversations in '%s': each rendered with the chat template of %s (blake2b %s) before its tokens are "
                 "counted, as a chat trainer renders them", field, source["file"], source["blake2b"])
    return source


def _chat_template(model_dir: Path) -> tuple[str, str]:
    """The folder's chat template as written (chat_template.jinja, else tokenizer_config.json's), or "",
    and the name of the file it was read from."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), jinja.name
    config = "tokenizer_config.json"
    try:
        template = json.loads((model_dir / config).read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return "", config
    return (template if isinstance(template, str) else json.dumps(template or "")), config


def _special_tokens_printed(model_dir: Path, template: str) -> str:
    """The special tokens a chat template names (``{{ bos_token }}``), as the folder's files set them: transformers
    hands them to the template, so changing one in ``tokenizer_config.json`` alone changes what it prints. Only the
    names it uses, so a template that prints none keys caches as before. "" when it names none."""
    files = {}
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            written = json.loads((model_dir / file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(written, dict):
            files[file] = written
    # Named tokens of extra_special_tokens ({"image_token": ...}) reach the template by their names too.
    extra = {file: written.get("extra_special_tokens") for file, written in files.items()}
    extra = {file: named for file, named in extra.items() if isinstance(named, dict)}
    names = {*_SPECIAL_TOKEN_KEYS, "additional_special_tokens", *(name for named in extra.values() for name in named)}
    printed = sorted(name for name in names if isinstance(name, str) and re.search(rf"\b{re.escape(name)}\b", template))
    if not printed:
        return ""
    values = {file: {name: written[name] for name in printed if name in written} for file, written in files.items()}
    for file, named in extra.items():
        values[file]["extra_special_tokens"] = {name: named[name] for name in printed if name in named}
    return json.dumps(values, sort_keys=True)


# tokenizer_config.json keys that leave transformers' tokenizer pipeline as tokenizer.json has it.
# Special tokens are checked separately (transformers adds those tokenizer.json lacks); the
# rest only touch what add_special_tokens=False never uses (BOS/EOS insertion, padding side,
# maximum length, decoding, chat templates). Any other key sends the folder through transformers.
_NEUTRAL_CONFIG_KEYS = frozenset({
    "tokenizer_class", "backend", "added_tokens_decoder", "bos_token", "eos_token", "unk_token", "pad_token",
    "sep_token", "cls_token", "mask_token", "additional_special_tokens", "extra_special_tokens", "add_bos_token",
    "add_eos_token", "model_max_length", "padding_side", "truncation_side", "model_input_names",
    "clean_up_tokenization_spaces", "chat_template", "is_local", "local_files_only", "name_or_path",
})
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
# Classes whose loading is "read tokenizer.json" (in transformers 5 both are TokenizersBackend);
# model-specific classes may rebuild the normaliser or pre-tokeniser from their own defaults.
_VERBATIM_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _verbatim_tokenizer_json(model_dir: Path):
    """tokenizer.json read by ``tokenizers`` when transformers would use it unchanged, else None."""
    tokenizer_file, config_file = model_dir / "tokenizer.json", model_dir / "tokenizer_config.json"
    if not (tokenizer_file.is_file() and config_file.is_file()):
        return None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        pipeline = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # transformers will say what is wrong
    if not isinstance(config, dict) or not isinstance(pipeline, dict):
        return None
    if config.get("tokenizer_class") not in _VERBATIM_CLASSES or set(config) - _NEUTRAL_CONFIG_KEYS:
        return None
    if pipeline.get("truncation") is not None or pipeline.get("padding") is not None:
        return None  # transformers overrides these per call; simpler to let it
    if (model_dir / "special_tokens_map.json").exists():
        return None  # an older layout whose tokens transformers merges in
    added = pipeline.get("added_tokens") or []
    contents = {token.get("content") for token in added if isinstance(token, dict)}
    named = [config.get(key) for key in _SPECIAL_TOKEN_KEYS]
    named += list(config.get("additional_special_tokens") or []) + list(config.get("extra_special_tokens") or [])
    for token in named:
        content = token.get("content") if isinstance(token, dict) else token
        if content is not None and content not in contents:
            return None  # transformers would add it as a special token, changing how text splits
    by_id = {token.get("id"): token for token in added if isinstance(token, dict)}
    for token_id, token in (config.get("added_tokens_decoder") or {}).items():
        listed = by_id.get(int(token_id))
        if not isinstance(token, dict) or listed is None or any(
                listed.get(key) != value for key, value in token.items() if key != "__type"):
            return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # noqa: BLE001 - a format this tokenizers version cannot read: transformers may convert it
        return None
