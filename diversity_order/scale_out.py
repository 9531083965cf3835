"""torchrun without gathering vectors: only labels and token counts reach rank 0.

Rank 0 holds the input's index (24 bytes per record, file-backed); every other rank, when it can,
only the index of its own records (those starting in its byte range: the ranks index the input
together, see ``sources.open_rank_source``). Then:

1. **Embeds into one shared file.** The embedding cache ``B_embeddings.npy`` (rows in input
   order, keyed by per-record text fingerprints, as in a single process) is the meeting point.
   Rows already cached are reused wherever they moved; when the cache does not already hold
   exactly the current records in order, rank 0 creates a temp file beside it and every rank
   writes into it, with ``pwrite``, the cached rows of its own records (rank 0, which looked them
   up, sends each rank where they lie) and the vectors of the rest of them, which it computes (or,
   when those lie unevenly across the ranks, an equal share of all of them: ``balanced_work``).
   Rank 0 then digests the file and renames it
   into place with the cache's manifest, as ``caches.store`` would. The file does not depend on
   the number of ranks, so a rerun with another ``--nproc-per-node`` or ``--nnodes`` reuses it
   (and so does a single-process run). The output folder must be on a filesystem every rank
   sees (checked: a one-line error otherwise).
2. **Fits k-means on a seeded sample.** The rows ``clustering.sample_rows(N, S, seed)`` picks
   (S = ``--cluster-fit-sample``, or ``DEFAULT_FIT_SAMPLE``) are sent by the ranks that hold
   them to rank 0, which fits PCA (``--pca-components``) and the k-means centres on them exactly
   as a single process with ``--cluster-fit-sample S`` fits its centres, and broadcasts them.
3. **Assigns its own rows.** Each rank reads its equal-count row range from the file a block at
   a time, projects it (PCA) and assigns every row to its nearest centre; rank 0 gathers the
   labels (8 bytes per record) beside the token counts (8 bytes per record), orders and writes.

When S >= N (small inputs) rank 0 gathers the rows themselves and runs the single-process
stages on them, so the result is the single process's byte for byte. With S < N the labels are
those of a single process run with ``--cluster-fit-sample S``, except with ``--pca-components``,
where the single process fits PCA on every row and the ranks on the sample.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from . import atomic, caches, clustering, distributed, embed, features, kept_rows, matrix
from .clustering import PCAInfo
from .distributed import DistContext
from .errors import UserError
from .matrix import MatrixFile

log = logging.getLogger(__name__)

# Rows k-means (and PCA) is fitted on under torchrun when --cluster-fit-sample is not given: the
# sample rank 0 receives is this many rows (at 576 floats, 115 MB), whatever N is.
DEFAULT_FIT_SAMPLE = 50_000


def fit_rows(cluster_fit_sample: int, n: int) -> int:
    """How many rows the fit sees under torchrun (all of them when the input is that small)."""
    return min(cluster_fit_sample or DEFAULT_FIT_SAMPLE, n)


# ---- the shared embedding file -------------------------------------------------------------------


def _create_rows_file(target: Path, n: int, dim: int) -> tuple[Path, int]:
    """An atomic-write temp file beside ``target``: the ``.npy`` header of an N x D float32 array
    and room for its rows (reserved on disk, see ``matrix.reserve``). Returns its path and the rows' offset."""
    atomic.note_target(target)  # a killed run's temp is swept by a later run
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                                  "fortran_order": False, "shape": (n, dim)})
    fd, name = tempfile.mkstemp(prefix=atomic.temp_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        atomic.give_plain_permissions(name)
        os.write(fd, header.getvalue())
        os.ftruncate(fd, len(header.getvalue()) + n * dim * 4)
        matrix.reserve(fd, len(header.getvalue()), n * dim * 4)
    except OSError as exc:
        os.unlink(name)
        raise matrix.no_room(target, n * dim * 4, exc) from None
    finally:
        os.close(fd)
    return Path(name), len(header.getvalue())


def _copy_rows(path: Path, source: np.ndarray, lo: int, writer: matrix.RowWriter) -> None:
    hits = np.flatnonzero(source >= 0)
    if hits.size == 0:
        return
    old = MatrixFile.open(path)
    by_source = np.argsort(source[hits], kind="stable")
    sources, targets = source[hits][by_source], hits[by_source] + lo
    for start in range(0, old.shape[0], matrix.BLOCK_ROWS):
        a, b = np.searchsorted(sources, [start, start + matrix.BLOCK_ROWS])
        if a < b:
            block = old.block(start, min(start + matrix.BLOCK_ROWS, old.shape[0]))
            writer[targets[a:b]] = block[sources[a:b] - start]


def _shared_file(ctx: DistContext, target: Path, n: int, dim: int) -> tuple[Path, int]:
    """Rank 0 creates the file every rank writes into; each rank finds it in its own view of the folder
    (a node may mount it elsewhere, or resolve a relative --output from another working folder)."""
    name, offset = distributed.from_main(ctx, lambda: _create_rows_file(target, n, dim),
                                         f"creating the embeddings file beside {target}")
    return target.parent / name.name, offset


def check_shared_folder(ctx: DistContext, target: Path) -> None:
    """Every rank sees the folder of ``target`` as rank 0 does: rank 0 leaves a temp file of a random name
    there and each rank looks for it under its own path to the folder. Without this a node that sees
    another folder (a relative --output from another working folder, a local disk) fails at the first
    file it reads."""
    if not ctx.active:
        return
    folder = target.parent

    def leave_probe() -> str:
        atomic.note_target(target)  # a killed run's temp is swept by a later run
        try:
            fd, name = tempfile.mkstemp(prefix=atomic.temp_prefix(target), suffix=".tmp", dir=folder)
        except OSError as exc:
            raise UserError(f"cannot write in {folder}: {exc.strerror or exc}") from None
        os.close(fd)
        return Path(name).name

    name = distributed.from_main(ctx, leave_probe, f"writing in {folder}")
    try:
        seen = distributed.all_agree(ctx, (folder / name).is_file())
    finally:
        if ctx.is_main:
            (folder / name).unlink(missing_ok=True)
    if not seen:
        raise UserError(f"torchrun: the ranks do not share the folder {folder.absolute()} (rank 0 left {name} there and "
                        "another rank cannot see it under its path to the folder): put --output on a filesystem "
                        "every node mounts")


def own_rows(ctx: DistContext, index, rank_rows: np.ndarray | None) -> np.ndarray:
    """Each rank's contiguous input rows (``world_size + 1`` bounds): those it indexed (``rank_rows``,
    see ``sources.open_rank_source``), else a split of the whole index balanced by bytes."""
    return rank_rows if rank_rows is not None else distributed.split_by_bytes(index.row_sizes, ctx.world_size)


# A rank embeds its own new records unless the busiest rank would have this much more than an
# equal share of the new bytes: then the ranks hand each other records (a rerun after data was
# appended finds every new record in the last rank's range).
REBALANCE_ABOVE = 1.25


def balanced_work(ctx: DistContext, index, bounds: np.ndarray, rows: np.ndarray) -> tuple[object, np.ndarray]:
    """The records this rank embeds, given ``rows``, its own records that need it (ascending, within
    its ``bounds``): those rows, unless the ranks' shares of the new bytes are uneven (see
    ``REBALANCE_ABOVE``). Then the new rows, in input order, are cut into ``world_size`` runs of
    about equal bytes, rank d embeds run d, and the ranks that hold its records hand them over (their
    rows and, where rank d holds only its own records, their index: ``sources.records_slice``).
    Returns (the source to read them from, the rows). Run d lies before run d + 1, so the token
    counts gathered in rank order stay in input order."""
    from .records import RecordIndex
    from .sources import RecordPieces, record_bytes, records_slice

    world = ctx.world_size
    sizes = record_bytes(index, rows)
    shares = [int(b) for b in distributed.all_gather_object(ctx, int(sizes.sum()))]
    total = sum(shares)
    if world == 1 or total == 0 or max(shares) <= REBALANCE_ABOVE * total / world:
        return index, rows
    middles = sum(shares[:ctx.rank]) + np.cumsum(sizes) - sizes / 2  # each row's place in the new bytes
    run_of = np.minimum((middles * world / total).astype(np.int64), world - 1)
    counts = np.bincount(run_of, minlength=world)
    plan = np.asarray(distributed.all_gather_object(ctx, counts.tolist()))  # plan[r, d]: rows r hands d
    shipped = {d: rows[run_of == d] for d in range(world) if d != ctx.rank and plan[ctx.rank, d]}
    # The receiver may hold only its own records (rank 0 holds all): JSONL records travel with their index.
    sliceable = isinstance(index, (RecordIndex, RecordPieces))
    outgoing = {d: (moved, records_slice(index, int(moved[0]), int(moved[-1]) + 1) if sliceable else None)
                for d, moved in shipped.items()}
    incoming = [r for r in range(world) if r != ctx.rank and plan[r, ctx.rank]]
    received = distributed.exchange_objects(ctx, outgoing, incoming)
    received[ctx.rank] = (rows[run_of == ctx.rank], None)
    ranks = sorted(r for r, (moved, _) in received.items() if moved.size)
    work = np.concatenate([received[r][0] for r in ranks]) if ranks else rows[:0]
    if ctx.is_main:
        log.info("New records handed between ranks so that each embeds about 1/%d of their bytes (the busiest "
                 "held %.0f%% of them)", world, 100 * max(shares) / total)
    if not isinstance(index, RecordPieces) or index.holds_all():  # this rank reads any record itself
        return index, work
    pieces = []
    for r in ranks:
        moved, parts = received[r]
        if r == ctx.rank:
            pieces.extend(_own_pieces(index, moved))
        else:
            first = int(moved[0])
            for part in parts:
                pieces.append((first, part))
                first += len(part)
    return RecordPieces(pieces, len(index), index.name), work


def _own_pieces(index, rows: np.ndarray) -> list[tuple[int, object]]:
    """The pieces of ``index`` (a ``RecordPieces``) that hold ``rows``."""
    return [(first, part) for first, part in index.pieces
            if np.any((rows >= first) & (rows < first + len(part)))]


def _embed_rows(ctx: DistContext, index, rows: np.ndarray, tokenizer, table, batch_docs: int, progress: bool,
                out=None, finished: embed.Finished | None = None) -> np.ndarray:
    """Tokenize (and embed into ``out``) ``rows``, this rank's own; their token counts (in row order).
    ``finished``: see ``embed.embed_and_count``."""
    if rows.size:
        log.info("Rank %i of %d: %d record(s)", ctx.rank, ctx.world_size, rows.size)
    _, counts, stats = embed.embed_and_count(index, rows, tokenizer, table, batch_docs=batch_docs,
                                             progress=progress and ctx.is_main, out=out, finished=finished)
    if table is not None and rows.size:
        log.info("Embedded %d documents, %d tokens, in %.1f s (%s tokens/s on this rank)", stats.documents,
                 stats.tokens, stats.seconds, f"{stats.tokens / max(stats.seconds, 1e-9):,.0f}")
    return counts


def _gather(ctx: DistContext, part: np.ndarray) -> np.ndarray | None:
    """The ranks' parts concatenated in rank order on rank 0; None on the others."""
    gathered = distributed.gather_to_main(ctx, part, distributed.comm_device())
    return None if gathered is None else np.concatenate(gathered)


def counts_and_shared_embeddings(ctx: DistContext, index, paths: dict, model: features.ModelParts, text_field: str,
                                 batch_docs: int, progress: bool, rank_rows: np.ndarray | None = None
                                 ) -> tuple[np.ndarray | None, MatrixFile]:
    """Token counts (rank 0; None on the others) and the shared embedding file (every rank),
    reusing the caches as a single process does (see the module doc).

    Rank 0 (which holds the whole index) looks the records up in the caches and decides; each rank
    then gets, for its own rows only, where their cached vectors are, copies those, and embeds the
    rest of its rows. ``index`` on another rank needs to read only its own rows."""
    tokenizer = model.tokenizer("to embed the documents")
    table = model.table()
    bounds = own_rows(ctx, index, rank_rows)
    lo, hi = int(bounds[ctx.rank]), int(bounds[ctx.rank + 1])
    emb_key = features.embedding_key(tokenizer.fingerprint, table, text_field)
    target = Path(paths["embeddings"])
    check_shared_folder(ctx, target)
    decided = fps = count_key = None  # (rank 0's: the others need not know them)
    if ctx.is_main:
        fps, n = index.fingerprints, len(index)
        count_key = features.token_count_key(tokenizer.fingerprint, text_field)
        count_places = features.token_count_places(paths)
        kept_rows.recover(target, emb_key, count_places, count_key)
        kept_rows.recover(kept_rows.counts_target(paths), None, count_places, count_key)
        counts_found = caches.lookup(count_places[0], count_key, fps, dtype=np.int64, row_shape=(),
                                     alternatives=tuple(count_places[1:]))
        found = caches.find_rows(target, emb_key, fps, dtype=np.float32, row_shape=(table.dim,))
        log.info("Token counts: %s", counts_found.reason)
        log.info("Embeddings: %s", found.reason)
        counts = np.zeros(n, np.int64) if counts_found.data is None else counts_found.data.astype(np.int64)
        missing = found.missing_rows
        count_rows = np.flatnonzero(~counts_found.hit & found.hit)  # counts missing, vectors cached
        decided = (n, found.in_order, [files.data for files, _ in found.sets])
        if not found.in_order:
            if missing.size:
                log.info("Embedding %d record(s) of %d on %d ranks, into %s", missing.size, n,
                         ctx.world_size, target.name)
            else:
                log.info("Writing %s in input order from the cached rows (nothing to embed)", target.name)
    n, in_order, set_paths = distributed.broadcast_object(ctx, decided)
    shared = target
    if not in_order:
        name, offset = _shared_file(ctx, target, n, table.dim)
        kept_rows.started(ctx, target, name, emb_key, count_key, fps, copies=bool(set_paths))
        # Ctrl-C or SIGTERM (a scheduler's preemption) keeps what every rank wrote, for the next run.
        with kept_rows.keeping(ctx.rank, target, name, kept_rows.RankWork()) as work:
            writer = matrix.RowWriter.open(name, offset, (n, table.dim), np.float32)
            try:
                hit = np.zeros(hi - lo, dtype=bool)
                for number, path in enumerate(set_paths):  # where this rank's rows lie in each cached set
                    source = distributed.scatter_ranges(ctx, found.sets[number][1] if ctx.is_main else None, bounds)
                    _copy_rows(path, source, lo, writer)
                    hit |= source >= 0
                    del source
                work.copied, work.copied_all = np.flatnonzero(hit) + lo, True
                source, rows = balanced_work(ctx, index, bounds, np.flatnonzero(~hit) + lo)
                mine = _embed_rows(ctx, source, rows, tokenizer, table.weight, batch_docs, progress, writer,
                                   work.computed)
                work.computed = embed.Finished(np.sort(rows), mine)
                del source
            finally:
                writer.close()
            kept_rows.say(ctx.rank, target, work)
            new_counts = _gather(ctx, mine)
            digest = _digest_together(ctx, name)
        adopted = distributed.from_main(ctx, lambda: _adopt(target, emb_key, fps, name, digest),
                                        f"keeping the embeddings as {target}")
        shared = target.parent / adopted.name  # (this rank's view of rank 0's path)
        if ctx.is_main:
            kept_rows.discard(target)
            counts[missing] = new_counts
    count_rows = distributed.broadcast_array(ctx, count_rows if ctx.is_main else None)
    if count_rows.size:
        if ctx.is_main:
            log.info("Counting tokens of %d record(s) of %d", count_rows.size, n)
        new_counts = kept_rows.counted_by_ranks(
            ctx, kept_rows.counts_target(paths), count_key, fps, count_rows[(count_rows >= lo) & (count_rows < hi)],
            lambda mine, finished: _embed_rows(ctx, index, mine, tokenizer, None, batch_docs, progress,
                                               finished=finished))
        if ctx.is_main:
            counts[count_rows] = new_counts
    if ctx.is_main and not counts_found.in_order:
        features.store_token_counts(count_places, count_key, fps, counts)
    return (counts if ctx.is_main else None), MatrixFile.open(shared)


def _digest_together(ctx: DistContext, path: Path) -> str | None:
    """The file's cache digest, each rank reading every world_size-th chunk (rank 0 alone would read
    all N x D x 4 bytes); rank 0 gets it, the other ranks None."""
    distributed.barrier(ctx)  # every rank has closed its writes: each may read the others' rows
    started = time.perf_counter()
    size = path.stat().st_size
    mine = range(ctx.rank, caches.chunk_count(size), ctx.world_size)
    digests = np.frombuffer(bytearray(b"".join(caches.chunk_digests(path, mine))), np.uint8).reshape(
        -1, caches.CHUNK_DIGEST_BYTES)
    parts = distributed.gather_to_main(ctx, digests, distributed.comm_device())
    if parts is None:
        return None
    log.info("%s digested in %.1f s (%d chunk(s) over %d rank(s))", path.name, time.perf_counter() - started,
             caches.chunk_count(size), ctx.world_size)
    return caches.combine_chunk_digests(dealt_back(parts), size)


def dealt_back(parts: list) -> list[bytes]:
    """Items dealt round-robin (rank r took items r, r + W, ...), back in item order."""
    total = sum(len(part) for part in parts)
    return [bytes(parts[i % len(parts)][i // len(parts)]) for i in range(total)]


def _adopt(target: Path, key: dict, fps: np.ndarray, written: Path, digest: str | None) -> Path:
    """The filled file becomes the cache; if it cannot, this run reads it where it is (a later run's
    sweep removes it) and the cache is not written."""
    try:
        caches.adopt(target, key, fps, written, digest)
        return target
    except OSError as exc:
        log.warning("Cache %s not written (%s); the run goes on without it", target, exc.strerror or exc)
        return written


def external_embeddings(path: Path, n_records: int) -> MatrixFile:
    """``--load-embeddings`` for the ranks: checked, then read a block at a time (NaN rows as zeros)."""
    from .arrays import load_matrix, load_npy

    mapped = load_npy(path, "--load-embeddings")
    if mapped.ndim != 2 or mapped.shape[1] < 1 or not np.issubdtype(mapped.dtype, np.floating):
        load_matrix(path, "--load-embeddings")  # raises the one-line error saying what is wrong
    rows = mapped.shape[0]
    del mapped
    if rows != n_records:
        raise UserError(f"--load-embeddings {path}: {rows} rows, but the input has {n_records} records")
    return MatrixFile.open(path)


# ---- clustering from a sample --------------------------------------------------------------------


def _rows_of(vectors: MatrixFile, lo: int, hi: int) -> MatrixFile:
    """Rows lo..hi of the file, as a file of their own (nothing is read)."""
    step = vectors.shape[1] * vectors.dtype.itemsize
    return MatrixFile(vectors.path, (hi - lo, vectors.shape[1]), vectors.dtype, vectors.offset + lo * step)


def gather_all_rows(ctx: DistContext, vectors: MatrixFile) -> np.ndarray | None:
    """Every row on rank 0, each rank sending its range (only for inputs within the fit sample)."""
    return _gather(ctx, matrix.load(_rows_of(vectors, *distributed.even_range(ctx, vectors.shape[0]))))


def labels_from_sample(ctx: DistContext, vectors: MatrixFile, n_clusters: int, seed: int, backend: str,
                       sample_size: int, pca_components: int, device=None
                       ) -> tuple[np.ndarray | None, PCAInfo | None, object]:
    """Labels of every row (rank 0; None elsewhere): PCA and centres fitted on rank 0 from the
    seeded sample the ranks send, each rank assigning its own rows (see the module doc). Also the
    projection into the space the labels were found in (rows -> reduced rows; None without PCA), for
    statistics measured there as one process measures them."""
    n = vectors.shape[0]
    lo, hi = distributed.even_range(ctx, n)
    sample = clustering.sample_rows(n, sample_size, seed)
    mine = sample[(sample >= lo) & (sample < hi)] - lo
    # Rank order = row order: rank 0 gets the sample in ascending rows, as one process reads it.
    rows = _gather(ctx, matrix.read_rows(_rows_of(vectors, lo, hi), mine))

    def fit():
        nonlocal rows
        pca, info = _fit_pca(rows, pca_components, seed)
        if pca is not None:
            rows = _project(pca, rows)
        log.info("k-means fitted on %d sampled rows of %d; every rank assigns its own rows", rows.shape[0], n)
        fitted = (pca, info, clustering.fit_centres(rows, n_clusters, seed, backend, device))
        rows = None
        return fitted

    pca, info, centres = distributed.from_main(ctx, fit, "fitting k-means on the sample")
    labels = np.empty(hi - lo, dtype=np.int64)
    for start, stop, block in matrix.blocks(_rows_of(vectors, lo, hi)):
        labels[start:stop] = clustering.assign_to_centres(block if pca is None else _project(pca, block), centres,
                                                          device)
    return _gather(ctx, labels), info, (None if pca is None else functools.partial(_project, pca))


def _fit_pca(rows: np.ndarray, n_components: int, seed: int):
    """PCA fitted on the sample as ``clustering.reduce_matrix`` fits it out of core; (None, None) when off."""
    if n_components <= 0:
        return None, None
    from sklearn.decomposition import PCA

    kept = min(n_components, rows.shape[0] - 1, rows.shape[1])
    if kept < 1:
        log.warning("PCA skipped: %d sampled row(s) leave no component to keep", rows.shape[0])
        return None, None
    pca = PCA(n_components=kept, random_state=seed).fit(rows)
    info = PCAInfo(kept, round(float(pca.explained_variance_ratio_.sum()), 4), rows.shape[1], fit_rows=rows.shape[0])
    log.info("PCA kept %d of %d dimensions, %.1f%% of the sample's variance", kept, rows.shape[1],
             100 * info.explained_variance)
    return pca, info


def _project(pca, rows: np.ndarray) -> np.ndarray:
    reduced = pca.transform(rows)
    return (reduced / np.maximum(np.linalg.norm(reduced, axis=1, keepdims=True), 1e-8)).astype(np.float32)
