"""What a torchrun run stopped part-way (Ctrl-C; SIGTERM, a scheduler's preemption) had embedded or counted, kept
for the next run.

The ranks fill one shared file (``scale_out``), or count the tokens of their shares (``--load-embeddings``). A rank
being stopped cannot count on the others to agree on what was done, so each says only what it did, in a file of
its own, and the next run (any number of ranks, or one process) puts the pieces together before it looks the
records up. Beside the embedding cache ``B_embeddings.npy`` (for counting only, beside ``A_token_counts.npy`` in
the output folder: the same names with that stem):

- ``B_embeddings.kept.json`` and ``B_embeddings.kept.fingerprints.npy``, written by rank 0 when the work starts:
  the keys, the rows, the ranks, and the fingerprint of each row's record;
- ``B_embeddings.kept.rank{r}.npz``, written by rank r when it is stopped: the rows it wrote (the cached rows it
  copied and the ones it embedded) and the token counts of those it embedded or counted;
- ``B_embeddings.kept.npy``: the shared file itself, renamed by rank 0 when it is stopped (ranks still writing
  reach it through their open descriptors; a later run's sweep of dead runs' temp files no longer sees it).

``recover`` makes them the embedding cache, the rows no rank said it wrote marked unfilled (as a single process's
interrupted run stores them), and adds the counts to the token-count cache. It takes nothing unless every rank's
file is there, every rank had copied all its cached rows (the cache it replaces would lose them otherwise) and
the keys are this run's; what it cannot take it removes, saying why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import atomic, caches, distributed, embed, interrupts

log = logging.getLogger(__name__)

VERSION = 1


def kept_paths(target: Path) -> dict[str, Path]:
    """The files beside the embedding cache ``target`` (see the module doc); ``rank`` is a pattern for ``rank_path``."""
    stem = Path(target).with_suffix("")
    return {"manifest": Path(f"{stem}.kept.json"), "fingerprints": Path(f"{stem}.kept.fingerprints.npy"),
            "data": Path(f"{stem}.kept.npy"), "rank": Path(f"{stem}.kept.rank{{}}.npz")}


def rank_path(target: Path, rank: int) -> Path:
    return Path(str(kept_paths(target)["rank"]).format(rank))


def counts_target(paths: dict) -> Path:
    """Where the kept files of ranks that only count tokens are named after: the token-count cache's name in the
    output folder (the input's folder may not be writable; the output folder is shared by every rank)."""
    return Path(paths["embeddings"]).parent / Path(paths["token_counts"]).name


def start(target: Path, shared: Path | None, key: dict | None, count_key: dict, fingerprints: np.ndarray,
          ranks: int, copies: bool = False) -> None:
    """Rank 0, before the ranks fill the ``shared`` file (embeddings of ``key``; ``copies``: cached rows are copied
    in too) or only count tokens (``shared`` None): what a later run needs to take their work."""
    paths = kept_paths(target)
    discard(target)
    atomic.save_npy(paths["fingerprints"], np.asarray(fingerprints, dtype=np.uint64))
    atomic.save_json(paths["manifest"], {"version": VERSION, "key": key, "count_key": count_key,
                                         "rows": int(len(fingerprints)), "ranks": int(ranks), "copies": bool(copies),
                                         "shared_file": None if shared is None else Path(shared).name})


def started(ctx: distributed.DistContext, target: Path, shared: Path | None, key: dict | None, count_key: dict,
            fingerprints: np.ndarray, copies: bool = False) -> None:
    """Every rank: rank 0 ``start``s (its arguments matter there only), and no rank goes on before it has: a rank
    quick with its part says what it did before rank 0 would have cleared the last run's files, its own too."""
    if ctx.is_main:
        start(target, shared, key, count_key, fingerprints, ctx.world_size, copies)
    distributed.barrier(ctx)


@dataclass
class RankWork:
    """What one rank has done so far: rows written into the shared file, or counted."""

    copied: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # cached rows copied in
    copied_all: bool = False  # every cached row of this rank's share is copied
    computed: embed.Finished = field(default_factory=embed.Finished)  # rows embedded or counted, and their counts


@contextlib.contextmanager
def keeping(rank: int, target: Path, shared: Path | None, work: RankWork):
    """While open, SIGTERM raises (as Ctrl-C does), and whatever stops this rank (a signal, or a collective
    failing because a peer was stopped) has it say what it did (``keep``) before it goes on up. A rank whose
    part is done says so (``say``) before the collective that ends the work: it may be stopped later, outside."""
    try:
        with interrupts.sigterm_raises():
            yield work
    except BaseException as stop:
        keep(rank, target, shared, work, stop)
        raise


def say(rank: int, target: Path, work: RankWork) -> bool:
    """This rank's file: the rows it wrote or counted (see the module doc). False (said in the log) when it cannot
    be written: the run goes on, only a stop after this would lose the work."""
    try:
        with atomic.atomic_open(rank_path(target, rank), "wb") as handle:
            np.savez(handle, copied=work.copied, computed=work.computed.rows, counts=work.computed.counts,
                     copied_all=np.array(work.copied_all))
        return True
    except OSError as exc:
        log.warning("Rank %i: what it did cannot be kept for a rerun should the run be stopped (%s)", rank,
                    exc.strerror or exc)
        return False


def keep(rank: int, target: Path, shared: Path | None, work: RankWork, stop: BaseException) -> None:
    """A rank being stopped says what it did (rank 0 also moves the shared file out of the sweep's way). Quick,
    and deaf to the signals meanwhile: torchrun forwards a Ctrl-C or SIGTERM to the ranks a second time."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(ValueError):  # not the main thread: the signals cannot be changed
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)
            stack.callback(lambda: [signal.signal(sig, handler) for sig, handler in previous.items()])
        stack.enter_context(interrupts.finishing("keeping the work done so far"))
        paths = kept_paths(target)
        if not say(rank, target, work) or rank != 0:  # rank 0 is the one that logs
            return
        if shared is not None and Path(shared).exists():
            try:
                os.replace(shared, paths["data"])
            except OSError as exc:
                log.warning("%s: the rows embedded so far could not be kept (%s)", _stop_name(stop),
                            exc.strerror or exc)
                return
        if shared is not None:
            log.warning("%s: the rows the ranks embedded so far are kept in %s (rank 0's %d; each rank says its own "
                        "beside it); a rerun embeds only the others", _stop_name(stop), paths["data"],
                        work.copied.size + work.computed.rows.size)
        else:
            log.warning("%s: the token counts the ranks finished so far are kept beside %s (rank 0's %d); a rerun "
                        "counts only the others", _stop_name(stop), paths["manifest"], work.computed.rows.size)


def _stop_name(stop: BaseException) -> str:
    if isinstance(stop, interrupts.Terminated):
        return "Terminated (SIGTERM)"
    return "Interrupted" if isinstance(stop, KeyboardInterrupt) else f"Stopped ({type(stop).__name__})"


def counted_by_ranks(ctx: distributed.DistContext, target: Path, count_key: dict, fingerprints: np.ndarray,
                     rows: np.ndarray, count) -> np.ndarray | None:
    """Under torchrun, ranks that only count tokens: each counts its own ``rows`` (ascending) with
    ``count(rows, finished)`` (``finished``: the ``embed.Finished`` to fill as it goes); rank 0 gets every rank's
    counts in rank order, the others None. Stopped part-way, every rank keeps what it counted, named after
    ``target``, for the next run (``recover``)."""
    started(ctx, target, None, None, count_key, fingerprints)
    with keeping(ctx.rank, target, None, RankWork(copied_all=True)) as work:
        counts = count(rows, work.computed)
        work.computed = embed.Finished(rows, counts)
        say(ctx.rank, target, work)  # before the collective: a rank done waits there when a stop comes
        gathered = distributed.gather_to_main(ctx, counts, distributed.comm_device())
    if not ctx.is_main:
        return None
    discard(target)
    return np.concatenate(gathered)


def discard(target: Path) -> None:
    """Remove what an interrupted run kept beside ``target`` (the manifest first: the rest is then no set)."""
    paths = kept_paths(target)
    stem = Path(target).with_suffix("")
    ranks = sorted(stem.parent.glob(f"{atomic.glob_escape(stem.name)}.kept.rank*.npz"))
    for path in (paths["manifest"], paths["fingerprints"], paths["data"], *ranks):
        with contextlib.suppress(OSError):
            path.unlink()


def recover(target: Path, key: dict | None, count_places: list[Path], count_key: dict, embeds: bool = True) -> None:
    """Before a run looks its records up: what an interrupted torchrun run kept beside ``target`` (embeddings of
    ``key``; ``key`` None: token counts only, see ``counts_target``) becomes the embedding cache and joins the
    token-count cache, else is removed with the reason said. The counts are taken wherever their key is this run's
    (embeddings of another model, the same tokenizer). ``embeds`` False (a run that embeds nothing,
    ``--load-embeddings``): only the counts are taken, and kept rows are left for a run that embeds."""
    paths = kept_paths(target)
    if not paths["manifest"].exists():
        return
    leave = False
    try:
        manifest = json.loads(paths["manifest"].read_text())
        what = "embedded" if manifest.get("shared_file") else "counted"
        why, found = _read(target, manifest, count_key)
        if why is not None:
            log.warning("The rows an interrupted torchrun run %s are not reused (%s); removed", what, why)
            return
        fingerprints, data, filled, computed, counts, missing = found
        _add_counts(count_places, count_key, fingerprints, computed, counts)
        unsaid = f" (rank(s) {', '.join(map(str, missing))} said nothing: their rows are done again)" if missing else ""
        if data is None:
            log.info("Token counts: %d of %d rows kept by an interrupted torchrun run are now in %s%s",
                     computed.size, filled.size, count_places[0].name, unsaid)
            return
        if not embeds:
            leave = True
            log.info("Token counts: %d of %d rows kept by an interrupted torchrun run are now in %s; the embeddings "
                     "it kept (%s) are left for a run that embeds", computed.size, filled.size, count_places[0].name,
                     paths["data"].name)
            return
        differs = _differs(manifest["key"], key)
        if differs:
            log.warning("The rows an interrupted torchrun run embedded are not reused (computed with another %s); "
                        "removed; their %d token counts are", differs, computed.size)
            return
        damaged = _not_embeddings(data, filled)
        if damaged.size:
            filled[damaged] = False
            log.warning("The rows an interrupted torchrun run embedded: %d of them are not unit vectors, as every "
                        "embedding is (damaged on disk since?; the first: row %i); embedded again", damaged.size,
                        int(damaged[0]))
        caches.adopt(target, key, fingerprints, data, filled=None if filled.all() else filled)
        log.info("Embeddings: %d of %d rows kept by an interrupted torchrun run are now %s, their token counts in "
                 "%s%s", int(filled.sum()), filled.size, target.name, count_places[0].name, unsaid)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        log.warning("The rows an interrupted torchrun run kept are not reused (%s); removed",
                    getattr(exc, "strerror", None) or exc)
    finally:
        if not leave:
            discard(target)


# A kept row is an embedding, a unit vector (or zeros: a document of no tokens), to within the rounding of the
# cache's dtype (bfloat16 keeps 8 bits); a row further off was damaged since it was written.
UNIT_TOLERANCE = 0.02


def _not_embeddings(data: Path, filled: np.ndarray, block: int = 65536) -> np.ndarray:
    """The rows of ``data`` marked ``filled`` that are not what an embedding is (non-finite, or neither of unit
    length nor zeros), ascending: a byte flipped on disk in a kept file that no digest covers."""
    rows = np.load(data, mmap_mode="r")
    wanted = np.flatnonzero(filled)
    bad = []
    for at in range(0, wanted.size, block):
        part = wanted[at:at + block]
        norms = np.linalg.norm(np.asarray(rows[part], dtype=np.float32), axis=1)
        bad.append(part[~np.isfinite(norms) | ((np.abs(norms - 1) > UNIT_TOLERANCE) & (norms != 0))])
    return np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)


_KEY_WORDS = {"table": "embedding table", "tensor": "embedding tensor", "text_field": "text field"}


def _differs(kept: dict | None, key: dict | None) -> str:
    """What differs between the kept rows' key and this run's, in words ("" when nothing does)."""
    kept, key = json.loads(json.dumps(kept)) or {}, json.loads(json.dumps(key)) or {}
    names = [name for name in {**kept, **key} if kept.get(name) != key.get(name)]
    return ", ".join(_KEY_WORDS.get(name, name) for name in names)


def _read(target: Path, manifest: dict, count_key: dict):
    """(why not, None) or (None, (fingerprints, data file or None, filled rows, computed rows, their counts, ranks
    that said nothing))."""
    paths = kept_paths(target)
    if manifest.get("version") != VERSION:
        return "written by another version", None
    differs = _differs(manifest["count_key"], count_key)
    if differs:
        return f"counted with another {differs}", None
    data = None
    if manifest["shared_file"] is not None:
        data = paths["data"] if paths["data"].exists() else target.parent / manifest["shared_file"]
        if not data.exists():
            return "its rows file is gone", None
    n, parts, missing = int(manifest["rows"]), [], []
    for rank in range(int(manifest["ranks"])):
        try:
            with np.load(rank_path(target, rank)) as part:
                parts.append({name: part[name] for name in part.files})
        except OSError:
            missing.append(rank)
        except (ValueError, KeyError, EOFError, zipfile.BadZipFile):  # (cut short, or not numpy's at all)
            return f"rank {rank}'s file {rank_path(target, rank).name} is damaged", None
    # A rank that said nothing may have had cached rows to copy in: the cache the kept rows replace would lose them.
    if missing and (manifest["copies"] or not parts):
        return f"rank {missing[0]} was stopped before it said what it had written", None
    if not all(bool(part["copied_all"]) for part in parts):
        return "a rank was stopped while copying the cached rows in", None
    fingerprints = np.load(paths["fingerprints"])
    written = np.concatenate([np.concatenate([part["copied"], part["computed"]]) for part in parts]).astype(np.int64)
    if fingerprints.shape != (n,) or (written.size and (written.min() < 0 or written.max() >= n)):
        return "its files do not agree", None
    filled = np.zeros(n, dtype=bool)
    filled[written] = True
    computed = np.concatenate([part["computed"] for part in parts]).astype(np.int64)
    counts = np.concatenate([part["counts"] for part in parts]).astype(np.int64)
    return None, (fingerprints, data, filled, computed, counts, missing)


def _add_counts(count_places: list[Path], count_key: dict, fingerprints: np.ndarray, rows: np.ndarray,
                counts: np.ndarray) -> None:
    """The token counts of the rows computed, added to those the cache already holds for the same records."""
    from .features import store_token_counts

    if rows.size == 0:
        return
    found = caches.lookup(count_places[0], count_key, fingerprints, dtype=np.int64, row_shape=(),
                          alternatives=tuple(count_places[1:]))
    known = found.data.astype(np.int64) if found.data is not None else np.zeros(fingerprints.size, np.int64)
    filled = found.hit.copy()
    known[rows] = counts
    filled[rows] = True
    store_token_counts(count_places, count_key, fingerprints, known, None if filled.all() else filled)
