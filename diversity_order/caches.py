"""Per-row caches that know which rows are still valid.

A cache is a few plain files beside each other (``CacheFiles``):

- ``NAME.npy``: the data, one row per record, in input order (what the original toolkit writes);
- ``NAME.fingerprints.npy``: uint64, the fingerprint of each row's text;
- optional extras, e.g. the flat token ids whose per-row lengths are the data;
- ``NAME.cache.json``: the manifest, written last: what the rows were computed with (model,
  tokenizer, text field), the row count, dtype and shape, and for every file of the set its
  identity (size, mtime_ns, inode) and a digest of its content (XXH3-128: it tells a copied,
  touched or replaced file from the one written; it is no defence against forgery).

The set is validated as one unit: it is trusted when every file's identity matches the manifest
(no file is read for that); a file whose identity differs (copied, touched) is digested, and the
set is trusted and the manifest refreshed only when every digest matches. A file replaced by
another run writing the same cache at the same time, or swapped in from another set, fails the
digest and the set is rejected with a reason in the log. The caller also names the dtype and row
shape it expects, so a cache of the right key but the wrong kind of array is never used.

On the next run each record's text fingerprint is looked up among the cached ones: rows whose
text is unchanged are reused wherever they moved, only new or edited rows are recomputed,
removed rows are dropped, and a different model or text field invalidates everything. (The
original toolkit compares row counts only and silently reuses stale vectors after an edit.)
``CacheLookup.in_order`` says whether the set already holds exactly the current records in
order; otherwise the caller stores it again, so the files always follow the input.

Rows the named cache lacks are looked for in other sets with the same key: ones the caller
names (``alternatives``) and ones recorded in the registry, an append-only JSON-lines file
``registry.jsonl`` under ``$DIVERSITY_ORDER_CACHE_DIR`` (default ``$XDG_CACHE_HOME/diversity-order``
or ``~/.cache/diversity-order``; an empty value turns it off) to which every ``store`` adds its
set. So a run with a new output name reuses what a run with the old name computed.

A cache is an optimisation: one that cannot be read is recomputed, one that cannot be written is
a warning (``store(required=True)`` for files that are the product itself).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import mmap
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from . import arrays, atomic, matrix
from .errors import UserError

log = logging.getLogger(__name__)

MANIFEST_VERSION = 2
# Files are digested in chunks of this size, hashed in parallel (the hashers release the GIL), and
# the chunk digests hashed together.
DIGEST_CHUNK = 64 << 20
XXH3 = "xxh3-128 of 64 MiB chunk digests"
BLAKE2B = "blake2b-256 of 64 MiB chunk digests"
# Digest schemes by the name a manifest records. New sets are digested with XXH3 (~13 GB/s on one
# core here): blake2b (~1 GB/s) cost a 10M-document run ~20 CPU-seconds for its 23 GB cache, on
# cores the tokenizer needs. Manifests written before keep theirs, checked with blake2b.
DIGESTS = {XXH3: xxhash.xxh3_128, BLAKE2B: functools.partial(hashlib.blake2b, digest_size=32)}
DIGEST_NAME = XXH3
CHUNK_DIGEST_BYTES = DIGESTS[DIGEST_NAME]().digest_size  # what ``chunk_digests`` returns per chunk
IDENTITY = ("size", "mtime_ns", "inode")
REGISTRY_FILE = "registry.jsonl"
NO_CACHE = "no cache yet"  # a lookup's reason where the target has no set
# How a log names rows reused from a cache another run wrote elsewhere (found through the registry).
FROM_ANOTHER_RUN = ("another run's cache for the same model and settings, found through the cache registry; its rows "
                    "matched to these records by text; DIVERSITY_ORDER_CACHE_DIR='' turns the registry off")
REGISTRY_COMPACT_LINES = 1000  # rewrite the registry without duplicates and gone sets beyond this many lines
COPY_CHUNK_ROWS = 65536  # rows a lazy lookup copies at a time (CacheLookup.copy_into)


@dataclass(frozen=True)
class CacheFiles:
    """The files of one cache."""

    data: Path
    fingerprints: Path
    marker: Path
    extras: dict[str, Path] = field(default_factory=dict)


# A cache's manifest is NAME.cache.json beside NAME.npy (the input's token counts lie beside the input, so a glob or
# folder of data files may catch it: the input's reader leaves such files out).
MANIFEST_SUFFIX = ".cache.json"


def files_for(data_path: Path, extras: tuple[str, ...] = ()) -> CacheFiles:
    """The usual names beside ``NAME.npy``: ``NAME.fingerprints.npy``, ``NAME.cache.json``, ``NAME.EXTRA.npy``."""
    data_path = Path(data_path)
    stem = data_path.name[:-4] if data_path.name.endswith(".npy") else data_path.name
    return CacheFiles(data_path, data_path.with_name(stem + ".fingerprints.npy"), data_path.with_name(stem + MANIFEST_SUFFIX),
                      {name: data_path.with_name(f"{stem}.{name}.npy") for name in extras})


def sidecar_paths(data_path: Path) -> tuple[Path, Path]:
    """(fingerprints, marker) beside ``data_path``."""
    files = files_for(data_path)
    return files.fingerprints, files.marker


@dataclass
class CacheLookup:
    """Cached rows found for the current records."""

    data: np.ndarray | None  # rows for the current records, valid where ``hit``
    hit: np.ndarray  # bool per current record
    reason: str  # why nothing (or what) was reused, for the log
    source: np.ndarray | None = None  # int64 per current record: its row in ``cached`` (-1: none, or from another set)
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # the extras of ``files``, memory-mapped
    cached: np.ndarray | None = None  # the rows of ``files`` as stored, memory-mapped
    key: dict | None = None  # the key the reused rows were computed with
    in_order: bool = False  # ``files`` holds exactly the current records, in order: nothing to store
    files: CacheFiles | None = None  # the valid set that ``source``, ``cached`` and ``extras`` refer to
    # A lazy lookup's reused rows, not yet copied: (current rows, their rows in the array, mapped array).
    copies: list = field(default_factory=list)
    # The data file of another run's set that every row came from, where one did (its files beside it, e.g. a
    # projection's fit, belong to these rows too).
    origin: Path | None = None

    @property
    def missing_rows(self) -> np.ndarray:
        return np.flatnonzero(~self.hit)

    def copy_into(self, out, chunk_rows: int = COPY_CHUNK_ROWS) -> None:
        """Write a lazy lookup's reused rows into ``out`` (assignable by row index, e.g. a
        ``matrix.RowWriter``) a chunk at a time; the pages read are released after each chunk, so
        the copy never holds more than one chunk."""
        for rows, stored, array in self.copies:
            for lo in range(0, rows.size, chunk_rows):
                out[rows[lo : lo + chunk_rows]] = array[stored[lo : lo + chunk_rows]]
                _release_pages(array)


def _release_pages(array: np.ndarray) -> None:
    """Drop the pages of a read-only map from this process's resident memory (they stay in the page cache)."""
    mapped = getattr(array, "_mmap", None)
    if mapped is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)


