"""Deep embeddings: mean of a Hugging Face model's last hidden layer over each document's tokens.

Each document becomes the L2-normalised mean of the base model's ``last_hidden_state`` over
its real (non-pad) tokens, accumulated in float32, saved as a float32 N x D ``.npy`` in input
order (the format ``curate_dataset.py --load-embeddings`` reads).

* Tokens: ``tokenizer.encode(text, add_special_tokens=False)``, exactly as the shallow path
  (no BOS/EOS), truncated to ``min(--max-tokens, --max-seq-len)``. ``--max-seq-len`` defaults
  to the model's ``max_position_embeddings``: a longer document is truncated to it (and the
  number of truncated documents is logged), since positions past it are untrained.
* Order: documents are processed sorted by token count (ascending; ``--reverse`` longest
  first) in right-padded batches with an attention mask. With right padding and causal
  attention a real token never sees a pad, so a document's vector depends only on itself
  (the tests check padded batch == one at a time, cosine > 0.9999 in float32).
* Batch size: the most documents whose count x longest length fits a token budget (from 70%
  of free accelerator memory on GPU, a fixed default on CPU), capped by ``--batch-size``.
* Out of memory: several documents -> the budget shrinks to 60% of the failed batch and the
  batch is retried; one document -> it is skipped (NaN row, listed with its length in
  ``OUTPUT.skipped.json`` and the log). The budget grows back 10% per successful batch.
* Resume: ``OUTPUT.partial.npy`` (rows so far) and ``OUTPUT.partial.done.npy`` (done mask,
  written after the data) are checkpointed atomically every ``checkpoint_docs`` documents or
  ``checkpoint_seconds``; ``OUTPUT.partial.json`` keys them to the data, the model and the
  settings (a mismatch starts over, with a warning), ``OUTPUT.partial.rows.npy`` names the share's
  rows. A rerun computes only the missing rows, whatever launch checkpointed the others (one
  process, any number of ranks or groups), keeping those in ``OUTPUT.resumed.npz`` until the output
  is written; skipped rows are retried. An OUTPUT already holding every record, in order, means nothing
  to do.
* Incremental: the output is written with ``OUTPUT.fingerprints.npy`` (each row's text
  fingerprint) and ``OUTPUT.cache.json`` (model, tokenizer, dtype, truncation, text field;
  written last), as in ``caches``. A rerun reuses every row whose text is unchanged, wherever
  it moved, and computes only new or edited records (and earlier NaN rows); the file follows
  the new input order. Another model, dtype, truncation or text field recomputes all rows (the
  log says why); an OUTPUT without the sidecars is recomputed with a warning.
* Tokens: each document is tokenized once per run and only if it is to be embedded; the ids
  are cached beside the output (``OUTPUT.tokens.{lengths,fingerprints,ids}.npy``, marker
  ``OUTPUT.tokens.json`` written last) keyed by text fingerprint, tokenizer, text field and
  truncation, so a resumed or repeated run tokenizes only unseen texts.
* torchrun (data parallel): every rank takes a contiguous run of the length-sorted documents,
  balanced by tokens, checkpoints its own ``OUTPUT.rank{r}.partial.*``, and rank 0 gathers
  and writes the output.
* torchrun with ``--tp N`` (tensor parallel): the WORLD_SIZE processes form WORLD_SIZE / N
  data-parallel groups of N consecutive ranks (a ("dp", "tp") device mesh), so a group stays
  inside a node when ``--nproc_per_node`` is a multiple of N. Each group holds one copy of
  the model sharded over its N ranks, which run the same batches in lockstep (their
  out-of-memory decisions and checkpoint state agreed within the group); the groups split the
  documents as data-parallel ranks do, the group's first rank checkpoints its share
  (``OUTPUT.rank{g}.partial.*`` for group g; ``OUTPUT.partial.*`` when there is one group),
  and rank 0 gathers the groups' rows.

Layout of this package: ``config`` (settings and checks), ``model`` (loading, tensor-parallel
sharding, fingerprint), ``tokens`` (tokenizing and the token cache), ``layout`` (data x tensor
parallel groups), ``checkpoint`` (partial files), ``batches`` (the batch loop), ``extract``
(the stages, in order).
"""

from .checkpoint import partial_paths, skipped_path
from .config import DTYPES, DeepConfig, DeepResult
from .extract import extract
from .model import default_forward, is_oom

__all__ = ["DTYPES", "DeepConfig", "DeepResult", "default_forward", "extract", "is_oom", "partial_paths",
           "skipped_path"]
