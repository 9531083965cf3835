"""``extract(config)``: the stages of deep extraction, in order.

    start -> index and key -> reuse the output's rows -> adopt the checkpoints' rows -> tokens -> model
          -> share and checkpoint -> batch loop -> gather and write

Each stage is a function below; a ``_Job`` carries their state.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import arrays, caches, distributed
from ..atomic import save_json
from ..fields import cache_key
from ..runtime import start
from ..sources import open_source
from .batches import BatchLoop, Embedder, batch_size_for, initial_budget, progress_for
from .checkpoint import Adopted, Partial, adopt, keep_adopted, remove_leftovers, remove_resumed, rows_digest, skipped_path
from .config import DeepConfig, DeepResult, check_config, check_output_writable
from .layout import Layout, TensorParallelGroup
from .model import ForwardFn, config_max_positions, load_model, model_fingerprint, torch_dtype
from .tokens import Tokens, prepare_tokens

log = logging.getLogger("diversity_order.deep")


@dataclass
class _Job:
    config: DeepConfig
    ctx: distributed.DistContext
    device: object
    layout: Layout
    forward: ForwardFn | None
    started: float = field(default_factory=time.perf_counter)
    result: DeepResult | None = None
    index: object = None  # the input's source (see sources.py)
    n: int = 0
    fingerprints: np.ndarray | None = None
    tokenizer: object = None
    dtype: object = None
    max_len: int | None = None
    output_key: dict = field(default_factory=dict)
    found: caches.CacheLookup | None = None
    reused: np.ndarray | None = None
    needed: np.ndarray | None = None
    tokens: Tokens | None = None
    model: object = None
    dim: int = 0
    adopted: Adopted | None = None  # rows an interrupted run checkpointed (main rank)

    @property
    def data_ctx(self) -> distributed.DistContext:
        # Under --tp the ranks of a group share one model and process their documents together; the
        # data-parallel context (shares, per-rank files, gathering) counts groups, not ranks (the
        # trivial one for a single group), and the group's first rank reads and writes its files.
        return self.layout.data_ctx(self.ctx)

    @property
    def progress(self) -> bool:
        return self.config.progress and self.ctx.is_main


def extract(config: DeepConfig, forward: ForwardFn | None = None) -> DeepResult:
    """Compute the deep embeddings of ``config.input`` into ``config.output``."""
    config.output = Path(config.output)
    config.model_dir = Path(config.model_dir)
    check_config(config)
    # Said first: importing torch and loading the tokenizer take tens of seconds on a busy node.
    log.info("Deep embeddings of %s with %s -> %s: starting", config.input, config.model_dir, config.output)
    device, ctx = start(config.device, config.gpu)
    import torch

    device = torch.device(device)
    try:
        layout = Layout.of(ctx, config.tp, device)
        if ctx.active and config.tp > 1 and not layout.leader:
            # Tensor-parallel ranks do the same work as their group's first rank: only its log lines are worth reading.
            logging.getLogger("diversity_order").setLevel(logging.WARNING)
        job = _Job(config, ctx, device, layout, forward)
        job.result = DeepResult(output=config.output)
        _log_layout(job)
        index_and_key(job)
        if reuse_output(job):
            return job.result
        check_output_writable(config.output)
        adopt_checkpoints(job)
        if job.needed.size == 0:  # the checkpoints held every row left: no model to load
            write_output(job, [], [], [])
            _remove_other_launches_checkpoints(job)
            _report(job)
            return job.result
        load_tokens(job)
        job.model = load_model(config.model_dir, job.dtype, device, config.tp > 1, config.attn_implementation,
                               layout.mesh, job.progress)
        job.dim = int(job.model.config.hidden_size)
        partial, todo, position = share_and_checkpoint(job)
        embed_share(job, partial, todo, position)
        gather_and_write(job, partial)
        return job.result
    finally:
        distributed.shutdown(ctx)


def _log_layout(job: _Job) -> None:
    ctx, layout = job.ctx, job.layout
    if ctx.is_main and job.config.tp > 1 and layout.dp > 1:
        log.info("%d processes: %d data-parallel groups x tensor parallel %i", ctx.world_size, layout.dp, layout.tp)
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
        if per_node % layout.tp:
            log.warning("--nproc_per_node=%i is not a multiple of --tp %i: some tensor-parallel groups span two nodes",
                        per_node, layout.tp)


def index_and_key(job: _Job) -> None:
    """Index the input, load the tokenizer, and key the output to everything that decides a row."""
    from ..tokenizer import DocumentTokenizer, say_chat_template

    config = job.config
    job.index = open_source(config.input, config.text_field, progress=job.progress, ctx=job.ctx)
    job.n = len(job.index) if config.limit is None else min(config.limit, len(job.index))
    job.fingerprints = job.index.fingerprints[: job.n]
    job.tokenizer = DocumentTokenizer(config.model_dir)
    kinds = getattr(job.index, "kinds", None)
    if kinds is not None and kinds.conversations:
        say_chat_template(config.text_field, Path(config.model_dir))
    job.dtype = torch_dtype(config.dtype, job.device)
    max_seq_len = config.max_seq_len or config_max_positions(config.model_dir)
    limits = [v for v in (config.max_tokens, max_seq_len) if v]
    job.max_len = min(limits) if limits else None
    job.output_key = {
        "version": 1,
        "model": model_fingerprint(config.model_dir),
        "tokenizer": job.tokenizer.fingerprint,
        "dtype": str(job.dtype),
        "max_len": job.max_len,
        "text_field": cache_key(config.text_field),
    }


def reuse_output(job: _Job) -> bool:
    """Rows of an existing OUTPUT whose text is unchanged are reused wherever they moved; only new or
    edited records (and earlier NaN rows) are computed. True when nothing is left to compute."""
    config, ctx, n = job.config, job.ctx, job.n
    # No registry: the model in the key is a cheap fingerprint (config, file names and sizes), which two
    # checkpoints of one architecture share, so another output's rows could be another model's.
    job.found = found = caches.lookup(config.output, job.output_key, job.fingerprints, dtype=np.float32,
                                      row_shape=(_hidden_size(config.model_dir),), registry=False)
    reused = found.hit.copy()
    if found.data is not None:
        reused &= np.isfinite(found.data.reshape(n, -1)).all(axis=1)
    job.reused, job.needed = reused, np.flatnonzero(~reused)
    if ctx.is_main and config.output.exists():
        if reused.any():
            log.info("%s: %d of %d rows reused, %d to compute", config.output.name, int(reused.sum()), n,
                     job.needed.size)
        else:
            log.warning("%s", found.reason)
    if job.needed.size or found.data is None:
        return False
    if found.in_order:
        log.info("%s already holds all %d rows: nothing to do (delete it to recompute)", config.output, n)
        job.result.nothing_to_do = True
    elif ctx.is_main:
        check_output_writable(config.output)
        caches.store(config.output, job.output_key, job.fingerprints, found.data, required=True)
        log.info("%s: all %d rows reused, rewritten in the new input order", config.output, n)
    if ctx.is_main:
        remove_leftovers(config.output)
    distributed.barrier(ctx)
    job.result.seconds = time.perf_counter() - job.started
    return True


def _work_key(job: _Job) -> dict:
    """What a checkpoint of this work is keyed to, beside its share (``share_and_checkpoint`` adds that)."""
    return job.output_key | {
        "records": job.n,
        "data": hashlib.blake2b(job.fingerprints.tobytes(), digest_size=16).hexdigest(),
    }


def adopt_checkpoints(job: _Job) -> None:
    """The rows an interrupted run of this work checkpointed, under any launch (one process, any number of
    ranks or tensor-parallel groups: each splits the rows its own way), are taken as done: rank 0 keeps them in
    OUTPUT.resumed.npz until the output is written, and no rank computes them again."""

    def on_main() -> np.ndarray | None:
        adopted = adopt(job.config.output, _work_key(job), _hidden_size(job.config.model_dir))
        if adopted is None:
            return None
        keep_adopted(job.config.output, _work_key(job), adopted)
        wanted = arrays.member(adopted.rows, job.needed)
        job.adopted = Adopted(adopted.rows[wanted], adopted.data[wanted], adopted.sources)
        names = [path.name for path in adopted.sources]
        log.info("Resuming: %d of %d rows to compute were finished by an interrupted run (%s%s), taken as they are",
                 int(wanted.sum()), job.needed.size, names[0],
                 f" and {len(names) - 1} more" if len(names) > 1 else "")
        return job.adopted.rows

    rows = distributed.from_main(job.ctx, on_main, "taking up an interrupted run's checkpoints")
    if rows is not None and rows.size:
        job.needed = job.needed[~arrays.member(job.needed, rows)]


def load_tokens(job: _Job) -> None:
    """Tokens from (or added to) the cache beside the output; rank 0 writes it before the others read it."""
    config, ctx = job.config, job.ctx
    token_key = {"version": 1, "tokenizer": job.tokenizer.fingerprint, "text_field": cache_key(config.text_field),
                 "max_len": job.max_len}
    if ctx.active and not ctx.is_main:
        distributed.barrier(ctx)
    job.tokens = prepare_tokens(config.output, token_key, job.index, job.fingerprints, job.needed, job.tokenizer,
                                job.max_len, job.progress, writer=ctx.is_main)
    if ctx.active and ctx.is_main:
        distributed.barrier(ctx)
    lengths, needed = job.tokens.lengths, job.needed
    truncated = int((job.tokens.full_lengths[needed] > lengths[needed]).sum())
    if truncated and ctx.is_main:
        log.info("%d document(s) truncated to %d tokens", truncated, job.max_len)


def share_and_checkpoint(job: _Job) -> tuple[Partial, np.ndarray, dict]:
    """This rank's (group's) share of the documents by length, its checkpoint, and what is left to do."""
    config, lengths, needed = job.config, job.tokens.lengths, job.needed
    # Processing order: by length (stable, so ties keep input order); shares are contiguous.
    order = needed[np.argsort(lengths[needed], kind="stable")]
    if config.reverse:
        order = order[::-1].copy()
    share = distributed.my_share(job.data_ctx, order, lengths[order])
    rows = np.sort(share)
    key = _work_key(job) | {"rows": rows_digest(rows), "dim": job.dim}
    partial = Partial(config.output, job.data_ctx, rows, job.dim, key, writer=job.layout.leader)
    partial.done = _tp_group(job).broadcast(partial.done)  # --tp: the group leader's checkpoint decides for all
    partial.start()
    position = {int(r): i for i, r in enumerate(rows.tolist())}
    todo = np.asarray([r for r in share.tolist() if not partial.done[position[r]]], dtype=np.int64)
    for row in todo[lengths[todo] == 0].tolist():
        log.warning("record %i (%s) has no tokens: its vector is all zeros", row, job.index.where(row))
        partial.data[position[row]] = 0.0
        partial.done[position[row]] = True
    return partial, todo[lengths[todo] > 0], position


def _tp_group(job: _Job) -> TensorParallelGroup:
    ctx = job.ctx if job.config.tp > 1 else distributed.DistContext()
    return TensorParallelGroup(ctx, job.device, job.layout.group("tp"))


def embed_share(job: _Job, partial: Partial, todo: np.ndarray, position: dict) -> None:
    config, ctx, layout, lengths = job.config, job.ctx, job.layout, job.tokens.lengths
    tp_group = _tp_group(job)
    budget = tp_group.min(initial_budget(config, job.model, job.device, job.dtype))
    batch_size = batch_size_for(config, job.device)
    embedder = Embedder(job.model, job.device, batch_size, budget, job.forward)
    who = f"Rank {ctx.rank}" if layout.mesh is None else \
        f"Data-parallel group {layout.dp_rank} (ranks {ctx.rank}-{ctx.rank + layout.tp - 1})"
    log.info("%s: %d document(s) to embed (%d tokens) on %s in %s; token budget %d per batch, at most %d documents",
             who, todo.size, int(lengths[todo].sum()), job.device, job.dtype, budget, batch_size)
    loop = BatchLoop(embedder, job.tokens, partial, position, tp_group, config.checkpoint_docs,
                     config.checkpoint_seconds)
    started = time.perf_counter()
    with progress_for(int(todo.size), int(lengths[todo].sum()), job.device, job.progress, silent=not ctx.is_main) as bar:
        loop.run(todo, job.result, bar)
    job.result.batch_seconds = time.perf_counter() - started
    job.result.batch_tokens = job.result.tokens  # this rank's, before the ranks' counts are summed


def gather_and_write(job: _Job, partial: Partial) -> None:
    """Rank 0 gathers every group's rows, writes OUTPUT with its sidecars and the skipped list."""
    ctx, result = job.ctx, job.result
    comm_device = job.device if job.device.type == "cuda" else None

    def gather(array: np.ndarray):
        # Each group's first rank sends (the others hold the same rows, without the resumed ones),
        # over the process group of the groups' first ranks, where rank 0 receives.
        if not job.layout.leader:
            return None
        return distributed.gather_to_main(job.data_ctx, array, comm_device, job.layout.group("dp"))

    parts, datas = gather(partial.rows), gather(partial.data)
    skipped_all = gather(np.asarray(result.skipped, dtype=np.int64).reshape(-1, 2))
    write_output(job, parts, datas, skipped_all)
    partial.remove()
    _remove_other_launches_checkpoints(job)
    if job.data_ctx.active:
        totals = gather(np.asarray([[result.docs, result.tokens]], dtype=np.int64))
        if ctx.is_main:
            result.docs, result.tokens = (int(v) for v in np.concatenate(totals).sum(axis=0))
    _report(job)


