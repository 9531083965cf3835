"""What the clusters are: ``B_clusters.md`` and ``B_clusters.json``.

K = 30 "topics" are only worth ordering by if they mean something. For each cluster: its size
and share of the tokens, how tight it is (mean cosine of its documents to its centre), the
tokens that most distinguish it from the rest of the corpus, and the opening of the documents
nearest its centre.

Distinguishing words are ranked by the weighted log-odds ratio with an informative Dirichlet
prior (Monroe, Colaresi and Quinn, 2008): a token's z-score for "more frequent in this cluster
than in the others", which neither lets rare tokens win on one occurrence nor lets common words
win on volume. Counts come from a seeded sample of each cluster's documents, tokenized with the
model's tokenizer (tokens merged by how they read; punctuation and digits left out), or split
into words when the run has no tokenizer.
"""

from __future__ import annotations

import logging
import re
from collections import Counter

import numpy as np
from numba import njit

from . import matrix
from .fields import plain_text

log = logging.getLogger(__name__)

SAMPLE_DOCS = 200  # documents per cluster whose tokens are counted
SAMPLE_CHARS = 4_000  # of each, the opening (enough to say what it is about)
TOP_TOKENS = 12
EXAMPLES = 3
OPENING_CHARS = 160
# Rows cohesion and nearest documents are computed on, at most (a seeded sample beyond, read twice from
# the cache file; the cohesion of a cluster of 1% of the rows, ~2,500 of them, is then known to about
# +-0.002). The sample is runs of up to CENTRE_RUN_ROWS consecutive rows: 1M single rows scattered
# over a 23 GB file took 11 s to read from the page cache, 19 s from the disk.
CENTRE_ROWS = 250_000
CENTRE_RUN_ROWS = 64
PRIOR_STRENGTH = 1000.0  # pseudo-counts of the corpus-wide prior, spread by token frequency
_WORD = re.compile(r"\w+")


def _sample_rows(labels: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    """Up to SAMPLE_DOCS seeded random documents of each cluster (input rows, ascending)."""
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(labels.size)
    keys = labels[shuffled]
    if n_clusters <= np.iinfo(np.uint16).max:
        keys = keys.astype(np.uint16)  # a stable sort of 16-bit keys is a radix sort: 10M in 0.1 s, not 1
    by_cluster = shuffled[np.argsort(keys, kind="stable")]
    starts = np.searchsorted(labels[by_cluster], np.arange(n_clusters + 1))
    picked = [by_cluster[starts[k]: min(starts[k + 1], starts[k] + SAMPLE_DOCS)] for k in range(n_clusters)]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, np.int64)


def token_counts_per_cluster(index: object, labels: np.ndarray, n_clusters: int, tokenizer,
                             seed: int) -> tuple[list[str], np.ndarray]:
    """(words, counts): how often each word occurs in a sample of each cluster's documents, as an
    n_clusters x len(words) float64 matrix; ``words`` sorted.

    With a tokenizer, tokens are counted and then merged by how they read (" self" and "self" are
    one word here); tokens without a letter or shorter than two characters (punctuation,
    indentation, digits) are left out: they rarely say what a topic is. Without one, words.
    """
    rows = _sample_rows(labels, n_clusters, seed)
    if tokenizer is None:
        counters = [Counter() for _ in range(n_clusters)]
        for batch_rows, texts in index.iter_documents(rows):
            for row, text in zip(batch_rows.tolist(), texts):
                counters[labels[row]].update(_WORD.findall(plain_text(text)[:SAMPLE_CHARS].lower()))
        words = sorted({word for counter in counters for word in counter if _readable(word)})
        position = {word: i for i, word in enumerate(words)}
        counts = np.zeros((n_clusters, len(words)))
        for k, counter in enumerate(counters):
            for word, n in counter.items():
                if word in position:
                    counts[k, position[word]] = n
        return words, counts
    id_parts, label_parts = [], []
    for batch_rows, texts in index.iter_documents(rows):
        flat, lengths = tokenizer.encode_batch([plain_text(text)[:SAMPLE_CHARS] for text in texts])
        id_parts.append(flat)
        label_parts.append(np.repeat(labels[batch_rows], lengths))
    ids = np.concatenate(id_parts) if id_parts else np.zeros(0, np.int64)
    token_labels = np.concatenate(label_parts) if label_parts else np.zeros(0, np.int64)
    seen, token_of = np.unique(ids, return_inverse=True)
    surfaces = [text.strip() for text in tokenizer.token_texts(seen.tolist())]
    words = sorted({surface for surface in surfaces if _readable(surface)})
    position = {word: i for i, word in enumerate(words)}
    word_of = np.array([position.get(surface, -1) for surface in surfaces], dtype=np.int64)[token_of]
    kept = word_of >= 0
    counts = np.bincount(token_labels[kept] * len(words) + word_of[kept], minlength=n_clusters * len(words))
    return words, counts.reshape(n_clusters, len(words)).astype(np.float64)