def _files(target: Path | CacheFiles) -> CacheFiles:
    return target if isinstance(target, CacheFiles) else files_for(target)


def _roles(files: CacheFiles) -> dict[str, Path]:
    """Every file of the set by its role in the manifest."""
    return {"data": files.data, "fingerprints": files.fingerprints,
            **{f"extra:{name}": path for name, path in files.extras.items()}}


def _normal(obj):
    """``obj`` as it reads back from JSON, so keys compare equal across a round trip (tuples, numpy ints)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=atomic.json_default))


# ---- digests -------------------------------------------------------------------------------------


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _hash_parts(parts, scheme: str = DIGEST_NAME) -> bytes:
    digest = DIGESTS[scheme]()
    for part in parts:
        digest.update(part)
    return digest.digest()


def _combine(chunk_digests: list[bytes], size: int, scheme: str = DIGEST_NAME) -> str:
    digest = DIGESTS[scheme]()
    digest.update(f"{size}:".encode())
    for chunk in chunk_digests:
        digest.update(chunk)
    return digest.hexdigest()


def _chunks(pieces: list[memoryview]) -> list[list[memoryview]]:
    """The bytes of ``pieces`` back to back, cut into DIGEST_CHUNK-sized lists of views (no copies)."""
    chunks, current, size = [], [], 0
    for piece in pieces:
        at = 0
        while at < len(piece):
            take = min(DIGEST_CHUNK - size, len(piece) - at)
            current.append(piece[at : at + take])
            size += take
            at += take
            if size == DIGEST_CHUNK:
                chunks.append(current)
                current, size = [], 0
    if current or not chunks:
        chunks.append(current)
    return chunks


def _write_digesting(pieces: list[memoryview], write, scheme: str = DIGEST_NAME) -> str:
    """Write ``pieces`` with ``write`` while other threads digest them; the file's digest."""
    chunks = _chunks(pieces)
    size = sum(len(piece) for piece in pieces)
    if len(chunks) == 1:
        for piece in pieces:
            write(piece)
        return _combine([_hash_parts(chunks[0], scheme)], size, scheme)
    with ThreadPoolExecutor(_workers()) as pool:
        futures = [pool.submit(_hash_parts, chunk, scheme) for chunk in chunks]
        for piece in pieces:
            write(piece)
        return _combine([future.result() for future in futures], size, scheme)


def digest_buffer(buffer, scheme: str = DIGEST_NAME) -> str:
    """The digest a file holding exactly these bytes would have (its chunks hashed in parallel)."""
    return _write_digesting([memoryview(buffer).cast("B")], lambda piece: None, scheme)


def records_digest(fingerprints) -> str:
    """The digest of records' text fingerprints (as uint64, however they were stored): which records, in which order."""
    return digest_buffer(np.ascontiguousarray(fingerprints, dtype=np.uint64).reshape(-1).view(np.uint8))


def ids_digest(values) -> str:
    """The digest of per-document ids (labels, an order) as int64, however they were stored."""
    return digest_buffer(np.ascontiguousarray(values, dtype=np.int64).reshape(-1).view(np.uint8))


def digest_file(path: Path | str, scheme: str = DIGEST_NAME) -> str:
    """The digest of the file at ``path`` (``digest_buffer`` of its bytes), read chunk by chunk in parallel."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _digest_fd(fd, os.fstat(fd).st_size, scheme)
    finally:
        os.close(fd)


def _chunk_digest(fd: int, size: int, start: int, scheme: str = DIGEST_NAME) -> bytes:
    return _hash_parts([os.pread(fd, min(DIGEST_CHUNK, size - start), start)] if size else [], scheme)


def _digest_fd(fd: int, size: int, scheme: str = DIGEST_NAME) -> str:
    """The digest of the open file ``fd`` (``size`` bytes), read chunk by chunk in parallel."""
    starts = range(0, max(size, 1), DIGEST_CHUNK)
    if len(starts) == 1:
        return _combine([_chunk_digest(fd, size, 0, scheme)], size, scheme)
    with ThreadPoolExecutor(_workers()) as pool:
        return _combine(list(pool.map(lambda start: _chunk_digest(fd, size, start, scheme), starts)), size, scheme)


def _recorded_digest(entry: dict) -> str | None:
    """A manifest entry's digest (manifests before XXH3 named the field after blake2b)."""
    return entry.get("digest", entry.get("blake2b"))


def _identity(stat: os.stat_result) -> dict:
    return {"size": int(stat.st_size), "mtime_ns": int(stat.st_mtime_ns), "inode": int(stat.st_ino)}


# ---- reading and writing one .npy ----------------------------------------------------------------


def _write_npy(path: Path, array: np.ndarray) -> dict:
    """``np.save`` atomically; the file's manifest entry (identity of the file written, digest)."""
    array = np.ascontiguousarray(array)
    header = io.BytesIO()
    fields = np.lib.format.header_data_from_array_1_0(array)
    try:
        np.lib.format.write_array_header_1_0(header, fields)
    except ValueError:  # a header too long for format 1.0
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, fields)
    pieces = [memoryview(header.getvalue()), memoryview(array.reshape(-1).view(np.uint8))]
    with atomic.atomic_open(path, "wb") as handle:
        digest = _write_digesting(pieces, handle.write)
        handle.flush()
        os.fsync(handle.fileno())
        # The temp file's identity is the target's after the rename (rename keeps inode and
        # mtime); taken here, not by stat after the rename, which might see another writer's file.
        identity = _identity(os.fstat(handle.fileno()))
    return {"name": path.name, **identity, "digest": digest}


@dataclass
class _Npy:
    handle: io.BufferedReader
    stat: os.stat_result
    array: np.ndarray


def _open_npy(path: Path) -> _Npy:
    """The array of ``path`` memory-mapped, with the identity of the very file mapped."""
    handle = open(path, "rb")  # noqa: SIM115 (closed by the caller)
    try:
        stat = os.fstat(handle.fileno())
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            raise ValueError(f".npy format {version} is not one this package writes")
        if dtype.hasobject:
            raise ValueError("holds Python objects")
        offset = handle.tell()
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if stat.st_size != offset + nbytes:
            raise ValueError(f"{stat.st_size} bytes where its header says {offset + nbytes}")
        order = "F" if fortran else "C"
        array = np.zeros(shape, dtype, order=order) if nbytes == 0 else \
            np.memmap(handle, dtype=dtype, mode="r", shape=shape, offset=offset, order=order)
        return _Npy(handle, stat, array)
    except BaseException:
        handle.close()
        raise


# ---- one validated set ---------------------------------------------------------------------------


@dataclass
class _Set:
    files: CacheFiles
    meta: dict
    fingerprints: np.ndarray
    data: np.ndarray
    extras: dict[str, np.ndarray]
    legacy: bool  # a marker without a manifest (written before manifests existed)


