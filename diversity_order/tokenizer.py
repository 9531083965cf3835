"""Tokenizer wrapper: texts in batches -> flat token ids + per-document lengths.

One tokenization pass feeds both the token counts and the embeddings (the reference encodes
every document twice, one at a time). Batches go to the fast (Rust) tokenizer's
``encode_batch_fast``, which spreads them over all cores and, unlike ``encode_batch``, does
not compute each token's character offsets, which we never read. The ids are exactly
``tokenizer.encode(text, add_special_tokens=False)``: no special tokens, no truncation.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from pathlib import Path

import numpy as np

from .errors import UserError

log = logging.getLogger(__name__)


class DocumentTokenizer:
    """A local Hugging Face tokenizer, used only to turn documents into ids."""

    def __init__(self, model_dir: Path | str):
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise UserError(f"--model-dir {model_dir}: folder not found")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        # The "sequence longer than the model's maximum" warning is noise here: we never
        # feed these ids to the model, and the reference does not truncate either.
        hf_logging.set_verbosity_error()
        try:
            self._hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as exc:  # transformers raises many types for a bad folder
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"--model-dir {model_dir}: cannot load a tokenizer ({first_line})") from None
        self.model_dir = model_dir
        self._backend = getattr(self._hf, "backend_tokenizer", None) if self._hf.is_fast else None
        if self._backend is not None:
            # Same ids as encode_batch (tokenizers >= 0.21 has it); offsets come back as zeros.
            self._encode_ids_batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        self.fingerprint = self._fingerprint()

    @property
    def vocab_size(self) -> int:
        return len(self._hf)

    def _fingerprint(self) -> str:
        """A short hash of everything that decides the ids, to key token-count caches."""
        digest = hashlib.blake2b(digest_size=8)
        if self._backend is not None:
            digest.update(self._backend.to_str().encode("utf-8"))
        else:
            digest.update(json.dumps(sorted(self._hf.get_vocab().items())).encode("utf-8"))
            digest.update(type(self._hf).__name__.encode())
        return digest.hexdigest()

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of all ``texts`` concatenated (int64), and each text's token count."""
        if self._backend is not None:
            encodings = self._encode_ids_batch(texts, add_special_tokens=False)
            id_lists = [encoding.ids for encoding in encodings]
        else:
            id_lists = [self._hf.encode(text, add_special_tokens=False) for text in texts]
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        # chain.from_iterable walks the lists in C: half the time of a generator expression.
        flat = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths

    def encode(self, text: str) -> list[int]:
        """One document's ids, the way the reference computes them."""
        return list(self._hf.encode(text, add_special_tokens=False))
