"""Deep document embeddings: mean of a Hugging Face model's last hidden layer over each document.

Writes a float32 N x D .npy in input order (L2-normalised means over real tokens), for
curate_dataset.py --load-embeddings. Tokens are tokenizer.encode(text, add_special_tokens=False),
like the shallow path. Documents run sorted by length in padded batches sized from a token
budget; out-of-memory shrinks the batch, and a document that fits in no batch is skipped
(NaN row, listed in OUTPUT.skipped.json). Progress is checkpointed (OUTPUT.partial.*; SIGTERM
checkpoints too) and a rerun resumes. A rerun over an edited, extended or reordered input
recomputes only the records whose text is not already in OUTPUT (checked with
OUTPUT.fingerprints.npy / OUTPUT.cache.json), or every record when the content of the model's
weights, config or tokenizer files changed; token ids are cached in OUTPUT.tokens.*. Under
torchrun --nproc_per_node=N each rank embeds a share (data parallel), or with --tp N holds 1/N
of the weights (tensor parallel); with --tp N and a multiple of N processes, groups of N
consecutive ranks each hold one sharded copy and the groups split the documents (data parallel
x tensor parallel).
See diversity_order/deep/ for the details.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from . import ArgumentParser, add_input_flags, add_output_flags, input_values, run_command, setup_logging


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from ..deep import DTYPES, DeepConfig
    from ..deep.config import CPU_BATCH_SIZE, CPU_TOKEN_BUDGET, GPU_BATCH_SIZE

    default = {f.name: f.default for f in dataclasses.fields(DeepConfig)}
    p = ArgumentParser(description=__doc__, prog="extract_deep_embeddings.py")
    add_input_flags(p)
    p.add_argument("--output", required=True, type=Path, help="embeddings to write (.npy, N x D float32, input order)")
    p.add_argument("--model-dir", required=True, type=Path,
                   help="local Hugging Face model folder (tokenizer + weights); the content of its files keys the "
                        "reused rows")
    p.add_argument("--batch-size", type=int, default=default["batch_size"],
                   help="most documents per forward pass; the token budget may choose fewer (default: "
                        f"{GPU_BATCH_SIZE} on a GPU, {CPU_BATCH_SIZE} on CPU)")
    p.add_argument("--device", default=default["device"],
                   help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--gpu", type=int, default=default["gpu"],
                   help="GPU index used when the device is CUDA (default: %(default)s)")
    p.add_argument("--dtype", default=default["dtype"], choices=DTYPES,
                   help="model weights' dtype: auto = bfloat16 on GPU, float32 on CPU (pooling is always float32)")
    p.add_argument("--tp", type=int, default=default["tp"],
                   help="tensor parallel under torchrun: each rank holds 1/N of the weights; with --nproc_per_node a "
                        "multiple of N, every N ranks form one data-parallel group (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=default["max_tokens"],
                   help="truncate every document to this many tokens")
    p.add_argument("--max-seq-len", type=int, default=default["max_seq_len"],
                   help="truncate to the model's context; default: the model's max_position_embeddings")
    p.add_argument("--reverse", action="store_true", help="process the longest documents first (fail fast on memory)")
    p.add_argument("--limit", type=int, default=default["limit"], help="embed only the first N documents")
    p.add_argument("--token-budget", type=int, default=default["token_budget"],
                   help="tokens per batch (documents x longest length); default: from free GPU memory, "
                        f"{CPU_TOKEN_BUDGET} on CPU")
    p.add_argument("--checkpoint-docs", type=int, default=default["checkpoint_docs"],
                   help="write a resumable checkpoint (the rows done since the last one) every this many "
                        "documents or --checkpoint-seconds, whichever comes first (default: %(default)s)")
    p.add_argument("--checkpoint-seconds", type=float, default=default["checkpoint_seconds"],
                   help="... or every this many seconds, whichever comes first (default: %(default)g)")
    p.add_argument("--attn-implementation", default=default["attn_implementation"],
                   help="attention kernel passed to transformers (e.g. sdpa, eager, flash_attention_2); "
                        "default: the model's own choice")
    add_output_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.verbose)
    from ..deep import DeepConfig, extract

    inputs, text_field = input_values(args)
    config = DeepConfig(
        input=inputs, output=args.output, model_dir=args.model_dir, batch_size=args.batch_size,
        device=args.device, gpu=args.gpu, dtype=args.dtype, tp=args.tp, max_tokens=args.max_tokens,
        max_seq_len=args.max_seq_len, reverse=args.reverse, text_field=text_field, limit=args.limit,
        token_budget=args.token_budget, checkpoint_docs=args.checkpoint_docs,
        checkpoint_seconds=args.checkpoint_seconds, attn_implementation=args.attn_implementation,
        progress=not args.no_progress,
    )
    extract(config)
    return 0


def console() -> int:
    """The ``extract-deep-embeddings`` command."""
    return run_command(main)
