"""The batch loop of deep extraction: length-sorted documents in padded batches sized by a token
budget, out-of-memory handled by shrinking the batch (or skipping a document that fits in none),
checkpoints and progress along the way."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from time import monotonic  # a name of this module, so tests can give the loop a clock

import numpy as np

from ..interrupts import Terminated, sigterm_raises
from ..runtime import Progress, memory_text
from .checkpoint import Partial
from .config import (
    CPU_BATCH_SIZE,
    CPU_TOKEN_BUDGET,
    GPU_BATCH_SIZE,
    GPU_MEMORY_FRACTION,
    OOM_SHRINK,
    SUCCESS_GROWTH,
    DeepConfig,
    DeepResult,
)
from .layout import TensorParallelGroup
from .model import ForwardFn, default_forward, is_oom
from .tokens import Tokens

log = logging.getLogger("diversity_order.deep")


def initial_budget(config: DeepConfig, model, device, dtype) -> int:
    """Tokens per batch (documents x longest length): given, fixed on CPU, or from free GPU memory."""
    import torch

    if config.token_budget is not None:
        return int(config.token_budget)
    if device.type != "cuda":
        return CPU_TOKEN_BUDGET
    free, _ = torch.cuda.mem_get_info(device)
    cfg = model.config
    hidden = int(getattr(cfg, "hidden_size", 4096))
    inter = int(getattr(cfg, "intermediate_size", 4 * hidden) or 4 * hidden)
    elem = torch.tensor([], dtype=dtype).element_size()
    # Rough live activations per token in one layer (residual, attention, MLP) + float32 pooling.
    per_token = (6 * hidden + 3 * inter) * elem + 2 * hidden * 4
    return max(256, int(GPU_MEMORY_FRACTION * free / per_token))


def batch_size_for(config: DeepConfig, device) -> int:
    """Most documents per forward pass: given, or the default for the device's kind."""
    if config.batch_size is not None:
        return int(config.batch_size)
    return GPU_BATCH_SIZE if device.type == "cuda" else CPU_BATCH_SIZE


