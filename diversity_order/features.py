"""Token counts and shallow embeddings of every record: reused from the caches where a record's
text is unchanged, computed for the rest (shared across torchrun ranks).

Each record is tokenized once for both its count and its vector. The model's parts (tokenizer,
embedding table) are loaded only when something has to be computed, so a fully cached run needs
neither.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import atomic, caches, distributed, embed, interrupts, kept_rows, matrix
from .arrays import load_matrix
from .errors import UserError
from .matrix import Matrix
from .model_folder import check_model_dir
from .records import RecordIndex

log = logging.getLogger(__name__)

SHALLOW_METHOD = "base_model_embed_tokens_mean_pool"
EXTERNAL_METHOD = "external_precomputed"
# --embedding-dtype: how the shallow-embedding cache stores its rows (computed in float32 either way).
EMBEDDING_DTYPES = ("float32", "float16")


class ModelParts:
    """Tokenizer and embedding table of ``model_dir``, loaded on first use."""

    def __init__(self, model_dir: Path | None, device):
        self.model_dir = model_dir
        self.device = device
        self._tokenizer = None
        self._table = None

    def require_dir(self, why: str) -> Path:
        if self.model_dir is None:
            raise UserError(f"--model-dir is required {why}")
        return check_model_dir(self.model_dir)

    def tokenizer(self, why: str):
        if self._tokenizer is None:
            from .tokenizer import DocumentTokenizer

            self._tokenizer = DocumentTokenizer(self.require_dir(why))
        return self._tokenizer

    def table(self):
        if self._table is None:
            from .embedding_table import load_embedding_table

            self._table = load_embedding_table(self.require_dir("to embed the documents (or pass --load-embeddings FILE)"),
                                               device=self.device)
            if isinstance(self._table.weight, np.ndarray):
                from .embed import warm_up_pooling

                warm_up_pooling()
        return self._table

    def release_table(self) -> None:
        """Drop the embedding table once every vector is computed (a float32 copy: 113 MB for SmolLM2)."""
        self._table = None


def load_external_embeddings(path: Path, n_records: int) -> Matrix:
    """A precomputed N x D float matrix, memory-mapped (read in blocks by the later stages, so it may be
    larger than RAM); NaN rows read as zero vectors (warned)."""
    mapped = load_matrix(path, "--load-embeddings", as_float32=False)
    if mapped.shape[0] != n_records:
        raise UserError(f"--load-embeddings {path}: {mapped.shape[0]} rows, but the input has {n_records} records")
    try:
        embeddings = matrix.MatrixFile.open(path)
    except ValueError:  # Fortran-ordered: rows are not contiguous on disk, so read it whole
        embeddings = np.ascontiguousarray(mapped, dtype=np.float32)
    del mapped
    bad, zeros = matrix.count_unusable_rows(embeddings)
    if bad:
        log.warning("%d row(s) of %s are NaN/inf (e.g. documents skipped by deep extraction); "
                    "they become zero vectors", bad, path.name)
    if zeros:
        log.warning("%d row(s) of %s are all zeros (empty documents, or rows never computed: a part-filled cache "
                    "of an interrupted run copied without its .cache.json?); they cluster together", zeros, path.name)
    return embeddings


def check_external_rows(path: Path, fingerprints: np.ndarray) -> None:
    """--load-embeddings' rows against the input's records (``caches.require_row_order``)."""
    caches.require_row_order(path, fingerprints, f"--load-embeddings {path}", "row", "record",
                             "the input's records")


def token_count_key(tokenizer_fp: str, text_field: str) -> dict:
    return {"kind": "token_counts", "tokenizer": tokenizer_fp, "text_field": text_field}


def embedding_key(tokenizer_fp: str, table, text_field: str) -> dict:
    return {"kind": SHALLOW_METHOD, "tokenizer": tokenizer_fp, "table": table.fingerprint,
            "tensor": table.tensor_name, "dim": table.dim, "text_field": text_field}


def _tokenize_rows(ctx: distributed.DistContext, index: RecordIndex, rows: np.ndarray, tokenizer, table,
                   batch_docs: int, progress: bool, out: np.ndarray | None = None,
                   finished: embed.Finished | None = None, kept: tuple | None = None):
    """Tokenize (and embed, with a table: a single process only, the vectors written straight into
    ``out[rows]``) ``rows``. Under torchrun, where only counts are computed here (ranks embed through
    ``scale_out``, never sending vectors), each rank takes a share by bytes and rank 0 gets the counts
    back in row order; the other ranks get (None, None). ``finished``: see ``embed.embed_and_count``
    (a single process only). ``kept``: under torchrun (required there), (the ``kept_rows`` target, the
    count key, the records' fingerprints): a rank stopped part-way says what it counted, for the next run."""
    if ctx.active and table is not None:
        raise RuntimeError("under torchrun the ranks embed through scale_out, which sends no vectors")
    if not ctx.active:
        vectors, counts, stats = embed.embed_and_count(index, rows, tokenizer, table, batch_docs=batch_docs,
                                                       progress=progress, out=out, finished=finished)
        if table is not None:
            log.info("Embedded %d documents, %d tokens, in %.1f s (%s tokens/s)", stats.documents, stats.tokens,
                     stats.seconds, f"{stats.tokens / max(stats.seconds, 1e-9):,.0f}")
        return vectors, counts
    share = distributed.my_share(ctx, rows, index.row_sizes[rows])
    log.info("Rank %i of %d: %d of the %d records", ctx.rank, ctx.world_size, share.size, rows.size)
    target, count_key, fingerprints = kept
    counts = kept_rows.counted_by_ranks(
        ctx, target, count_key, fingerprints, share,
        lambda mine, finished: embed.embed_and_count(index, mine, tokenizer, None, batch_docs=batch_docs,
                                                     progress=progress and ctx.is_main, finished=finished)[1])
    return None, counts


def counts_and_embeddings(index: RecordIndex, paths: dict, model: ModelParts, text_field: str, need_embeddings: bool,
                          batch_docs: int, progress: bool, ctx: distributed.DistContext | None = None,
                          embedding_dtype: str = EMBEDDING_DTYPES[0], hold_rows: np.ndarray | None = None,
                          ) -> tuple[np.ndarray | None, Matrix | None]:
    """Token counts (always) and shallow embeddings (when asked), reusing valid cached rows.

    ``paths["token_counts"]`` and ``paths["embeddings"]`` are the caches. The embeddings are never
    held in memory: they are the cache file itself (``matrix.MatrixFile``, rows of ``embedding_dtype``),
    filled row by row when rows were missing or moved (``caches.Fill``); when it is filled, the rows
    ``hold_rows`` are also kept in memory for the first stage that reads them (``matrix.HeldRows``).
    Under torchrun, only rank 0 gets the arrays (and writes the caches); other ranks get None.
    """
    ctx = ctx or distributed.DistContext()
    fps = index.fingerprints
    have_model = model.model_dir is not None
    why_tokenizer = "to count tokens: the token-count cache does not cover every record"
    tokenizer = model.tokenizer(why_tokenizer) if (have_model or need_embeddings) else None
    count_key = token_count_key(tokenizer.fingerprint if tokenizer else "", text_field)
    count_places = token_count_places(paths)
    if ctx.is_main and tokenizer is not None:  # what an interrupted torchrun run kept (the ranks' files are these)
        if not (need_embeddings and ctx.active):  # (ranks that embed do it through scale_out, which takes them)
            key = embedding_key(tokenizer.fingerprint, model.table(), text_field) if need_embeddings else None
            kept_rows.recover(Path(paths["embeddings"]), key, count_places, count_key, embeds=need_embeddings)
        kept_rows.recover(kept_rows.counts_target(paths), None, count_places, count_key)
    distributed.barrier(ctx)  # the other ranks look the counts up after rank 0 has added those
    counts_found = caches.lookup(count_places[0], count_key, fps, accept_any_key=tokenizer is None, dtype=np.int64,
                                 row_shape=(), alternatives=tuple(count_places[1:]))
    log.info("Token counts: %s", counts_found.reason)
    count_rows = counts_found.missing_rows
    if count_rows.size and tokenizer is None:
        raise UserError(f"--model-dir is required to count tokens: {count_rows.size} of {len(index)} records "
                        f"have no cached count in {paths['token_counts']} (a folder with the tokenizer is enough)")
    counts = counts_found.data if counts_found.data is not None else np.zeros(len(index), dtype=np.int64)
    counts = counts.astype(np.int64)
    embeddings = None
    work = _WorkSoFar(counted=counts_found.hit.copy(), counted_before=int(np.count_nonzero(counts_found.hit)))
    try:
        # SIGTERM (a scheduler's preemption or time limit) keeps the work done, as Ctrl-C does.
        with contextlib.nullcontext() if ctx.active else interrupts.sigterm_raises():
            if need_embeddings:
                work.key = embedding_key(tokenizer.fingerprint, model.table(), text_field)
                embeddings, embedded = _embeddings(index, paths["embeddings"], work, model, tokenizer, counts,
                                                   batch_docs, progress, ctx, embedding_dtype, hold_rows)
                count_rows = _without(count_rows, embedded, len(index))
            if count_rows.size:
                log.info("Counting tokens of %d record(s) of %d", count_rows.size, len(index))
                kept = (kept_rows.counts_target(paths), count_key, fps) if ctx.active else None
                _, new_counts = _tokenize_rows(ctx, index, count_rows, tokenizer, None, batch_docs, progress,
                                               finished=work.counting, kept=kept)
                if ctx.is_main:
                    counts[count_rows] = new_counts
            if not ctx.is_main:
                return None, None
            _warn_cached_empty(index, counts, counts_found.hit, count_rows, embedded if need_embeddings else None,
                               need_embeddings)
            # Stored whenever the files are not exactly the current records in order (new, edited, moved
            # or removed records), so the caches always line up with the input for the other scripts.
            if not counts_found.in_order:
                # Without a tokenizer every count came from a cache (else missing rows raised above): keep its key.
                store_token_counts(count_places, count_key if tokenizer is not None else counts_found.key, fps,
                                   counts)
            if work.fill is not None:
                work.committing = True
                # Every row is computed: a Ctrl-C or SIGTERM now waits the few seconds the set takes to be stored
                # (it abandoned the whole finished set).
                with atomic.signals_held():
                    embeddings = work.fill.commit(work.key, fps)
                    work.fill = None  # stored: nothing left to abandon when the held signal arrives
    except (KeyboardInterrupt, interrupts.Terminated) as stop:
        if not ctx.active and tokenizer is not None and not work.committing:
            _keep_work_so_far(work, index, counts, count_places, count_key, stop)
        elif work.fill is not None:
            work.fill.abandon()
        raise
    except BaseException:
        if work.fill is not None:
            work.fill.abandon()
        raise
    return counts, embeddings


def _warn_cached_empty(index: RecordIndex, counts: np.ndarray, cached: np.ndarray, counted: np.ndarray,
                       embedded: np.ndarray | None, need_embeddings: bool) -> None:
    """Documents without tokens whose count came from the cache: warned of as a run tokenizing them would, so a
    rerun does not hide them."""
    fresh = np.zeros(counts.shape[0], dtype=bool)
    for rows in (counted, embedded):
        if rows is not None:
            fresh[rows] = True
    rows = np.flatnonzero((counts == 0) & cached & ~fresh)
    if rows.size:
        embed.warn_no_tokens(index, rows, need_embeddings, known_from="token counts from the cache")


@dataclass
class _WorkSoFar:
    """What ``counts_and_embeddings`` has done, for a run interrupted part-way to keep (``_keep_work_so_far``)."""

    counted: np.ndarray  # bool per record: its token count is known
    counted_before: int = 0  # how many were known from the cache
    key: dict | None = None  # the embeddings' cache key
    committing: bool = False  # the whole set is being stored: nothing part-way to keep
    fill: caches.Fill | None = None  # the embeddings set being filled
    filled: np.ndarray | None = None  # bool per record: its row of ``fill`` is written (None: not known yet)
    embedding: embed.Finished = field(default_factory=embed.Finished)  # rows embedded (and counted)
    counting: embed.Finished = field(default_factory=embed.Finished)  # rows only counted


def _keep_work_so_far(work: _WorkSoFar, index, counts: np.ndarray, count_places: list[Path], count_key: dict,
                      stop: BaseException) -> None:
    """After Ctrl-C or SIGTERM (``stop``), store the embeddings and token counts computed so far (rows
    of no other record are marked unfilled, see ``caches.store``), so that a rerun computes only the
    rest: hours of tokenizing on a large input are not lost. Ctrl-C again stops the saving (the
    caches then stay as they were)."""
    fps = index.fingerprints
    fill, work.fill = work.fill, None
    try:
        with interrupts.finishing("keeping the embeddings and token counts computed so far"):
            for finished in (work.embedding, work.counting):
                counts[finished.rows] = finished.counts
                work.counted[finished.rows] = True
            if fill is not None and work.filled is not None:
                work.filled[work.embedding.rows] = True
                done = int(np.count_nonzero(work.filled))
                if done:
                    fill.commit(work.key, fps, None if done == len(index) else work.filled)
                    log.warning("%s: %d of %d embeddings are kept in %s; a rerun embeds at most the other %d",
                                _stop_name(stop), done, len(index), fill.files.data, len(index) - done)
                else:
                    fill.abandon()
                fill = None
            done = int(np.count_nonzero(work.counted))
            if done > work.counted_before:
                store_token_counts(count_places, count_key, fps, counts,
                                   None if done == len(index) else work.counted)
                if work.embedding.rows.size == 0:  # else said with the embeddings, counted with them
                    log.warning("%s: the token counts of %d of %d records are kept in %s; a rerun counts at most the "
                                "other %d", _stop_name(stop), done, len(index), count_places[0], len(index) - done)
    finally:
        if fill is not None:
            fill.abandon()


def _stop_name(stop: BaseException) -> str:
    return "Terminated (SIGTERM)" if isinstance(stop, interrupts.Terminated) else "Interrupted"


def _without(rows: np.ndarray, taken: np.ndarray, n: int) -> np.ndarray:
    """``rows`` not in ``taken`` (rows of an input of ``n``), ascending. A mask, not np.setdiff1d,
    which sorts both arrays: 13 s for 10M rows."""
    left = np.zeros(n, dtype=bool)
    left[rows] = True
    left[taken] = False
    return np.flatnonzero(left)


def _embeddings(index: RecordIndex, path: Path, work: _WorkSoFar, model: ModelParts, tokenizer, counts: np.ndarray,
                batch_docs: int, progress: bool, ctx: distributed.DistContext, dtype: str,
                hold_rows: np.ndarray | None = None) -> tuple[Matrix | None, np.ndarray]:
    """The embeddings cache brought up to date, the rows embedded (their ``counts`` set), as
    (the cache's rows when nothing changed, else None; the rows embedded). The set being filled, to
    commit (on rank 0), is ``work.fill``; the caller abandons it on an error."""
    dim = model.table().dim
    found = caches.lookup(path, work.key, index.fingerprints, dtype=dtype, row_shape=(dim,), lazy=True)
    log.info("Embeddings: %s", found.reason)
    embed_rows = found.missing_rows
    if found.in_order:
        return (matrix.MatrixFile.open(found.files.data) if ctx.is_main else None), embed_rows
    work.fill = caches.Fill(path, (len(index), dim), dtype, hold_rows) if ctx.is_main else None
    if work.fill is not None:
        found.copy_into(work.fill.rows)
        work.filled = found.hit.copy()
    if embed_rows.size:
        log.info("Embedding %d record(s) of %d (tokenized once for counts and vectors)",
                 embed_rows.size, len(index))
        out = work.fill.rows if work.fill is not None else None
        _, new_counts = _tokenize_rows(ctx, index, embed_rows, tokenizer, model.table().weight, batch_docs,
                                       progress, out=out, finished=work.embedding)
        counts[embed_rows] = new_counts
    work.embedding.rows, work.embedding.counts = embed_rows, (new_counts if embed_rows.size else counts[:0])
    return None, embed_rows


def token_count_places(paths: dict) -> list[Path]:
    """Where token counts are cached: beside the input, else (input folder not writable) beside the output."""
    primary = Path(paths["token_counts"])
    fallback = Path(paths["embeddings"]).parent / primary.name
    return [primary] if fallback.absolute() == primary.absolute() else [primary, fallback]


def token_counts_file(paths: dict, fingerprints: np.ndarray) -> Path:
    """The cache file holding this run's token counts: the first place whose fingerprints are the records' (beside
    the output where the input's folder could not be written), else the usual place beside the input."""
    places = token_count_places(paths)
    for place in places:
        with contextlib.suppress(OSError, ValueError):
            if np.array_equal(np.load(caches.files_for(place).fingerprints, mmap_mode="r"), fingerprints):
                return place
    return places[0]


def store_token_counts(places: list[Path], key: dict, fps: np.ndarray, counts: np.ndarray,
                       filled: np.ndarray | None = None) -> None:
    """``filled``: only those records' counts are known (see ``caches.store``)."""
    problem = caches.try_store(places[0], key, fps, counts, filled=filled)
    if problem is None:
        return
    if len(places) == 1:
        log.warning("Cache %s not written (%s); the run goes on without it", places[0], problem)
        return
    log.warning("Token counts cannot be cached beside the input (%s); cached in %s instead", problem, places[1])
    caches.store(places[1], key, fps, counts, filled=filled)
