"""Benchmark: does the order matter to training? A small causal LM trained from scratch on each order.

    .venv/bin/python benchmarks/bench_training.py                          # demo corpus (stdlib)
    .venv/bin/python benchmarks/bench_training.py --site-packages-corpus   # stronger topical drift
    .venv/bin/python benchmarks/bench_training.py --quick                  # smoke test, seconds

For each order (``--orders``, default: input order, a random shuffle, ``stratified``, ``balanced``)
the same model (same seeded initialisation, AdamW, learning-rate schedule) is trained for two
epochs over the same documents, packed the way pretraining loaders pack: documents concatenated in
the order's sequence with an EOS after each, cut every ``--seq-len`` tokens, ``--batch`` consecutive
windows per step, no shuffling; epoch 2 starts again at the first window. Per step it records the
training loss and the gradient norm (before clipping), every ``--eval-every`` steps the loss on
held-out documents, and reports per order what happens at the epoch boundary (the mean of the first
``--boundary-k`` steps after it against the last ``--boundary-k`` before it), the step-to-step
spread of the loss within each epoch and the final held-out loss. Writes a JSON file and one figure.

The cluster labels the orderings need come from the real pipeline: curate_dataset.py runs once
on the input as a subprocess (``--stats-only --no-plot``) and its ``*_labels.npy`` is cached in
``--work``; or pass ``--labels``.

Sizes (each order ~180 CPU seconds on one thread, so four orders train in ~6 minutes on an idle
2-core CPU with the default two jobs; see BENCHMARKS.md, "Training effect"):
- the training documents are ``--train-tokens`` tokens of the input taken as ``--blocks`` contiguous
  runs of records spread evenly over the file, so the subset keeps both the input's head-to-tail
  drift and its local topical runs; held-out documents are a seeded random sample of the rest;
- the vocabulary is compacted to the token ids that occur in those documents (plus EOS): the
  same ids, renumbered, so no token is merged or dropped, while the output softmax, which dominates
  the compute at 49K ids, shrinks to the few thousand ids actually used.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The one import of the ordering registry.
from diversity_order.orderings import CLUSTER_ORDERINGS, ORDERINGS, SPECS, OrderingOptions  # noqa: E402

# The four: the input order, a shuffle, the original toolkit's greedy, and the best-scoring
# ordering of the quality comparison that main's registry offers (balanced).
DEFAULT_ORDERS = ["original", "random", "stratified", "balanced"]


# --------------------------------------------------------------------------------------------- data

def read_texts(path: Path, text_field: str) -> list[str]:
    """Each record's text, in input order; blank lines skipped, as curate_dataset.py skips them."""
    opener = gzip.open if path.suffix == ".gz" else open
    texts = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                texts.append(json.loads(line)[text_field])
    return texts