def _readable(word: str) -> bool:
    return len(word) >= 2 and any(ch.isalpha() for ch in word)


def distinguishing_tokens(words: list[str], counts: np.ndarray, top: int = TOP_TOKENS) -> list[list[tuple[str, float]]]:
    """Per cluster (row of ``counts``), the ``top`` words with the highest log-odds z-score against the
    other clusters."""
    if not words:
        return [[] for _ in range(counts.shape[0])]
    total = counts.sum(0)
    prior = PRIOR_STRENGTH * total / max(total.sum(), 1.0)
    prior_sum = prior.sum()
    out = []
    for k in range(counts.shape[0]):
        own, rest = counts[k], total - counts[k]
        n_own, n_rest = own.sum(), rest.sum()
        if n_own == 0:
            out.append([])
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            delta = (np.log((own + prior) / (n_own + prior_sum - own - prior))
                     - np.log((rest + prior) / (n_rest + prior_sum - rest - prior)))
            z = delta / np.sqrt(1.0 / (own + prior) + 1.0 / (rest + prior))
        z = np.where(own > 0, np.nan_to_num(z, nan=-np.inf), -np.inf)
        best = np.argsort(-z, kind="stable")[:top]
        out.append([(words[i], round(float(z[i]), 2)) for i in best if np.isfinite(z[i])])
    return out


def centre_examples(embeddings: np.ndarray, labels: np.ndarray, n_clusters: int, chunk: int = 4096,
                    max_rows: int | None = None, seed: int = 0):
    """Per cluster: its cohesion (mean cosine of members to the normalised centre) and the rows nearest it.

    Beyond ``max_rows`` rows (``CENTRE_ROWS`` by default) both come from that many seeded sample
    rows, so the report reads a bounded share of a large cache file (twice) instead of all of it.
    Blocks are small: each makes three float64 copies (rows, their centres, the product), which at
    65,536 rows x 576 took ~0.9 GB and set a whole run's peak memory.
    """
    n = labels.size
    rows = centre_sample(n, CENTRE_ROWS if max_rows is None else max_rows, seed)
    labels = labels[rows]
    sums = np.zeros((n_clusters, matrix.shape(embeddings)[1]), dtype=np.float64)
    for at, block in _row_blocks(embeddings, rows, chunk):
        _add_rows_by_label(sums, labels[at: at + len(block)], block)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    centres = np.divide(sums, norms, out=np.zeros_like(sums), where=norms > 0)
    cosine = np.empty(rows.size)
    for at, block in _row_blocks(embeddings, rows, chunk):
        x = block.astype(np.float64)
        lengths = np.linalg.norm(x, axis=1)
        dots = np.einsum("ij,ij->i", x, centres[labels[at: at + len(block)]])
        cosine[at: at + len(block)] = np.divide(dots, lengths, out=np.zeros_like(dots), where=lengths > 0)
    by_cluster = np.lexsort((-cosine, labels))
    starts = np.searchsorted(labels[by_cluster], np.arange(n_clusters + 1))
    cohesion = np.bincount(labels, weights=cosine, minlength=n_clusters) / np.maximum(
        np.bincount(labels, minlength=n_clusters), 1)
    nearest = [rows[by_cluster[starts[k]: min(starts[k + 1], starts[k] + EXAMPLES)]] for k in range(n_clusters)]
    return cohesion, nearest


@njit(cache=True, nogil=True)
def _add_rows_by_label(sums, labels, block):
    """``sums[labels[i]] += block[i]`` in float64 (np.add.at does the same ~100x slower)."""
    for i in range(labels.size):
        target = sums[labels[i]]
        row = block[i]
        for j in range(row.size):
            target[j] += row[j]