@dataclass(frozen=True)
class _Expect:
    dtype: np.dtype | None
    row_shape: tuple | None  # None entries: any size

    def matches(self, array: np.ndarray) -> bool:
        if self.dtype is not None and array.dtype != self.dtype:
            return False
        if self.row_shape is None:
            return True
        rows = array.shape[1:]
        return len(rows) == len(self.row_shape) and all(w is None or w == r for w, r in zip(self.row_shape, rows))

    def describe(self) -> str:
        shape = "x".join("D" if w is None else str(w) for w in self.row_shape) if self.row_shape else "scalar"
        return f"{self.dtype or 'any'} rows of shape {shape if self.row_shape is not None else 'any'}"


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype} rows of shape {'x'.join(map(str, array.shape[1:])) or 'scalar'}"


class OtherRows(str):
    """Why a set was not used: it holds rows of another dtype or shape (another --embedding-dtype's set of the same
    key), which is no fault of the set: said once at debug level, not for each such set on every run."""


# A key's entries as a changed one is said, where its name says less than what it covers (the tokenizer's hash
# covers the folder's chat template: a reviewer who changed only the template read "a different tokenizer").
_KEY_WORDS = {"tokenizer": "tokenizer or chat template", "embeddings": "embeddings (by their digest)",
              "rows": "records or record order", "n_clusters": "k", "fit_rows": "fit sample",
              "fitter": "fitting library or device"}