def tokenize(texts: list[str], model_dir: Path) -> tuple[list[np.ndarray], int]:
    """Each text's token ids (no special tokens, as the pipeline counts them) and the tokenizer's EOS id."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "longer than the model's maximum": we never feed these to SmolLM2
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if tokenizer.eos_token_id is None:
        raise SystemExit(f"{model_dir}: the tokenizer has no EOS token to separate documents with")
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [np.asarray(doc, dtype=np.int64) for doc in ids], int(tokenizer.eos_token_id)


def output_stem(path: Path) -> str:
    name = path.name
    for suffix in (".jsonl.gz", ".jsonl", ".json", ".ndjson"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def pipeline_labels(input_path: Path, model_dir: Path, work: Path, n_clusters: int, seed: int) -> np.ndarray:
    """Cluster labels from the real pipeline (curate_dataset.py --stats-only), cached in ``work``.

    The input is linked into ``work`` so that the pipeline's caches (token counts beside the input,
    embeddings beside the output) land there and not beside the user's file.
    """
    work.mkdir(parents=True, exist_ok=True)
    stem = output_stem(input_path)
    linked = work / input_path.name
    if linked.resolve() != input_path.resolve():
        if linked.is_symlink() or linked.exists():
            linked.unlink()
        linked.symlink_to(input_path.resolve())
    output = work / f"{stem}_k{n_clusters}_seed{seed}_curated.jsonl"
    labels_path = work / f"{stem}_k{n_clusters}_seed{seed}_curated_labels.npy"
    if labels_path.exists() and labels_path.stat().st_mtime >= input_path.stat().st_mtime:
        print(f"cluster labels: cached {labels_path}", file=sys.stderr)
        return np.load(labels_path)
    command = [sys.executable, str(ROOT / "curate_dataset.py"), "--input", str(linked), "--output", str(output),
               "--model-dir", str(model_dir), "--n-clusters", str(n_clusters), "--seed", str(seed),
               "--stats-only", "--no-plot", "--no-progress"]
    print("cluster labels: " + " ".join(command), file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"curate_dataset.py failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    print(f"cluster labels: pipeline took {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return np.load(labels_path)


def select_documents(token_counts: np.ndarray, train_tokens: int, heldout_tokens: int, n_blocks: int,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training records, held-out records), each ascending in input order.

    First ``n_blocks`` runs of consecutive records, each about ``(train_tokens + heldout_tokens) /
    n_blocks`` tokens, starting at evenly spaced token positions of the file: so the subset drifts
    from head to tail as the whole file does and keeps its local topical runs. Then a seeded random
    sample of those records, ``heldout_tokens`` in all, is held out: the held-out documents come from
    the topics trained on, in proportion, so their loss shows how well the model fits the whole
    training mix at each moment (not how it does on topics it never saw).
    """
    n = token_counts.size
    wanted = train_tokens + heldout_tokens
    if token_counts.sum() <= wanted:
        chosen = np.arange(n)
    else:
        ends = np.cumsum(token_counts)
        per_block = wanted / n_blocks
        runs = []
        for block in range(n_blocks):
            first = int(np.searchsorted(ends, block * ends[-1] / n_blocks, side="right"))
            last = int(np.searchsorted(ends, ends[first] - token_counts[first] + per_block, side="left"))
            runs.append(np.arange(first, min(last, n - 1) + 1))
        chosen = np.unique(np.concatenate(runs))
    shuffled = np.random.default_rng(seed).permutation(chosen)
    reached = int(np.searchsorted(np.cumsum(token_counts[shuffled]), heldout_tokens)) + 1
    heldout = np.sort(shuffled[: min(reached, chosen.size // 2)])
    return np.setdiff1d(chosen, heldout), heldout


def pack(documents: list[np.ndarray], doc_labels: np.ndarray, order: np.ndarray, eos: int,
         seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows as a pretraining loader cuts them: (n_windows x seq_len ids, the same shape of cluster labels).

    Documents in ``order``, each followed by EOS, concatenated and cut every ``seq_len`` tokens;
    the last partial window is dropped. The labels say which document's cluster each token belongs to.
    """
    stream = np.concatenate([np.append(documents[i], eos) for i in order])
    labels = np.repeat(doc_labels[order], [documents[i].size + 1 for i in order])
    n_windows = stream.size // seq_len
    return (stream[: n_windows * seq_len].reshape(n_windows, seq_len),
            labels[: n_windows * seq_len].reshape(n_windows, seq_len))


def compact_vocabulary(token_arrays: list[np.ndarray]) -> np.ndarray:
    """The sorted token ids that occur; ``np.searchsorted(vocab, ids)`` renumbers them 0..V-1."""
    return np.unique(np.concatenate(token_arrays))


# ---------------------------------------------------------------------------- the drift corpus

def build_site_packages_corpus(path: Path, site_packages: Path | None = None, lines_per_record: int = 80,
                               min_package_chars: int = 40_000, max_package_chars: int = 80_000) -> Path:
    """A corpus with strong topical drift: the installed packages' Python sources, grouped by package.

    Packages in alphabetical order; inside each, its .py files in path order, cut into records of
    ``lines_per_record`` lines; each package contributes at most ``max_package_chars`` characters
    (so the big ones, torch and transformers, do not fill the file) and packages with less than
    ``min_package_chars`` are left out (too short to form a run). Deterministic for one installation.
    """
    site_packages = Path(site_packages or sysconfig.get_paths()["purelib"])
    records = []
    for package in sorted((p for p in site_packages.iterdir() if p.is_dir() and p.name.isidentifier()),
                          key=lambda p: p.name.lower()):
        package_records, chars = [], 0
        for source in sorted(package.rglob("*.py")):
            try:
                lines = source.read_text(encoding="utf-8").splitlines()
            except (UnicodeDecodeError, OSError):
                continue
            for start in range(0, len(lines), lines_per_record):
                text = "\n".join(lines[start:start + lines_per_record]).strip("\n")
                if not text.strip() or chars >= max_package_chars:
                    continue
                package_records.append({"text": text, "package": package.name,
                                        "path": str(source.relative_to(site_packages)), "line": start + 1})
                chars += len(text)
        if chars >= min_package_chars:
            records.extend(package_records)
    content = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode("utf-8")
    # Rewritten only when it changed, so the cached cluster labels (keyed on its mtime) stay valid.
    if not path.exists() or path.read_bytes() != content:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return path


# ------------------------------------------------------------------------------------ training

def build_model(vocab_size: int, args: argparse.Namespace):
    """A small Llama, tied embeddings, initialised from ``args.run_seed``: identical for every order."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=args.width, intermediate_size=4 * args.width,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=args.seq_len,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(args.run_seed)
    return LlamaForCausalLM(config)


def effective_rank(matrix) -> float:
    """exp(entropy of the normalised singular values) (Roy & Vetterli, 2007): 1 for rank one, min(m, n) at most."""
    import torch

    singular = torch.linalg.svdvals(matrix.float())
    shares = singular / singular.sum()
    shares = shares[shares > 0]
    return float(torch.exp(-(shares * shares.log()).sum()))


def mean_loss(model, windows, batch: int) -> float:
    import torch
    import torch.nn.functional as F

    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, windows.shape[0], batch):
            chunk = windows[start:start + batch]
            logits = model(input_ids=chunk).logits
            total += F.cross_entropy(logits[:, :-1].flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
    model.train()
    return total / (windows.shape[0] * (windows.shape[1] - 1))


def train_one_order(windows: np.ndarray, heldout: np.ndarray, vocab_size: int, args: argparse.Namespace,
                    label: str) -> dict:
    """Two (``--epochs``) passes over ``windows`` in file order; per-step loss, gradient norm; held-out loss."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)  # in a worker process too
    model = build_model(vocab_size, args)
    init_checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norms: no weight decay, as usual
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    train_ids = torch.from_numpy(windows)
    heldout_ids = torch.from_numpy(heldout)
    steps_per_epoch = windows.shape[0] // args.batch
    total_steps = steps_per_epoch * args.epochs
    eval_steps = sorted(set(range(0, total_steps + 1, args.eval_every)) | {steps_per_epoch, total_steps})
    losses, grad_norms, lrs, ranks, heldout_curve = [], [], [], [], []
    layer_matrices = [w for w in model.model.layers.parameters() if w.dim() == 2]
    started, cpu_started = time.perf_counter(), time.process_time()
    for step in range(total_steps):
        if step in eval_steps:
            heldout_curve.append([step, mean_loss(model, heldout_ids, args.batch)])
        # The loader wraps: step s of every epoch reads the same windows.
        first = (step % steps_per_epoch) * args.batch
        batch = train_ids[first:first + args.batch]
        # Linear warmup, then constant: a decaying rate would shrink epoch 2's steps and blur the boundary.
        lr = args.lr * min(1.0, (step + 1) / args.warmup_steps) if args.warmup_steps else args.lr
        for group in optimizer.param_groups:
            group["lr"] = lr
        logits = model(input_ids=batch).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        # How many directions a step's gradient spans (reported higher for diverse orders): the mean
        # effective rank of the transformer layers' weight-matrix gradients; clipping scales, so before or after is alike.
        ranks.append(round(float(np.mean([effective_rank(w.grad) for w in layer_matrices])), 3))
        # The norm before clipping is the one that shows what the data does to the gradient.
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip if args.clip > 0 else math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 5))
        grad_norms.append(round(norm.item(), 5))
        lrs.append(lr)
        if (step + 1) % max(1, total_steps // 8) == 0:
            elapsed = time.perf_counter() - started
            print(f"  {label}: step {step + 1}/{total_steps} loss {loss.item():.3f} grad norm {norm.item():.3f} "
                  f"({elapsed:.0f} s, {elapsed / (step + 1):.2f} s/step)", file=sys.stderr, flush=True)
    heldout_curve.append([total_steps, mean_loss(model, heldout_ids, args.batch)])
    return {"loss": losses, "grad_norm": grad_norms, "grad_effective_rank": ranks, "lr": lrs, "heldout": heldout_curve,
            "steps_per_epoch": steps_per_epoch, "init_checksum": init_checksum,
            "wall_s": round(time.perf_counter() - started, 1),
            # CPU seconds are less disturbed than wall time when other work shares the machine.
            "cpu_s": round(time.process_time() - cpu_started, 1)}


class _InProcess:
    """The one-job stand-in for a process pool: runs each submitted call at once."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, function, *args):
        from concurrent.futures import Future

        future = Future()
        future.set_result(function(*args))
        return future


def trainers(jobs: int):
    """Where the orders train: ``jobs`` spawned processes (fresh interpreters: no forked torch threads)."""
    if jobs <= 1:
        return _InProcess()
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))


# ------------------------------------------------------------------------------------ statistics

def boundary_stats(losses: np.ndarray, grad_norms: np.ndarray, steps_per_epoch: int, k: int) -> dict:
    """Epoch-1 -> epoch-2 boundary: mean of the first k steps after it against the last k before it."""
    before, after = slice(steps_per_epoch - k, steps_per_epoch), slice(steps_per_epoch, steps_per_epoch + k)
    return {"loss_before": float(losses[before].mean()), "loss_after": float(losses[after].mean()),
            "loss_jump": float(losses[after].mean() - losses[before].mean()),
            "grad_norm_before": float(grad_norms[before].mean()), "grad_norm_after": float(grad_norms[after].mean()),
            "grad_norm_ratio": float(grad_norms[after].mean() / grad_norms[before].mean())}


def jumps_everywhere(losses: np.ndarray, grad_norms: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The boundary statistics at every step t with k steps on either side: (loss jump, grad-norm ratio) per t.

    Entry ``t - k`` compares steps t..t+k-1 with t-k..t-1, as ``boundary_stats`` does at t = steps_per_epoch.
    """
    def window_means(values):
        sums = np.cumsum(np.insert(values, 0, 0.0))
        means = (sums[k:] - sums[:-k]) / k  # means[i] = mean of values[i:i+k]
        return means[:-k], means[k:]  # (the k before t, the k from t) for t = k .. n-k

    loss_before, loss_after = window_means(np.asarray(losses, dtype=float))
    norm_before, norm_after = window_means(np.asarray(grad_norms, dtype=float))
    return loss_after - loss_before, norm_after / norm_before


def boundary_rank(losses: np.ndarray, grad_norms: np.ndarray, steps_per_epoch: int, k: int,
                  skip: int = 0) -> dict:
    """How unusual the boundary is within its own run: the share of other steps whose statistic is smaller.

    The same k-after vs k-before comparison at every other step from ``skip`` on (leaving out the
    steps within k of the boundary, which share its windows): 0.5 is a boundary like any other
    moment of the run, 1.0 the largest jump (or grad-norm rise) in the run.
    """
    jumps, ratios = jumps_everywhere(losses, grad_norms, k)
    steps = np.arange(k, k + jumps.size)
    others = (steps >= max(skip, k)) & (np.abs(steps - steps_per_epoch) >= k)
    at = steps_per_epoch - k
    return {"loss_jump_rank": float(np.mean(jumps[others] < jumps[at])),
            "grad_norm_ratio_rank": float(np.mean(ratios[others] < ratios[at]))}


def loss_spread(losses: np.ndarray, half_window: int, skip: int = 0) -> float:
    """Standard deviation of the per-step loss around its centred moving average of 2h+1 steps.

    The moving average takes out the learning curve's slow decline, so what is left is how much
    the loss swings from one step to the next with what the steps hold. ``skip`` leaves out the
    first steps, where the loss falls too fast for any moving average to follow.
    """
    width = 2 * half_window + 1
    segment = losses[skip:]
    if segment.size < width + 1:
        return float("nan")
    trend = np.convolve(segment, np.ones(width) / width, mode="valid")
    return float(np.std(segment[half_window:-half_window] - trend))


def heldout_wobble(heldout: list, from_step: int) -> float:
    """Standard deviation of the held-out losses from ``from_step`` on around their least-squares line.

    How far one evaluation strays from the run's own trend: a within-run yardstick for the final
    held-out loss, which is one such evaluation (differences between orders much smaller than a
    few of these are not differences).
    """
    points = np.asarray([(step, loss) for step, loss in heldout if step >= from_step], dtype=float)
    if points.shape[0] < 4:
        return float("nan")
    slope, intercept = np.polyfit(points[:, 0], points[:, 1], 1)
    residuals = points[:, 1] - (slope * points[:, 0] + intercept)
    return float(np.sqrt((residuals ** 2).sum() / (points.shape[0] - 2)))


def summarise(runs: dict, k: int, half_window: int) -> list[dict]:
    rows = []
    for name, run in runs.items():
        losses, norms = np.asarray(run["loss"]), np.asarray(run["grad_norm"])
        per_epoch = run["steps_per_epoch"]
        heldout = dict((int(step), loss) for step, loss in run["heldout"])
        row = {"order": name, **boundary_stats(losses, norms, per_epoch, k),
               **boundary_rank(losses, norms, per_epoch, k, skip=per_epoch // 4),
               # Epoch 1's first quarter is the initial fall from ln(V); its swings are not the data's.
               "loss_spread_epoch1": loss_spread(losses[:per_epoch], half_window, skip=per_epoch // 4),
               "loss_spread_epoch2": loss_spread(losses[per_epoch:2 * per_epoch], half_window),
               "heldout_end_epoch1": heldout[per_epoch], "heldout_final": heldout[max(heldout)],
               "heldout_wobble": heldout_wobble(run["heldout"], per_epoch),
               "grad_effective_rank": float(np.mean(run["grad_effective_rank"])),
               "clusters_per_step": run["clusters_per_step_mean"]}
        rows.append(row)
    return rows


def markdown_table(rows: list[dict], k: int) -> str:
    lines = [f"| order | loss jump (first {k} after - last {k} before) | its rank in the run "
             "| grad-norm ratio (after / before) | its rank in the run | loss spread epoch 1 | epoch 2 "
             "| held-out loss end of epoch 1 | final held-out loss ± epoch 2 wobble | gradient effective rank "
             "| clusters per step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['order']} | {r['loss_jump']:+.3f} ({r['loss_before']:.3f} -> {r['loss_after']:.3f}) "
                     f"| {r['loss_jump_rank']:.2f} "
                     f"| {r['grad_norm_ratio']:.2f} ({r['grad_norm_before']:.3f} -> {r['grad_norm_after']:.3f}) "
                     f"| {r['grad_norm_ratio_rank']:.2f} | {r['loss_spread_epoch1']:.3f} | {r['loss_spread_epoch2']:.3f} "
                     f"| {r['heldout_end_epoch1']:.3f} | {r['heldout_final']:.3f} ± {r['heldout_wobble']:.3f} "
                     f"| {r['grad_effective_rank']:.1f} "
                     f"| {r['clusters_per_step']:.1f} |")
    return "\n".join(lines)


# What the run-seed table reports: (table key, column heading, format).
SEED_COLUMNS = (("loss_jump", "loss jump", "+.3f"), ("loss_jump_rank", "its rank in the run", ".2f"),
                ("grad_norm_ratio", "grad-norm ratio", ".2f"), ("grad_norm_ratio_rank", "its rank in the run", ".2f"),
                ("loss_spread_epoch1", "loss spread epoch 1", ".3f"), ("loss_spread_epoch2", "epoch 2", ".3f"),
                ("heldout_final", "final held-out loss", ".3f"), ("heldout_wobble", "its epoch 2 wobble", ".3f"),
                ("grad_effective_rank", "gradient effective rank", ".1f"))


def across_run_seeds(results: list[dict]) -> list[dict]:
    """Per order and statistic, the mean, the standard deviation and the values over runs with other --run-seed.

    The runs must share the corpus and every setting but the run seed: then what differs between
    them is the model's initialisation and the orderings' random choices, i.e. run-to-run noise.
    """
    def fixed(result):
        # --jobs only says where the orders trained; each order's run is the same in any process.
        # The input is compared by file name: one run may have recorded it absolute, another relative.
        corpus = {**result["corpus"], "input": Path(result["corpus"]["input"]).name}
        return corpus, {key: value for key, value in result["settings"].items() if key not in ("run_seed", "jobs")}

    if any(fixed(result) != fixed(results[0]) for result in results[1:]):
        raise SystemExit("--seed-table: the results differ in more than --run-seed (corpus or settings)")
    seeds = [result["settings"]["run_seed"] for result in results]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seed-table: run seeds repeat: {seeds}")
    tables = [{row["order"]: row for row in result["table"]} for result in results]
    rows = []
    for order in tables[0]:
        row = {"order": order, "run_seeds": seeds}
        for key, _, _ in SEED_COLUMNS:
            values = np.array([table[order][key] for table in tables], dtype=float)
            row[key] = {"mean": float(values.mean()), "sd": float(values.std(ddof=1)) if values.size > 1 else 0.0,
                        "values": values.tolist()}
        rows.append(row)
    return rows


def seed_markdown_table(rows: list[dict]) -> str:
    """Mean +- standard deviation over the run seeds."""
    lines = ["| order | " + " | ".join(heading for _, heading, _ in SEED_COLUMNS) + " |",
             "|---|" + "---:|" * len(SEED_COLUMNS)]
    for row in rows:
        cells = [f"{row[key]['mean']:{fmt}} ± {row[key]['sd']:{fmt.lstrip('+')}}" for key, _, fmt in SEED_COLUMNS]
        lines.append(f"| {row['order']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ figure

def moving_average(values: np.ndarray, width: int) -> np.ndarray:
    """Trailing mean over up to ``width`` steps, restarted at nothing: the same length as ``values``."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    index = np.arange(1, values.size + 1)
    return (sums[index] - sums[np.maximum(index - width, 0)]) / np.minimum(index, width)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, rows, k = results["runs"], results["table"], results["settings"]["boundary_k"]
    per_epoch = next(iter(runs.values()))["steps_per_epoch"]
    smooth = max(3, per_epoch // 32)
    fig = plt.figure(figsize=(12, 11.5))
    grid = fig.add_gridspec(4, 1, height_ratios=[3.2, 2.6, 2.0, 1.45], hspace=0.45)
    ax_loss, ax_norm, ax_heldout = (fig.add_subplot(grid[i]) for i in range(3))
    for name, run in runs.items():
        colour = SPECS[name].color
        steps = np.arange(1, len(run["loss"]) + 1)
        for ax, values in ((ax_loss, np.asarray(run["loss"])), (ax_norm, np.asarray(run["grad_norm"]))):
            ax.plot(steps, values, color=colour, alpha=0.22, lw=0.7)
            ax.plot(steps, moving_average(values, smooth), color=colour, ls=SPECS[name].line, lw=1.8, label=name)
        heldout = np.asarray(run["heldout"])
        ax_heldout.plot(heldout[:, 0], heldout[:, 1], "o-", color=colour, ms=3.5, lw=1.5, label=name)
    # The first evaluations sit near ln(V); the y range shows the part where the orders differ.
    later = np.concatenate([np.asarray(r["heldout"])[:, 1][np.asarray(r["heldout"])[:, 0] >= per_epoch // 2]
                            for r in runs.values()])
    margin = 0.1 * (later.max() - later.min()) + 0.02
    ax_heldout.set_ylim(later.min() - margin, later.max() + margin)
    all_losses = np.concatenate([np.asarray(r["loss"])[per_epoch // 4:] for r in runs.values()])
    ax_loss.set_ylim(np.percentile(all_losses, 0.5) - 0.2, np.percentile(all_losses, 99.5) + 0.2)
    all_norms = np.concatenate([np.asarray(r["grad_norm"])[per_epoch // 4:] for r in runs.values()])
    ax_norm.set_ylim(0, np.percentile(all_norms, 99.5) * 1.15)
    for ax in (ax_loss, ax_norm, ax_heldout):
        ax.axvline(per_epoch + 0.5, color="black", ls="--", lw=1)
        ax.axvspan(per_epoch - k + 0.5, per_epoch + k + 0.5, color="#ffdd88", alpha=0.25, lw=0)
        ax.set_xlim(0, 2 * per_epoch + 1)
        ax.grid(alpha=0.3)
    ax_loss.text(per_epoch + 1.5, ax_loss.get_ylim()[1], "epoch 2: the loader wraps to the first window",
                 va="top", fontsize=9, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    ax_loss.set_ylabel("training loss (nats/token)")
    ax_loss.set_title(f"per step (thin) and {smooth}-step trailing mean (thick); shaded: the {k} steps either side "
                      "of the boundary the table compares", fontsize=9.5)
    ax_norm.set_ylabel("gradient norm (before clipping)")
    ax_heldout.set_ylabel("held-out loss")
    ax_heldout.set_xlabel("optimizer step")
    handles, names = ax_loss.get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.935), ncol=len(runs), fontsize=10,
               frameon=False)
    settings, corpus = results["settings"], results["corpus"]
    fig.suptitle(f"Training loss and gradient norm across the epoch boundary, by data order: {corpus['name']}\n"
                 f"{corpus['train_docs']:,} training documents ({corpus['train_tokens']:,} tokens, "
                 f"{corpus['blocks']} runs of the input), {settings['model_params'] / 1e6:.2f}M-parameter Llama "
                 f"({settings['layers']} layers, width {settings['width']}, vocab {settings['vocab_size']:,}), "
                 f"{settings['batch']} x {settings['seq_len']} tokens per step, AdamW lr {settings['lr']:g} constant",
                 fontsize=10.5)
    ax_table = fig.add_subplot(grid[3])
    ax_table.axis("off")
    # "rank": the share of the run's other steps where the same comparison comes out smaller.
    header = ["order", f"loss jump\n(first {k} - last {k})\n[rank in run]", "grad-norm ratio\n(after / before)\n[rank in run]",
              "loss spread\nepoch 1", "loss spread\nepoch 2", "held-out loss\nend of epoch 1",
              "held-out loss\nfinal ± epoch 2\nwobble", "gradient\neffective rank"]
    cells = [[r["order"], f"{r['loss_jump']:+.3f} [{r['loss_jump_rank']:.2f}]",
              f"{r['grad_norm_ratio']:.2f} [{r['grad_norm_ratio_rank']:.2f}]", f"{r['loss_spread_epoch1']:.3f}",
              f"{r['loss_spread_epoch2']:.3f}", f"{r['heldout_end_epoch1']:.3f}",
              f"{r['heldout_final']:.3f} ± {r['heldout_wobble']:.3f}", f"{r['grad_effective_rank']:.1f}"]
             for r in rows]
    table = ax_table.table(cellText=cells, colLabels=header, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.45)
    for (row, col), cell in table.get_celld().items():
        if row == 0:
            cell.set_height(cell.get_height() * 2.2)
        elif col == 0:
            cell.get_text().set_color(SPECS[rows[row - 1]["order"]].color)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


# ------------------------------------------------------------------------------------ main

# A tiny model on one thread (two only add synchronisation at this size): seconds, every code path.
QUICK = {"train_tokens": 3000, "heldout_tokens": 600, "blocks": 4, "seq_len": 64, "batch": 2, "width": 32,
         "layers": 1, "heads": 2, "eval_every": 8, "boundary_k": 3, "warmup_steps": 2, "threads": 1}


def results_json(results: dict) -> str:
    """Indented JSON with each list of numbers on one line (the per-step series stay readable and small)."""
    text, previous = json.dumps(results, indent=1), None
    while text != previous:  # innermost lists first, then the lists of them
        previous = text
        text = re.sub(r"\[\s+([-0-9.eE,\s\[\]]+?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    return text + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus = p.add_argument_group("corpus")
    corpus.add_argument("--input", type=Path, default=None, help="JSONL corpus (default: demo/stdlib.jsonl)")
    corpus.add_argument("--site-packages-corpus", action="store_true",
                        help="build and use the drift corpus: this Python's site-packages sources grouped by package")
    corpus.add_argument("--text-field", default="text")
    corpus.add_argument("--model-dir", type=Path, default=ROOT / "demo/SmolLM2-135M",
                        help="model folder: its tokenizer for training, its embeddings for the pipeline's clustering")
    corpus.add_argument("--labels", type=Path, default=None,
                        help="cluster id per record (.npy, input order) instead of running curate_dataset.py")
    corpus.add_argument("--n-clusters", type=int, default=30)
    corpus.add_argument("--train-tokens", type=int, default=196_608, help="training documents' tokens (default: 196608)")
    corpus.add_argument("--blocks", type=int, default=None,
                        help="contiguous runs of the input they are taken as; a run should be about one topic's "
                             "run in the input: 32 (~6K tokens, one stdlib module), 8 with --site-packages-corpus "
                             "(~25K tokens, one package)")
    corpus.add_argument("--heldout-tokens", type=int, default=8192, help="held-out documents' tokens (default: 8192)")
    corpus.add_argument("--work", type=Path, default=ROOT / "build/bench_training",
                        help="cache folder: the pipeline's labels and caches, the built drift corpus")
    train = p.add_argument_group("training")
    train.add_argument("--orders", nargs="+", default=DEFAULT_ORDERS, choices=CLUSTER_ORDERINGS, metavar="ORDER",
                       help=f"orderings to train on (default: {' '.join(DEFAULT_ORDERS)})")
    train.add_argument("--seq-len", type=int, default=256, help="packed window length in tokens (default: 256)")
    train.add_argument("--batch", type=int, default=4, help="consecutive windows per step (default: 4)")
    train.add_argument("--epochs", type=int, default=2)
    train.add_argument("--layers", type=int, default=2)
    train.add_argument("--width", type=int, default=128)
    train.add_argument("--heads", type=int, default=4)
    train.add_argument("--lr", type=float, default=2e-3)
    train.add_argument("--warmup-steps", type=int, default=16, help="linear warmup, then a constant rate (default: 16)")
    train.add_argument("--weight-decay", type=float, default=0.1)
    train.add_argument("--clip", type=float, default=1.0, help="gradient clipping norm (0 = off; default: 1.0)")
    train.add_argument("--eval-every", type=int, default=16, help="held-out loss every N steps (default: 16)")
    train.add_argument("--boundary-k", type=int, default=16, help="steps either side of the epoch boundary (default: 16)")
    train.add_argument("--seed", type=int, default=0,
                       help="clustering, training subset and held-out sample: the data (default: 0)")
    train.add_argument("--run-seed", type=int, default=0,
                       help="model initialisation and the orderings' random choices; rerun with others to see "
                            "how much of a difference between orders is run-to-run noise (default: 0)")
    train.add_argument("--jobs", type=int, default=None,
                       help="orders trained at once, each in its own process (default: 2, one per core; "
                            "1 with --quick, where starting the processes would take longer than training)")
    train.add_argument("--threads", type=int, default=1,
                       help="torch threads per job (default: 1; at this model size a second thread mostly waits)")
    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None,
                     help="results JSON (default: benchmarks/results_training[_site_packages].json)")
    out.add_argument("--figure", type=Path, default=None,
                     help="figure (default: docs/training_effect[_site_packages].png)")
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test (seconds); outputs under --work")
    p.add_argument("--replot", type=Path, default=None, metavar="RESULTS_JSON",
                   help="only redraw the figure (--figure) from a results JSON this script wrote")
    p.add_argument("--seed-table", type=Path, nargs="+", default=None, metavar="RESULTS_JSON",
                   help="only print the statistics' mean and standard deviation over results JSONs that differ "
                        "in --run-seed alone (run-to-run noise)")
    args = p.parse_args(argv)
    if args.blocks is None:
        args.blocks = 8 if args.site_packages_corpus else 32
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.jobs is None:
        args.jobs = 1 if args.quick else 2
    suffix = "_site_packages" if args.site_packages_corpus else ""
    suffix += "_quick" if args.quick else ""
    default_dir = args.work if args.quick else ROOT
    args.out = args.out or default_dir / f"benchmarks/results_training{suffix}.json"
    args.figure = args.figure or default_dir / f"docs/training_effect{suffix}.png"
    if args.epochs < 2:
        p.error("--epochs must be at least 2: the boundary is between epochs 1 and 2")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.seed_table:
        rows = across_run_seeds([json.loads(path.read_text()) for path in args.seed_table])
        print(seed_markdown_table(rows))
        return {"seed_table": rows}
    if args.replot:
        results = json.loads(args.replot.read_text())
        settings = results["settings"]
        # The table is recomputed from the per-step records, so a change to the statistics needs no retraining.
        results["table"] = summarise(results["runs"], settings["boundary_k"], settings["spread_half_window"])
        args.replot.write_text(results_json(results))
        plot(results, args.figure)
        print(markdown_table(results["table"], results["settings"]["boundary_k"]))
        return results
    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    if args.site_packages_corpus:
        args.input = build_site_packages_corpus(args.work / "site_packages.jsonl")
        name = "site-packages sources grouped by package"
    else:
        args.input = args.input or ROOT / "demo/stdlib.jsonl"
        name = args.input.name
    texts = read_texts(args.input, args.text_field)
    timings = {"corpus": time.perf_counter() - started}
    labels = np.load(args.labels) if args.labels else pipeline_labels(args.input, args.model_dir, args.work,
                                                                      args.n_clusters, args.seed)
    timings["labels"] = time.perf_counter() - started - sum(timings.values())
    if labels.shape != (len(texts),):
        raise SystemExit(f"{len(texts)} records but {labels.shape[0]} labels")
    documents, eos = tokenize(texts, args.model_dir)
    counts = np.fromiter((d.size + 1 for d in documents), dtype=np.int64, count=len(documents))  # + EOS
    train_docs, heldout_docs = select_documents(counts, args.train_tokens, args.heldout_tokens, args.blocks, args.seed)
    vocab = compact_vocabulary([documents[i] for i in np.concatenate([train_docs, heldout_docs])] + [np.array([eos])])
    documents = {int(i): np.searchsorted(vocab, documents[i]) for i in np.concatenate([train_docs, heldout_docs])}
    compact_eos = int(np.searchsorted(vocab, eos))
    timings["tokenize"] = time.perf_counter() - started - sum(timings.values())
    train_list = [documents[int(i)] for i in train_docs]
    heldout_windows, _ = pack([documents[int(i)] for i in heldout_docs], labels[heldout_docs],
                              np.arange(heldout_docs.size), compact_eos, args.seq_len)
    train_labels = labels[train_docs]
    train_counts = counts[train_docs]
    n_clusters = int(labels.max()) + 1
    # One optimizer step's tokens, packed as the loader here packs (documents split across windows).
    options = OrderingOptions(seed=args.run_seed, seq_len=args.seq_len * args.batch, packing="split")
    given = args.input.absolute()  # not resolved: demo/ is often a link to a shared copy
    shown_input = given.relative_to(ROOT) if given.is_relative_to(ROOT) else given
    corpus = {"name": name, "input": str(shown_input), "records": len(texts), "tokens": int(counts.sum()),
              "train_docs": int(train_docs.size), "train_tokens": int(train_counts.sum()), "blocks": args.blocks,
              "heldout_docs": int(heldout_docs.size), "heldout_tokens": int(counts[heldout_docs].sum()),
              "heldout_windows": int(heldout_windows.shape[0]), "n_clusters": n_clusters,
              "train_clusters_present": int(np.unique(train_labels).size)}
    print(json.dumps(corpus), file=sys.stderr, flush=True)
    runs, step_clusters = {}, {}
    with trainers(args.jobs) as pool:
        for order_name in args.orders:
            order = ORDERINGS[order_name](train_labels, train_counts, n_clusters, options)
            windows, token_labels = pack(train_list, train_labels, order, compact_eos, args.seq_len)
            usable = windows.shape[0] // args.batch * args.batch
            step_labels = token_labels[:usable].reshape(-1, args.batch * args.seq_len)
            step_clusters[order_name] = [np.unique(step).size for step in step_labels]
            runs[order_name] = pool.submit(train_one_order, windows[:usable], heldout_windows, vocab.size, args,
                                           order_name)
        runs = {name: future.result() for name, future in runs.items()}
    for name, run in runs.items():
        run["clusters_per_step"] = step_clusters[name]
        run["clusters_per_step_mean"] = float(np.mean(step_clusters[name]))
    timings["train"] = time.perf_counter() - started - sum(timings.values())
    checksums = {run["init_checksum"] for run in runs.values()}
    assert len(checksums) == 1, f"the orders started from different initialisations: {checksums}"
    model_params = sum(p.numel() for p in build_model(vocab.size, args).parameters())
    half_window = max(2, args.boundary_k // 2)
    rows = summarise(runs, args.boundary_k, half_window)
    results = {
        "command": " ".join(["python", "benchmarks/bench_training.py", *(sys.argv[1:] if argv is None else argv)]),
        "corpus": corpus,
        "settings": {"orders": args.orders, "seq_len": args.seq_len, "batch": args.batch, "epochs": args.epochs,
                     "steps_per_epoch": next(iter(runs.values()))["steps_per_epoch"], "layers": args.layers,
                     "width": args.width, "heads": args.heads, "vocab_size": int(vocab.size),
                     "model_params": int(model_params), "lr": args.lr, "warmup_steps": args.warmup_steps,
                     "schedule": "linear warmup, then constant", "optimizer": "AdamW(0.9, 0.95)",
                     "weight_decay": args.weight_decay, "clip": args.clip, "eval_every": args.eval_every,
                     "boundary_k": args.boundary_k, "spread_half_window": half_window, "seed": args.seed,
                     "run_seed": args.run_seed,
                     "jobs": args.jobs, "threads": args.threads, "ordering_seq_len": options.seq_len},
        "table": rows,
        "runs": runs,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor(),
                    "cores": os.cpu_count()},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(results_json(results))
    plot(results, args.figure)
    timings["plot"] = time.perf_counter() - started - sum(timings.values())
    print("seconds: " + ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in timings.items()), file=sys.stderr)
    print(markdown_table(rows, args.boundary_k))
    print(f"wrote {args.out} and {args.figure} in {results['wall_s']:.0f} s", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