def write_output(job: _Job, parts, datas, skipped_all) -> None:
    """Rank 0 writes OUTPUT (the reused rows, those the checkpoints held and those computed now) with its
    sidecars and the skipped list; then the adopted rows' file goes."""
    config, ctx, result = job.config, job.ctx, job.result
    if ctx.is_main:
        adopted = job.adopted
        dim = job.dim or (adopted.data.shape[1] if adopted is not None else 0) or job.found.data.shape[1]
        embeddings = np.full((job.n, dim), np.nan, dtype=np.float32)
        if job.found.data is not None and job.found.data.shape[1:] == (dim,):
            embeddings[job.reused] = job.found.data[job.reused]
        if adopted is not None:
            embeddings[adopted.rows] = adopted.data
        for part_rows, part_data in zip(parts, datas):
            embeddings[part_rows] = part_data
        job.dim = dim
        # The output with its fingerprint sidecars (OUTPUT.fingerprints.npy, OUTPUT.cache.json).
        caches.store(config.output, job.output_key, job.fingerprints, embeddings, required=True)
        result.skipped = sorted(tuple(int(v) for v in pair) for block in skipped_all for pair in block)
        _write_skipped(config.output, result.skipped)
    distributed.barrier(ctx)
    if ctx.is_main:
        remove_resumed(config.output)