def centre_sample(n: int, size: int, seed: int) -> np.ndarray:
    """Every row when ``n`` <= ``size``; else about ``size`` rows in seeded runs of consecutive rows
    (up to CENTRE_RUN_ROWS long, as long as n / size allows), ascending."""
    if n <= size:
        return np.arange(n)
    run = max(1, min(CENTRE_RUN_ROWS, n // size))
    starts = np.random.default_rng(seed).choice(n // run, -(-size // run), replace=False)
    return (np.sort(starts)[:, None] * run + np.arange(run)).ravel()


def _row_blocks(embeddings, rows: np.ndarray, chunk: int):
    """(position in ``rows``, float32 block) over the given ascending rows, ``chunk`` rows at a time."""
    if rows.size == matrix.shape(embeddings)[0]:
        for lo, _, block in matrix.blocks(embeddings, chunk):
            yield lo, block
        return
    for at in range(0, rows.size, chunk):
        yield at, matrix.read_rows(embeddings, rows[at: at + chunk])


def _openings(index: object, rows: np.ndarray) -> dict[int, str]:
    out = {}
    for batch_rows, texts in index.iter_documents(np.sort(rows)):
        for row, text in zip(batch_rows.tolist(), texts):
            flat = " ".join(plain_text(text).split())
            out[row] = flat if len(flat) <= OPENING_CHARS else flat[: OPENING_CHARS - 1] + "…"
    return out


def _example(index, row: int, opening: str) -> dict:
    """A record near its cluster's centre: where it is (its line, for a single JSONL file) and how it opens."""
    if hasattr(index, "line_numbers"):
        return {"line": index.line_number(row), "opening": opening}
    return {"row": row, "where": index.where(row), "opening": opening}


def describe_clusters(index: object, labels: np.ndarray, token_counts: np.ndarray, embeddings: np.ndarray,
                      n_clusters: int, tokenizer, seed: int) -> list[dict]:
    """One dict per non-empty cluster, largest first (see the module doc)."""
    sizes = np.bincount(labels, minlength=n_clusters)
    tokens = np.bincount(labels, weights=token_counts.astype(np.float64), minlength=n_clusters)
    top = distinguishing_tokens(*token_counts_per_cluster(index, labels, n_clusters, tokenizer, seed))
    cohesion, nearest = centre_examples(embeddings, labels, n_clusters, seed=seed)
    if labels.size > CENTRE_ROWS:
        log.info("Cluster cohesion and nearest documents from a seeded sample of %d of the %d rows", CENTRE_ROWS,
                 labels.size)
    openings = _openings(index, np.concatenate(nearest) if nearest else np.zeros(0, np.int64))
    total_tokens = max(tokens.sum(), 1.0)
    clusters = []
    for k in sorted(np.flatnonzero(sizes).tolist(), key=lambda k: (-sizes[k], k)):
        clusters.append({
            "cluster": k,
            "documents": int(sizes[k]),
            "tokens": int(tokens[k]),
            "token_share": round(float(tokens[k] / total_tokens), 4),
            "cohesion": round(float(cohesion[k]), 4),
            "distinguishing_tokens": [{"token": t, "z": z} for t, z in top[k]],
            "nearest_centre": [_example(index, r, openings[int(r)]) for r in nearest[k].tolist()],
        })
    return clusters


def markdown(clusters: list[dict], title: str, n_clusters: int, tokenized: bool) -> str:
    total_docs = sum(c["documents"] for c in clusters)
    unit = "words (the model's tokens)" if tokenized else "words (no tokenizer in this run: split on spaces)"
    sampled = (f"; it and the documents nearest the centre come from a seeded sample of {CENTRE_ROWS:,} documents"
               if total_docs > CENTRE_ROWS else "")
    lines = [f"# Clusters of {title}", "",
             f"K = {n_clusters} ({len(clusters)} non-empty), {total_docs:,} documents. Cohesion: mean cosine of a "
             f"cluster's documents to its centre (higher is tighter){sampled}. Distinguishing {unit}: the most over-represented "
             f"in a sample of up to {SAMPLE_DOCS} of the cluster's documents against the other clusters (log-odds "
             "z-score). If these do not read like topics, the clusters are not topics: try another --n-clusters, "
             "--calibrate-k, or deep embeddings.", "",
             "| cluster | documents | token share | cohesion | distinguishing |", "|---:|---:|---:|---:|---|"]
    for c in clusters:
        words = ", ".join(f"`{_cell(t['token'])}`" for t in c["distinguishing_tokens"][:8])
        lines.append(f"| c{c['cluster']} | {c['documents']:,} | {100 * c['token_share']:.1f}% | {c['cohesion']:.3f} "
                     f"| {words} |")
    for c in clusters:
        lines += ["", f"## c{c['cluster']}: {c['documents']:,} documents, {100 * c['token_share']:.1f}% of the tokens",
                  "", "Distinguishing: " + (", ".join(f"`{_cell(t['token'])}` ({t['z']:.1f})"
                                                      for t in c["distinguishing_tokens"]) or "none"),
                  "", "Nearest its centre:", ""]
        lines += [f"- {'line ' + str(e['line']) if 'line' in e else e['where']}: {_cell(e['opening'])}"
                  for e in c["nearest_centre"]]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell or code span."""
    return str(text).replace("|", "\\|").replace("`", "'").replace("\n", " ").strip() or "␣"
