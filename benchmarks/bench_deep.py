"""Deep-embedding throughput: batched extraction vs one document at a time through the model.

    .venv/bin/python benchmarks/bench_deep.py [--docs 100] [--max-tokens 512] [--device auto]
                                              [--corpus demo/stdlib.jsonl --model demo/SmolLM2-135M]

Both paths embed the same first ``--docs`` documents, truncated to ``--max-tokens``: ours
(``extract_deep_embeddings``: length-sorted padded batches from a token budget) and the plain way
(one forward per document, mean of ``last_hidden_state``). Reports tokens/s for each, their
ratio and the largest cosine gap between the two results.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diversity_order.deep import DeepConfig, extract  # noqa: E402
from diversity_order.runtime import resolve_device  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--device", default="auto")
    p.add_argument("--corpus", type=Path, default=ROOT / "demo" / "stdlib.jsonl")
    p.add_argument("--model", type=Path, default=ROOT / "demo" / "SmolLM2-135M")
    args = p.parse_args()
    import torch
    from transformers import AutoModel, AutoTokenizer

    device = torch.device(resolve_device(args.device, 0))  # resolve_device gives a name
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "deep.npy"
        started = time.perf_counter()
        result = extract(DeepConfig(input=args.corpus, output=out, model_dir=args.model, device=str(device),
                                    max_tokens=args.max_tokens, limit=args.docs, progress=False))
        ours_s = time.perf_counter() - started
        ours = np.load(out)

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModel.from_pretrained(args.model, dtype=dtype).to(device).eval()
    texts = [json.loads(line)["text"] for line in args.corpus.read_text().splitlines()[: args.docs]]
    started = time.perf_counter()
    plain, tokens = [], 0
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer.encode(text, add_special_tokens=False)[: args.max_tokens]
            tokens += len(ids)
            hidden = model(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0].float().mean(0)
            plain.append((hidden / hidden.norm()).cpu().numpy())
    plain_s = time.perf_counter() - started
    cosine = (ours * np.asarray(plain)).sum(1)
    row = {"device": str(device), "docs": args.docs, "tokens": tokens, "max_tokens": args.max_tokens,
           "ours_s": round(ours_s, 1), "ours_tokens_per_s": round(result.tokens / ours_s),
           "one_at_a_time_s": round(plain_s, 1), "one_at_a_time_tokens_per_s": round(tokens / plain_s),
           "speedup": round(plain_s / ours_s, 2), "min_cosine_vs_plain": round(float(cosine.min()), 6)}
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