def _remove_other_launches_checkpoints(job: _Job) -> None:
    """Once the output is written (and each rank's own checkpoint removed), any checkpoint left beside it is
    another launch's that held no rows to take up (killed before its first checkpoint, or written before rows
    files were kept): of no use now, and its reserved rows file may be gigabytes."""
    distributed.barrier(job.ctx)
    if job.ctx.is_main:
        remove_leftovers(job.config.output, "Removed the checkpoints another launch left beside")


def _report(job: _Job) -> None:
    config, ctx, result = job.config, job.ctx, job.result
    result.seconds = time.perf_counter() - job.started
    if ctx.is_main:
        batches = ""
        if result.batch_seconds > 0:
            own = f"rank 0's share, {result.batch_seconds:.1f} s" if job.data_ctx.active else f"{result.batch_seconds:.1f} s"
            batches = f"; the batches alone: {own}, {result.batch_tokens / result.batch_seconds:,.0f} tokens/s"
        log.info("Deep embeddings: %d docs, %d tokens in %.1f s (%s tokens/s from the start%s), %d skipped -> %s "
                 "(%d x %d)", result.docs, result.tokens, result.seconds,
                 f"{result.tokens / max(result.seconds, 1e-9):,.0f}", batches, len(result.skipped), config.output,
                 job.n, job.dim)


def _write_skipped(output: Path, skipped: list) -> None:
    """``OUTPUT.skipped.json`` lists the documents that fit in no batch (NaN rows); removed when there are none."""
    sidecar = skipped_path(output)
    if skipped:
        save_json(sidecar, {"skipped": [{"index": r, "tokens": t} for r, t in skipped],
                            "reason": "out of memory even as a single document; the row is NaN"})
        log.warning("%d document(s) skipped for memory (NaN rows), listed in %s: %s", len(skipped),
                    sidecar.name, ", ".join(f"{r} ({t} tokens)" for r, t in skipped[:20]))
    else:
        with contextlib.suppress(FileNotFoundError):
            sidecar.unlink()


def _hidden_size(model_dir: Path) -> int | None:
    """The width of the output's rows from config.json (None: not stated, any width is accepted; the
    model fingerprint in the key pins it anyway)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for part in (config, config.get("text_config")) if isinstance(config, dict) else ():
        value = part.get("hidden_size") if isinstance(part, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None