class Embedder:
    """Runs length-sorted batches through the model, backing off on out-of-memory."""

    def __init__(self, model, device, batch_size: int, budget: int, forward: ForwardFn | None = None):
        self.model, self.device, self.batch_size = model, device, batch_size
        self.budget = budget
        # After an out-of-memory the budget grows back towards, never past, where it started:
        # without OOM the batches are then a fixed function of the order, hence reproducible.
        self.max_budget = budget
        self.forward = forward or default_forward

    def embed(self, docs: list[np.ndarray]):
        """Pooled, normalised float32 vectors of ``docs`` (all non-empty), one padded batch."""
        import torch

        longest = max(len(d) for d in docs)
        ids = torch.zeros((len(docs), longest), dtype=torch.long)
        mask = torch.zeros((len(docs), longest), dtype=torch.long)
        for i, doc in enumerate(docs):
            ids[i, : len(doc)] = torch.from_numpy(np.asarray(doc, dtype=np.int64))
            mask[i, : len(doc)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.inference_mode():
            hidden = self.forward(self.model, ids, mask)
            weights = mask.to(torch.float32).unsqueeze(-1)
            summed = (hidden.to(torch.float32) * weights).sum(dim=1)
            mean = summed / weights.sum(dim=1)
            vectors = torch.nn.functional.normalize(mean, dim=-1)
        return vectors.cpu().numpy().astype(np.float32, copy=False)

    def batch_count(self, lengths: np.ndarray) -> int:
        """Documents from the start of ``lengths`` that fit the budget (at least one)."""
        head = lengths[: self.batch_size]
        longest = np.maximum.accumulate(head)
        fits = np.arange(1, head.size + 1) * longest <= self.budget
        return max(1, int(np.argmin(fits)) if not fits.all() else head.size)

    def shrink_after_oom(self, count: int, longest: int) -> None:
        self.budget = max(1, int(min(self.budget, count * longest) * OOM_SHRINK))
        log.debug("out of memory on %d docs; token budget now %d", count, self.budget)

    def grow_after_success(self) -> None:
        self.budget = min(self.max_budget, max(self.budget + 1, int(self.budget * SUCCESS_GROWTH)))


def free_cache(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class BatchLoop:
    """Embeds ``todo`` (input rows, sorted by length) into ``partial``, checkpointing as it goes."""

    embedder: Embedder
    tokens: Tokens
    partial: Partial
    position: dict  # input row -> index in partial
    tp_group: TensorParallelGroup
    checkpoint_docs: int
    checkpoint_seconds: float

    def run(self, todo: np.ndarray, result: DeepResult, progress: Progress) -> None:
        # A checkpoint every checkpoint_docs documents or checkpoint_seconds, whichever comes first
        # (either resets both), at the end of the batch that crosses it: a batch is never cut.
        since_checkpoint, last_checkpoint = 0, monotonic()
        try:
            with sigterm_raises():
                # Batches are cut greedily over the whole to-do list (never at tokenization chunks), so
                # a resumed run, starting where a finished batch ended, cuts the same batches again.
                todo_lengths = self.tokens.lengths[todo]
                pos = 0
                while pos < todo.size:
                    count = self.embedder.batch_count(todo_lengths[pos:])
                    done = self._one_batch(todo[pos : pos + count], int(todo_lengths[pos : pos + count].max()),
                                           result)
                    if done == 0:
                        continue  # shrunk after an out-of-memory: the same documents again, fewer at a time
                    tokens = int(todo_lengths[pos : pos + done].sum())
                    pos += done
                    since_checkpoint += done
                    progress.update(done, work=tokens)
                    if since_checkpoint >= self.checkpoint_docs or \
                            monotonic() - last_checkpoint >= self.checkpoint_seconds:
                        self.partial.checkpoint()
                        since_checkpoint, last_checkpoint = 0, monotonic()
                # The rows since the last checkpoint too (only those are written): the output written
                # next needs as much disk again, and should that fail, a rerun only writes it.
                self.partial.checkpoint()
        except BaseException as exc:
            if result.docs:
                with contextlib.suppress(Exception):
                    self.partial.checkpoint()
            if isinstance(exc, (Terminated, KeyboardInterrupt)):  # what a rerun starts from, said now
                log.warning("%s: %d of %d rows of this share are checkpointed; rerun to resume",
                            "Terminated (SIGTERM)" if isinstance(exc, Terminated) else "Interrupted",
                            int(self.partial.saved.sum()), self.partial.done.size)
            raise

    def _one_batch(self, batch: np.ndarray, longest: int, result: DeepResult) -> int:
        """Embed ``batch``; returns how many documents are finished (0: retry with a smaller budget)."""
        try:
            vectors = self.embedder.embed([self.tokens.ids(int(r)) for r in batch.tolist()])
            failed = False
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is handled
            if not is_oom(exc):
                raise
            failed = True
        if self.tp_group.any(failed):  # --tp: one rank out of memory -> every rank backs off alike
            free_cache(self.embedder.device)
            if batch.size > 1:
                self.embedder.shrink_after_oom(batch.size, longest)
                return 0
            row = int(batch[0])
            log.warning("record %i (%d tokens) does not fit in memory even alone: skipped (NaN row)",
                        row, int(self.tokens.lengths[row]))
            self.partial.data[self.position[row]] = np.nan  # not marked done, so a rerun retries it
            result.skipped.append((row, int(self.tokens.lengths[row])))
            return 1
        bad = ~np.isfinite(vectors).all(axis=1)
        if bad.any():  # kept as NaN rows (curate warns about them), but said now, not discovered later
            rows = sorted(batch[bad].tolist())
            log.warning("%d document(s) got a vector with NaN or inf: the model's hidden states are not finite "
                        "(float16 overflows in many models: try --dtype bfloat16 or float32); records %s%s",
                        len(rows), ", ".join(map(str, rows[:10])), " ..." if len(rows) > 10 else "")
        for row, vector in zip(batch.tolist(), vectors):
            self.partial.data[self.position[row]] = vector
            self.partial.done[self.position[row]] = True
        self.embedder.grow_after_success()
        result.docs += batch.size
        result.tokens += int(self.tokens.lengths[batch].sum())
        return batch.size


def progress_for(todo_docs: int, todo_tokens: int, device, bar: bool, silent: bool = False) -> Progress:
    """Documents and tokens embedded, ETA from the token rate (documents run shortest first), peak memory."""
    return Progress(todo_docs, "Deep embeddings", bar=bar, total_work=todo_tokens, note=lambda: memory_text(device),
                    silent=silent)