def _open_set(files: CacheFiles, key: dict | None, expect: _Expect) -> _Set | str:
    """The set of ``files`` when it is complete, of ``key`` (None: any) and ``expect``; else why not."""
    name = files.data.name
    for path in _roles(files).values():
        atomic.note_target(path)  # a killed writer's temps beside it are swept at the end of the run
    try:
        meta = json.loads(files.marker.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        if files.data.exists():
            return f"{name} has no fingerprints to check it against the input; recomputing"
        return NO_CACHE
    except (OSError, ValueError) as exc:
        return f"{files.marker.name} unreadable ({exc}); recomputing"
    stored_key = meta.get("key") if isinstance(meta.get("key"), dict) else {}
    if key is not None and stored_key != _normal(key):
        changed = sorted(k for k in set(key) | set(stored_key) if _normal(key).get(k) != stored_key.get(k))
        said = [_KEY_WORDS.get(k, k) for k in changed]
        # (not "recomputing": rows of the same texts may still come from another set, and the log says so next)
        return f"{name} was computed with a different {', '.join(said)}; its rows are not reused"
    opened: dict[str, _Npy] = {}
    try:
        try:
            for role, path in _roles(files).items():
                opened[role] = _open_npy(path)
        except (OSError, ValueError) as exc:
            return f"{name} cache unreadable ({exc}); recomputing"
        data, fps = opened["data"].array, opened["fingerprints"].array
        extras = {role[6:]: npy.array for role, npy in opened.items() if role.startswith("extra:")}
        if fps.ndim != 1 or fps.dtype != np.uint64:
            return f"{files.fingerprints.name} is not one uint64 per row; recomputing"
        if data.ndim < 1 or not (data.shape[0] == fps.shape[0] == meta.get("rows")):
            return f"{name} cache files disagree on the row count; recomputing"
        if any(meta.get("extras", {}).get(extra) != int(array.shape[0]) for extra, array in extras.items()):
            return f"{name} cache files disagree on their sizes; recomputing"
        if not expect.matches(data):
            return OtherRows(f"{name} holds {_describe(data)}, expected {expect.describe()}; recomputing")
        legacy = "files" not in meta
        if not legacy:
            problem = _check_manifest(files, meta, opened)
            if problem:
                return problem
        return _Set(files, meta, np.asarray(fps), data, extras, legacy)
    finally:
        for npy in opened.values():
            npy.handle.close()  # the memory maps stay valid


def _check_manifest(files: CacheFiles, meta: dict, opened: dict[str, _Npy]) -> str | None:
    """None when every file is the one the manifest describes; digests only files whose identity changed."""
    recorded = meta.get("files")
    if not isinstance(recorded, dict) or set(recorded) != set(opened):
        return f"{files.marker.name} lists other files than the set has; recomputing"
    if not all(isinstance(entry, dict) for entry in recorded.values()):  # hand-edited or damaged
        return f"{files.marker.name} does not describe its files (an entry that is no object); recomputing"
    changed = [role for role, npy in opened.items()
               if _identity(npy.stat) != {k: recorded[role].get(k) for k in IDENTITY}]
    if not changed:
        return None
    scheme = meta.get("digest")
    if scheme not in DIGESTS:
        return f"{files.marker.name} records its files' digests as {scheme!r}, which this version cannot check; recomputing"
    for role in changed:
        npy = opened[role]
        if _digest_fd(npy.handle.fileno(), npy.stat.st_size, scheme) != _recorded_digest(recorded[role]):
            return (f"{Path(npy.handle.name).name} is not the file {files.marker.name} was written "
                    f"with (changed since: edited in place, written by another run at the same time, or swapped "
                    f"with another set's); recomputing")
    # Same content under a new identity (copied, touched, restored from a backup): remember the
    # new identity so the next run need not read the files again.
    refreshed = dict(meta, files={role: dict(entry, **_identity(opened[role].stat)) if role in changed else entry
                                  for role, entry in recorded.items()})
    try:
        atomic.save_json(files.marker, refreshed)
        log.info("%s changed on disk (copied or touched) but hold the content recorded in %s; manifest updated",
                 ", ".join(Path(opened[role].handle.name).name for role in changed), files.marker.name)
    except OSError as exc:
        log.info("%s: content verified, but the manifest could not be updated (%s)", files.marker.name, exc)
    return None


# ---- lookup --------------------------------------------------------------------------------------


def lookup(target: Path | CacheFiles, key: dict, fingerprints: np.ndarray, accept_any_key: bool = False, *,
           dtype=None, row_shape: tuple | None = None, alternatives: tuple = (), registry: bool = True,
           lazy: bool = False) -> CacheLookup:
    """Reuse cached rows whose text fingerprint matches a current record's.

    ``dtype`` and ``row_shape`` (the shape of one row; () for one number per record, None in it
    for any size) are what the caller can use: a set holding anything else is rejected.
    ``accept_any_key``: reuse rows computed with whatever model the cache names (used when
    the caller has no model to compare against, e.g. token counts without a tokenizer).
    Rows the target lacks come from the valid set with the most of them among ``alternatives``
    and the registered sets of the same key (``registry``; not for caches with extras); a set
    among the target and ``alternatives`` that holds exactly the current records, in order, is
    used as it is (``in_order``).

    ``lazy``: gather nothing in memory. ``data`` is then the stored array itself (memory-mapped) when
    ``in_order``, else None, and the reused rows are copied with ``CacheLookup.copy_into``.
    """
    files = _files(target)
    n = fingerprints.shape[0]
    expect = _Expect(None if dtype is None else np.dtype(dtype), None if row_shape is None else tuple(row_shape))
    want = None if accept_any_key else key
    named = _open_set(files, want, expect)
    reason = named if isinstance(named, str) else None
    named = None if isinstance(named, str) else named
    if named is not None and not named.legacy and np.array_equal(named.fingerprints, fingerprints):
        if registry and not files.extras:
            _ensure_registered(files, named.meta)  # a set stored with the registry off, or before it existed
        return _whole(named, n, f"all {n:,} rows reused from {files.data.name}", lazy)
    if named is not None and want is None:
        want = named.meta.get("key")  # other sets must agree with the one the target holds
    others = []
    for alternative in map(_files, alternatives):
        found = _open_set(alternative, want, expect) if alternative.marker != files.marker else "the target"
        if isinstance(found, str):
            if found not in (NO_CACHE, "the target"):
                log.info("%s: %s", alternative.data, found)
            continue
        if not found.legacy and np.array_equal(found.fingerprints, fingerprints):
            return _whole(found, n, f"all {n:,} rows reused from {alternative.data}", lazy, alternative.data)
        others.append(found)

    source = match_rows(named.fingerprints, fingerprints) if named is not None else np.full(n, -1, np.int64)
    hit = source >= 0
    filler, filled = None, np.zeros(n, dtype=bool)
    if not hit.all() and not files.extras:  # extras index the target's own rows: no mixing sets there
        filler, filler_source = _best_other(others, files, want, expect, fingerprints, hit,
                                            registry and want is not None)
        if filler is not None and named is not None and (filler.data.dtype, filler.data.shape[1:]) != \
                (named.data.dtype, named.data.shape[1:]):
            filler = None  # rows of another kind (only possible when the caller names no dtype or shape)
        if filler is not None and not filler.legacy and np.array_equal(filler.fingerprints, fingerprints):
            linked = _linked(filler, files, want, expect)
            if linked is not None:  # another run's set of exactly these records: shared, no second copy on disk
                # Why the target's own set was not used, where it had one.
                said = f"{reason}; " if reason and reason != NO_CACHE else ""
                return _whole(linked, n, f"{said}all {n:,} rows are those of {filler.files.data}, linked as "
                                         f"{files.data.name}, not copied ({FROM_ANOTHER_RUN})", lazy, filler.files.data)
        if filler is not None:
            filled = ~hit & (filler_source >= 0)
    base = named if named is not None else filler
    if base is None:
        return CacheLookup(None, np.zeros(n, dtype=bool), reason or NO_CACHE)
    sources = [(hit, source, named)] + ([(filled, filler_source, filler)] if filled.any() else [])
    copies = [(np.flatnonzero(mask), rows[mask], found.data) for mask, rows, found in sources if mask.any()]
    data = None if lazy else np.zeros((n,) + base.data.shape[1:], dtype=base.data.dtype)
    for rows, stored, array in ([] if lazy else copies):
        data[rows] = array[stored]
    if reason:
        parts = [reason if files.data.name in reason else f"{files.data.name}: {reason}"]
    else:
        parts = [_reused(hit, source, files.data.name)
                 + (" (stored part-filled by an interrupted run)" if "filled" in named.meta else "")
                 + _left_out(named, fingerprints)]
    if filled.any():
        parts.append(f"{int(filled.sum()):,} row(s) taken from {filler.files.data} ({FROM_ANOTHER_RUN})")
    if named is not None and named.legacy:
        parts.append("older cache format without a manifest: it is rewritten")
    copies = copies if lazy else []
    if named is None:
        return CacheLookup(data, filled, "; ".join(parts), np.full(n, -1, np.int64), key=filler.meta.get("key"),
                           copies=copies, origin=filler.files.data if filled.all() else None)
    return CacheLookup(data, hit | filled, "; ".join(parts), source, named.extras, named.data, named.meta.get("key"),
                       False, files, copies)


def _linked(source: _Set, target: CacheFiles, key: dict, expect: _Expect) -> _Set | None:
    """``target`` made of hard links to ``source``'s files, its manifest written last, and validated; None where
    no link can be made (another filesystem, a folder refusing it) or the files are no longer the ones validated:
    the caller then copies the rows. A set's files are only ever replaced whole (renamed over), never written in
    place, so a shared file stays what both manifests say."""
    recorded = source.meta.get("files")
    if source.extras or target.extras or not isinstance(recorded, dict) or source.meta.get("digest") not in DIGESTS:
        return None
    entries = {}
    try:
        target.marker.unlink(missing_ok=True)  # untrusted until its manifest is back
        for role, path in _roles(target).items():
            with atomic.atomic_link(_roles(source.files)[role], path) as temp, open(temp, "rb") as handle:
                stat = os.fstat(handle.fileno())
                entry = recorded[role]
                if _identity(stat) != {k: entry.get(k) for k in IDENTITY} and \
                        _digest_fd(handle.fileno(), stat.st_size, source.meta["digest"]) != _recorded_digest(entry):
                    raise ValueError(f"{Path(entry.get('name', role)).name} changed since it was checked")
            entries[role] = dict(entry, name=path.name, **_identity(stat))
        manifest = dict(source.meta, files=entries)
        atomic.save_json(target.marker, manifest)
    except (OSError, KeyError, ValueError) as exc:  # the link's temp is removed on the way out
        log.info("%s not linked to %s (%s); its rows are copied instead", target.data, source.files.data, exc)
        return None
    _register(target, manifest)
    linked = _open_set(target, key, expect)
    return linked if isinstance(linked, _Set) else None


def _whole(found: _Set, n: int, reason: str, lazy: bool = False, origin: Path | None = None) -> CacheLookup:
    # Already in order: a sequential copy, much faster than gathering row by row (lazy: no copy at all).
    return CacheLookup(found.data if lazy else np.array(found.data), np.ones(n, dtype=bool), reason,
                       np.arange(n, dtype=np.int64), found.extras, found.data, found.meta.get("key"), True, found.files,
                       origin=origin)


def _best_other(others: list[_Set], files: CacheFiles, key: dict | None, expect: _Expect, fingerprints: np.ndarray,
                hit: np.ndarray, use_registry: bool) -> tuple[_Set | None, np.ndarray | None]:
    """Of ``others`` and the registered sets of ``key``, the valid one holding most of the missing records."""
    missing = fingerprints[~hit]
    device = _device(files.data.parent)

    def rank(stored_fingerprints: np.ndarray, data: Path) -> tuple[int, bool, bool]:
        # Most missing rows first; of equals, a set of exactly these records in order, then one on the target's
        # filesystem: those can be linked rather than copied.
        return (int((match_rows(stored_fingerprints, missing) >= 0).sum()),
                np.array_equal(stored_fingerprints, fingerprints), _device(data.parent) == device)

    ranked: list[tuple[tuple, object]] = [(rank(s.fingerprints, s.files.data), s) for s in others]
    if use_registry and key is not None:
        seen = {files.marker.absolute()} | {s.files.marker.absolute() for s in others}
        for candidate in registered_sets(key):
            if candidate.marker.absolute() in seen:
                continue
            try:  # a first count from the fingerprints alone; the set is validated if it is chosen
                stored = np.load(candidate.fingerprints)
            except (OSError, ValueError):
                continue
            if stored.ndim != 1 or stored.dtype != np.uint64:  # not a fingerprints file (replaced by another array)
                log.info("Registered cache %s skipped: %s is not one uint64 per row", candidate.data,
                         candidate.fingerprints.name)
                continue
            ranked.append((rank(stored, candidate.data), candidate))
    ranked.sort(key=lambda pair: (-pair[0][0], not pair[0][1], not pair[0][2]))  # stable: the latest first
    for (count, _, _), candidate in ranked:
        if count == 0:
            break
        if isinstance(candidate, CacheFiles):
            opened = _open_set(candidate, key, expect)
            if isinstance(opened, str):
                (log.debug if isinstance(opened, OtherRows) else log.info)("Registered cache %s skipped: %s",
                                                                           candidate.data, opened)
                continue
            candidate = opened
        source = match_rows(candidate.fingerprints, fingerprints)
        if (source[~hit] >= 0).any():
            return candidate, source
    return None, None


def _device(folder: Path) -> int | None:
    """The filesystem ``folder`` (or its nearest existing parent) is on."""
    for path in (folder, *folder.parents):
        try:
            return os.stat(path).st_dev
        except OSError:
            continue
    return None


def match_rows(cached_fingerprints: np.ndarray, fingerprints: np.ndarray) -> np.ndarray:
    """For each fingerprint, the index of an equal one among ``cached_fingerprints`` (-1: none)."""
    source = np.full(fingerprints.shape[0], -1, dtype=np.int64)
    if cached_fingerprints.size == 0:
        return source
    order = np.argsort(cached_fingerprints, kind="stable")
    pos = np.searchsorted(cached_fingerprints[order], fingerprints)
    clipped = np.minimum(pos, cached_fingerprints.size - 1)
    hit = (pos < cached_fingerprints.size) & (cached_fingerprints[order[clipped]] == fingerprints)
    source[hit] = order[clipped[hit]]
    return source


def _reused(hit: np.ndarray, source: np.ndarray, name: str) -> str:
    """How many records' rows a stored set gave, said for the log; records sharing a text share its row, so more
    records than the set has rows can be given one (said, or the count reads as wrong)."""
    reused = int(np.count_nonzero(hit))
    repeated = reused - int(arrays.distinct(source[hit]).size)
    return (f"{reused:,} of {hit.size:,} rows reused from {name}"
            + (f" ({repeated:,} of them share a row with another record of the same text)" if repeated else ""))


def _left_out(stored, fingerprints: np.ndarray) -> str:
    """How many of a stored set's rows no current record's text has (records removed or edited), said for the log;
    rows an interrupted run left unfilled are not counted."""
    gone = int(np.count_nonzero(~arrays.member(stored.fingerprints, fingerprints)))
    filled, rows = stored.meta.get("filled"), stored.meta.get("rows")
    if isinstance(filled, int) and isinstance(rows, int):
        gone -= rows - filled
    return f" ({gone} of its rows, of records removed or edited since, left out)" if gone > 0 else ""


def unfilled_fingerprint(fingerprints: np.ndarray) -> int:
    """The fingerprint written for the rows an interrupted run left unfilled: a value none of ``fingerprints``
    has (0 almost always), so those rows match no current record. A later text could hash to it, with the
    odds (2^-64) at which any two texts share a fingerprint, which every reuse of rows already accepts."""
    value = 0
    while bool((fingerprints == np.uint64(value)).any()):
        value += 1
    return value


def with_unfilled(fingerprints: np.ndarray, filled: np.ndarray | None) -> np.ndarray:
    """``fingerprints`` to store for rows of which only ``filled`` (bool per row; None: all) hold data."""
    fingerprints = np.asarray(fingerprints, dtype=np.uint64)
    if filled is None:
        return fingerprints
    return np.where(filled, fingerprints, np.uint64(unfilled_fingerprint(fingerprints)))


def _written_manifest(data_path: Path) -> dict:
    """The manifest written beside ``data_path`` ({} where there is none, or it cannot be read as an object)."""
    try:
        meta = json.loads(files_for(data_path).marker.read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def filled_rows(data_path: Path) -> tuple[int, int] | None:
    """(rows filled, rows) of the set at ``data_path`` when an interrupted run stored it part-filled; else None."""
    meta = _written_manifest(data_path)
    if isinstance(meta.get("filled"), int) and isinstance(meta.get("rows"), int):
        return meta["filled"], meta["rows"]
    return None


def require_filled(data_path: Path, what: str) -> None:
    """A one-line error when the set at ``data_path`` is part-filled (``filled_rows``), or a deep extraction's
    checkpoint: their other rows are zeros."""
    from .deep.checkpoint import unfinished_share

    share = unfinished_share(data_path)
    if share is not None:
        done = f"{share[0]:,} of its {share[1]:,} rows were computed" if share[0] is not None else "its rows are not all computed"
        raise UserError(f"{what}: a checkpoint of an unfinished extract_deep_embeddings.py run ({done}, the others are "
                        "zeros); rerun that command to finish it, then give its --output file")
    part = filled_rows(data_path)
    if part is not None:
        raise UserError(f"{what}: only {part[0]:,} of the {part[1]:,} rows of {Path(data_path).name} were computed "
                        "(a curate run interrupted while embedding kept what it had done; the other rows are zeros); "
                        "rerun the curate_dataset.py command that wrote it (same --input and --output) to complete it")


def written_key(data_path: Path) -> dict | None:
    """The key the set at ``data_path`` was stored under (what its rows were made with), or None where it has no
    readable manifest."""
    key = _written_manifest(data_path).get("key")
    return key if isinstance(key, dict) else None


def written_fingerprints(data_path: Path) -> np.ndarray | None:
    """The fingerprints written beside ``data_path`` (``NAME.fingerprints.npy``: one uint64 per row, the text
    each row was made from), or None where there are none or they cannot be read."""
    path = files_for(data_path).fingerprints
    try:
        fingerprints = np.load(path, mmap_mode="r") if path.is_file() else None
    except (OSError, ValueError):
        return None
    if fingerprints is None or fingerprints.ndim != 1 or fingerprints.dtype != np.uint64:
        return None
    return np.asarray(fingerprints)


@dataclass(frozen=True)
class RowCheck:
    """How rows made for the texts ``rows_fingerprints`` line up with the texts ``fingerprints`` (as many)."""

    misplaced: tuple[int, int] | None  # (i, j): position i's text is at row j; the first such position
    unmatched: int  # positions whose text is at no row (edited records, say)
    comparable: bool  # at least COMPARABLE_SHARE of the texts are among the rows (else other texts: nothing to check)


# Rows made from another text field match almost no text (a few empty or repeated ones at most); a tenth found
# means the same documents, however many others there are (matrices of two overlapping samples met 48% and
# were taken by position, every document with another one's vector).
COMPARABLE_SHARE = 0.1
# Where rows and positions were made from one field, more than this share of texts without a row are other
# documents, not edits (a comparison of two clusterings would then compare different documents).
OTHER_DOCUMENTS_SHARE = 0.5


def check_rows(rows_fingerprints: np.ndarray, fingerprints: np.ndarray) -> RowCheck:
    if np.array_equal(rows_fingerprints, fingerprints):
        return RowCheck(None, 0, True)
    found = match_rows(rows_fingerprints, fingerprints)
    elsewhere = np.flatnonzero((found >= 0) & (rows_fingerprints != fingerprints))
    misplaced = (int(elsewhere[0]), int(found[elsewhere[0]])) if elsewhere.size else None
    return RowCheck(misplaced, int((found < 0).sum()),
                    int((found >= 0).sum()) >= COMPARABLE_SHARE * fingerprints.size)


def require_row_order(rows_path: Path, fingerprints: np.ndarray | None, what: str, row: str, position: str,
                      positions: str, same_texts: bool = False) -> None:
    """The rows of the matrix at ``rows_path`` against the texts ``fingerprints`` (None: unknown, nothing is
    checked), by the fingerprints written beside ``rows_path``: rows
    in another order are a one-line error (every document would get another one's vector), rows made from
    edited texts a warning, other texts altogether (another text field, say) a warning that nothing was
    checked; without fingerprints beside it nothing is checked. ``what``: the flags
    the messages start with; ``row``, ``position``, ``positions``: how they name a row, a position and all.
    A fingerprints file that cannot be these rows' (another length, unreadable) and rows it marks as never
    computed are one-line errors too. ``same_texts``: the rows and the positions were made from the same field,
    so rows of other texts (all of them, or most) are other documents: a one-line error."""
    require_filled(rows_path, what)
    if fingerprints is None:
        return
    written = written_fingerprints(rows_path)
    beside = files_for(rows_path).fingerprints
    if written is None or written.shape != fingerprints.shape:
        if beside.exists():  # stale or damaged: an order it cannot check would pass unchecked and unsaid
            why = f"{written.size:,} entries for {fingerprints.size:,} rows" if written is not None else \
                "not one uint64 per row (unreadable)"
            raise UserError(f"{what}: {beside.name} beside it is not its rows' fingerprints ({why}), so the rows' "
                            "order cannot be checked; write it again with the rows, or delete it to take them "
                            "unchecked")
        return
    unfilled = int(np.count_nonzero(written == np.uint64(unfilled_fingerprint(fingerprints))))
    if unfilled:  # a part-filled set copied without its manifest: its fingerprints still mark the rows never computed
        raise UserError(f"{what}: {unfilled:,} of its rows were never computed (an interrupted curate run's part-filled "
                        f"set, copied without its manifest: {beside.name} marks them); rerun the curate command that "
                        "wrote it (same --input and --output) to complete it")
    check = check_rows(written, fingerprints)
    if same_texts and check.unmatched > OTHER_DOCUMENTS_SHARE * fingerprints.size:
        raise UserError(f"{what}: {check.unmatched:,} of the {fingerprints.size:,} texts of {positions} are not among "
                        f"those {row}s were made from (by the fingerprints written beside each, both of the same "
                        "field): files of other documents; give rows of the same documents in the same order")
    if not check.comparable:
        log.warning("%s: the texts its rows were made from are mostly not those of %s (another text field, or "
                    "other data?); rows are taken by position, unchecked", what, positions)
    elif check.misplaced is not None:
        i, j = check.misplaced
        shared = fingerprints.size - check.unmatched
        held = "" if not check.unmatched else (f"; {shared:,} of the {fingerprints.size:,} are of documents both hold, "
                                               "the others of documents only one holds")
        raise UserError(f"{what}: the rows are not in the order of {positions} ({position} {i} is {row} {j}, "
                        f"by the fingerprints written beside each{held}); give embeddings of the documents in one order")
    elif check.unmatched:
        log.warning("%s: %d of %s differ from the texts the rows were made from (edited since, or other "
                    "documents?); their rows are used as they are", what, check.unmatched, positions)


# ---- store ---------------------------------------------------------------------------------------


def store(target: Path | CacheFiles, key: dict, fingerprints: np.ndarray, data: np.ndarray,
          extras: dict[str, np.ndarray] | None = None, *, required: bool = False,
          filled: np.ndarray | None = None) -> bool:
    """Write the set; the manifest goes last, so a crash mid-way leaves no trusted set. True when written.

    A cache that cannot be written (read-only folder, immutable file, full disk) is a warning
    and False; with ``required`` (the file is the product, not a cache) a one-line error.
    ``filled`` (bool per row): only those rows hold data (an interrupted run's); the others are
    stored under a fingerprint no record has (``unfilled_fingerprint``), so no lookup takes them.
    """
    problem = try_store(target, key, fingerprints, data, extras, filled)
    if problem is None:
        return True
    if required:
        raise UserError(f"cannot write {_files(target).data}: {problem}")
    log.warning("Cache %s not written (%s); the run goes on without it", _files(target).data, problem)
    return False


def try_store(target: Path | CacheFiles, key: dict, fingerprints: np.ndarray, data: np.ndarray,
              extras: dict[str, np.ndarray] | None = None, filled: np.ndarray | None = None) -> str | None:
    """``store`` without the warning: None when written, else why not."""
    files = _files(target)
    extras = extras or {}
    if data.shape[0] != fingerprints.shape[0]:
        raise ValueError(f"{files.data.name}: {data.shape[0]} rows but {fingerprints.shape[0]} fingerprints")
    try:
        files.marker.unlink(missing_ok=True)  # the set is being rewritten: untrusted until its manifest is back
        written = {f"extra:{name}": _write_npy(files.extras[name], array) for name, array in extras.items()}
        written["data"] = _write_npy(files.data, data)
        written["fingerprints"] = _write_npy(files.fingerprints, with_unfilled(fingerprints, filled))
        manifest = {"version": MANIFEST_VERSION, "key": _normal(key), "rows": int(data.shape[0]),
                    "dtype": str(data.dtype), "shape": list(data.shape), "digest": DIGEST_NAME, "files": written,
                    **_filled_entry(filled)}
        if extras:
            manifest["extras"] = {name: int(array.shape[0]) for name, array in extras.items()}
        atomic.save_json(files.marker, manifest)
    except OSError as exc:
        return _os_problem(exc)
    if not files.extras:
        _register(files, manifest)
    return None


def _filled_entry(filled: np.ndarray | None) -> dict:
    """The manifest's record of a part-filled set (``filled_rows`` reads it)."""
    return {} if filled is None else {"filled": int(np.count_nonzero(filled))}


class Fill:
    """A set whose data file is written in place, row by row, instead of from an array in memory.

    The data goes to a temp file beside the target (``.NAME.HOST.PID.RANDOM.tmp``, as every atomic
    write): a sparse ``.npy`` of ``shape`` and ``dtype`` whose rows the caller assigns through
    ``rows`` (``fill.rows[indices] = values``). ``commit`` digests it, renames it into place, then
    writes the fingerprints and the manifest last, as ``store`` does; a run killed before that leaves
    the previous set, still trusted, and a temp file the next run sweeps. ``abandon`` removes the temp.

    A cache that cannot be written is a warning, as with ``store``: the rows then go to an unnamed
    temp file (or stay in the renamed-away temp), read by this run through ``/proc/self/fd``.
    """

    def __init__(self, target: Path | CacheFiles, shape: tuple[int, int], dtype, hold_rows: np.ndarray | None = None):
        """``hold_rows``: rows to keep in memory as written (``matrix.HeldRows``), answered from
        there by the first ``matrix.read_rows`` of exactly them on the committed file."""
        self.files = _files(target)
        self.problem: str | None = None
        try:
            self._context = atomic.atomic_open(self.files.data, "w+b")
            self._handle = self._context.__enter__()
        except OSError as exc:
            self._context, self.problem = None, _os_problem(exc)
            self._handle = _unnamed_temp(self.files.data.parent)
        # A second descriptor keeps the rows readable should the rename fail (the temp is then removed).
        self._kept = os.dup(self._handle.fileno())
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        try:
            writer = matrix.create_npy(self._handle, shape, dtype, name=self.files.data)
        except BaseException:
            self.abandon()
            raise
        writer.append_directly()  # a first run writes its rows in order: they bypass the page cache
        held = None if hold_rows is None else matrix.HeldRows(hold_rows, shape[1], dtype)
        self.rows = _DigestingRows(writer, self._handle, held)

    def commit(self, key: dict, fingerprints: np.ndarray, filled: np.ndarray | None = None) -> matrix.MatrixFile:
        """Store the set (see the class doc); the rows to read from now on. ``filled``: only those rows
        were assigned (a run interrupted part-way keeps them; see ``store``)."""
        self.rows.writer.finish()
        if self._context is not None:
            try:
                return self._store(key, with_unfilled(fingerprints, filled), _filled_entry(filled))
            except OSError as exc:
                self.problem = _os_problem(exc)
        log.warning("Cache %s not written (%s); the run goes on without it", self.files.data, self.problem)
        return matrix.MatrixFile.open(f"/proc/self/fd/{self._kept}").holding(self.rows.held)

    def _store(self, key: dict, fingerprints: np.ndarray, filled_entry: dict) -> matrix.MatrixFile:
        fd = self._handle.fileno()
        self._handle.flush()
        os.fsync(fd)
        stat = os.fstat(fd)
        digest = self.rows.digest(stat.st_size) or _digest_fd(fd, stat.st_size)
        entry = {"name": self.files.data.name, **_identity(stat), "digest": digest}
        self.files.marker.unlink(missing_ok=True)  # the set is being replaced: untrusted until its manifest is back
        context, self._context = self._context, None
        # fsync, close and rename into place; when that fails the temp is removed, and our descriptor still reads it.
        context.__exit__(None, None, None)
        written = {"data": entry, "fingerprints": _write_npy(self.files.fingerprints, fingerprints)}
        manifest = {"version": MANIFEST_VERSION, "key": _normal(key), "rows": self.shape[0], "dtype": str(self.dtype),
                    "shape": list(self.shape), "digest": DIGEST_NAME, "files": written, **filled_entry}
        atomic.save_json(self.files.marker, manifest)
        _register(self.files, manifest)
        os.close(self._kept)
        self._kept = -1
        return matrix.MatrixFile.open(self.files.data).holding(self.rows.held)

    def abandon(self) -> None:
        """Remove the temp file (on an error before ``commit``)."""
        if getattr(self, "rows", None) is not None:
            self.rows.writer.finish(write=False)
        context, self._context = self._context, None
        if context is not None:
            try:
                raise _Abandoned
            except _Abandoned:
                context.__exit__(*sys.exc_info())
        self._handle.close()
        if self._kept >= 0:
            os.close(self._kept)
            self._kept = -1


class _DigestingRows:
    """``Fill.rows``: a ``matrix.RowWriter`` that digests the file's bytes as they are written, while
    rows come in file order (a first embedding run writes them so), so that ``commit`` need not read
    a file of many GB back; rows written in any other order leave the digest to ``commit``."""

    def __init__(self, writer: matrix.RowWriter, handle, held: matrix.HeldRows | None = None):
        self.writer, self.shape, self.held = writer, writer.shape, held
        self._row_bytes = writer.shape[1] * writer.dtype.itemsize
        self._next_row: int | None = 0
        self._chunks: list[bytes] = []
        self._current, self._filled, self._size = DIGESTS[DIGEST_NAME](), 0, 0
        self._feed(os.pread(handle.fileno(), writer.offset, 0))  # the .npy header

    def __setitem__(self, rows, values) -> None:
        data = self.writer.write(rows, values)
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        if self.held is not None:
            self.held.capture(rows, data)
        if self._next_row is None or rows.size == 0:
            return
        if int(rows[0]) != self._next_row or (rows.size > 1 and not bool((np.diff(rows) == 1).all())):
            self._next_row = None  # out of order: commit digests the file instead
            return
        self._feed(memoryview(data.reshape(-1).view(np.uint8)))
        self._next_row += rows.size

    def _feed(self, data) -> None:
        data = memoryview(data).cast("B")
        while data:
            take = min(DIGEST_CHUNK - self._filled, len(data))
            self._current.update(data[:take])
            self._filled, self._size, data = self._filled + take, self._size + take, data[take:]
            if self._filled == DIGEST_CHUNK:
                self._chunks.append(self._current.digest())
                self._current, self._filled = DIGESTS[DIGEST_NAME](), 0

    def digest(self, size: int) -> str | None:
        """The file's digest if every byte of its ``size`` was digested on the way in, or all but rows
        never written after those (zeros: a run interrupted part-way; hashed without reading them); else None."""
        if self._next_row is None or self._size + (self.shape[0] - self._next_row) * self._row_bytes != size:
            return None
        left = size - self._size
        if left:
            self._feed(bytes(min(left, DIGEST_CHUNK - self._filled)))
            left = size - self._size
            zeros = DIGESTS[DIGEST_NAME](bytes(DIGEST_CHUNK)).digest() if left >= DIGEST_CHUNK else b""
            self._chunks += [zeros] * (left // DIGEST_CHUNK)
            self._size += left // DIGEST_CHUNK * DIGEST_CHUNK
            self._feed(bytes(size - self._size))
        last = [self._current.digest()] if self._filled or not self._chunks else []
        return _combine(self._chunks + last, size)


class _Abandoned(Exception):
    pass


def _os_problem(exc: OSError) -> str:
    return f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}"


def _unnamed_temp(folder: Path):
    try:
        return tempfile.TemporaryFile(dir=folder)
    except OSError:
        return tempfile.TemporaryFile()


# ---- registry ------------------------------------------------------------------------------------


def registry_dir() -> Path | None:
    """Where the registry lives (read at each call, so tests and users can point it elsewhere); None: off."""
    value = os.environ.get("DIVERSITY_ORDER_CACHE_DIR")
    if value is not None:
        return Path(value).expanduser() if value.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "diversity-order"


_registry_warned = False


def _registry_problem(path: Path, exc: OSError) -> None:
    global _registry_warned
    if not _registry_warned:  # once per process: the runs work the same without it
        _registry_warned = True
        log.warning("Cache registry %s not usable (%s): caches are found by their names only "
                    "(set DIVERSITY_ORDER_CACHE_DIR to another folder, or to '' to turn it off)", path,
                    exc.strerror or exc)


def _register(files: CacheFiles, manifest: dict) -> None:
    folder = registry_dir()
    if folder is None:
        return
    path = folder / REGISTRY_FILE
    entry = {"data": str(files.data.absolute()), "fingerprints": str(files.fingerprints.absolute()),
             "marker": str(files.marker.absolute()), "key": manifest["key"], "dtype": manifest["dtype"],
             "shape": manifest["shape"]}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # One O_APPEND write per entry: concurrent runs never interleave their lines.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        _registry_problem(path, exc)


def _ensure_registered(files: CacheFiles, manifest: dict) -> None:
    """Register the set of ``files`` unless the registry lists it already under its key."""
    if registry_dir() is None or not isinstance(manifest.get("key"), dict):
        return
    marker = files.marker.absolute()
    if all(candidate.marker != marker for candidate in registered_sets(manifest["key"])):
        _register(files, manifest)


def registered_sets(key: dict) -> list[CacheFiles]:
    """The sets registered with ``key`` whose manifest still exists, most recently stored first."""
    folder = registry_dir()
    if folder is None:
        return []
    path = folder / REGISTRY_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        _registry_problem(path, exc if isinstance(exc, OSError) else OSError(str(exc)))
        return []
    entries: dict[str, dict] = {}
    for line in lines:
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or \
                    not all(isinstance(entry.get(name), str) for name in ("marker", "data", "fingerprints")):
                continue  # a damaged line (a null path ended every later run in a traceback)
            entries.pop(entry["marker"], None)  # re-inserted: the latest entry of a set counts, in store order
            entries[entry["marker"]] = entry
        except (ValueError, KeyError, TypeError):
            continue
    alive = {marker: entry for marker, entry in entries.items() if Path(marker).exists()}
    if len(lines) > REGISTRY_COMPACT_LINES and len(lines) > 2 * len(alive):
        _compact(path, alive)
    want = _normal(key)
    return [CacheFiles(Path(e["data"]), Path(e["fingerprints"]), Path(e["marker"]))
            for e in reversed(alive.values()) if e.get("key") == want]


def _compact(path: Path, alive: dict[str, dict]) -> None:
    """Rewrite the registry with one line per existing set (a line appended meanwhile may be lost: it is only a hint)."""
    try:
        with atomic.atomic_open(path, "w") as handle:
            handle.writelines(json.dumps(entry, sort_keys=True) + "\n" for entry in alive.values())
    except OSError as exc:
        _registry_problem(path, exc)


# ---- sets written by several processes (torchrun) ------------------------------------------------


@dataclass
class RowSource:
    """Where the current records' rows lie in valid sets, without reading any row."""

    n: int  # current records
    sets: list[tuple[CacheFiles, np.ndarray]]  # (set, int64 per current record: its row there, -1: none)
    reason: str
    in_order: bool = False  # the first set holds exactly the current records, in order

    @property
    def hit(self) -> np.ndarray:
        """bool per current record: a set holds its row."""
        found = np.zeros(self.n, dtype=bool)
        for _, source in self.sets:
            found |= source >= 0
        return found

    @property
    def missing_rows(self) -> np.ndarray:
        """The records no set holds."""
        return np.flatnonzero(~self.hit)


def find_rows(target: Path | CacheFiles, key: dict, fingerprints: np.ndarray, *, dtype, row_shape: tuple,
              registry: bool = True) -> RowSource:
    """``lookup`` reading only fingerprints: for processes that each copy their own part of the rows
    (no process holds them all). Rows the target lacks come from the registered set of ``key``
    holding most of them, as in ``lookup``; each record's row is taken from the first set that has it."""
    files = _files(target)
    n = fingerprints.shape[0]
    expect = _Expect(np.dtype(dtype), tuple(row_shape))
    found = _open_set(files, key, expect)
    if not isinstance(found, str) and not found.legacy and np.array_equal(found.fingerprints, fingerprints):
        return RowSource(n, [(files, np.arange(n, dtype=np.int64))], f"all {n:,} rows reused from {files.data.name}", True)
    sets, parts = [], []
    hit = np.zeros(n, dtype=bool)
    if isinstance(found, str):
        parts.append(found)
    else:
        source = match_rows(found.fingerprints, fingerprints)
        hit = source >= 0
        sets.append((files, source))
        parts.append(_reused(hit, source, files.data.name) + _left_out(found, fingerprints))
    if not hit.all():
        filler, filler_source = _best_other([], files, key, expect, fingerprints, hit, registry)
        if filler is not None:
            filler_source = np.where(hit, -1, filler_source)
            sets.append((filler.files, filler_source))
            parts.append(f"{int((filler_source >= 0).sum()):,} row(s) taken from {filler.files.data} "
                         f"({FROM_ANOTHER_RUN})")
    return RowSource(n, sets, "; ".join(parts))


def chunk_count(size: int) -> int:
    """How many digest chunks a file of ``size`` bytes has (its digest combines one per chunk)."""
    return max(1, -(-size // DIGEST_CHUNK))


def chunk_digests(path: Path, indices) -> list[bytes]:
    """The digests of chunks ``indices`` of ``path``: processes that each digest some chunks of one
    file, to be combined with ``combine_chunk_digests`` (the file's digest as a manifest records it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        with ThreadPoolExecutor(_workers()) as pool:
            return list(pool.map(lambda i: _chunk_digest(fd, size, i * DIGEST_CHUNK), indices))
    finally:
        os.close(fd)


def combine_chunk_digests(digests: list[bytes], size: int) -> str:
    return _combine(list(digests), size)


def adopt(target: Path | CacheFiles, key: dict, fingerprints: np.ndarray, written: Path,
          digest: str | None = None, filled: np.ndarray | None = None) -> None:
    """Make ``written`` (a complete, fsynced ``.npy`` beside the target, e.g. filled by several
    processes) the target's data: renamed into place, then fingerprints and manifest written and
    the set registered, as ``store`` does. ``digest``: the file's, when already computed (by chunks,
    by several processes). ``filled``: only those rows were written (see ``store``). Raises OSError
    when a file cannot be written."""
    files = _files(target)
    files.marker.unlink(missing_ok=True)  # untrusted until the manifest is back
    npy = _open_npy(Path(written))
    try:
        digest = digest or _digest_fd(npy.handle.fileno(), npy.stat.st_size)
        stat, shape, dtype = npy.stat, npy.array.shape, npy.array.dtype
    finally:
        npy.handle.close()
    del npy
    if shape[0] != fingerprints.shape[0]:
        raise ValueError(f"{files.data.name}: {shape[0]} rows but {fingerprints.shape[0]} fingerprints")
    os.replace(written, files.data)
    data_entry = {"name": files.data.name, **_identity(stat), "digest": digest}  # rename keeps inode and mtime
    prints = _write_npy(files.fingerprints, with_unfilled(np.asarray(fingerprints, dtype=np.uint64), filled))
    manifest = {"version": MANIFEST_VERSION, "key": _normal(key), "rows": int(shape[0]), "dtype": str(dtype),
                "shape": list(shape), "digest": DIGEST_NAME, "files": {"data": data_entry, "fingerprints": prints},
                **_filled_entry(filled)}
    atomic.save_json(files.marker, manifest)
    _register(files, manifest)
