"""How a trainer packs documents into windows of ``seq_len`` tokens: the one packing rule.

Two models of the trainer:

- ``whole`` (the default; the original toolkit's): a document joins the open window if it fits;
  otherwise the window closes and the document opens the next one. Only a document longer than a
  window is cut: it fills whole windows alone, and its remainder opens the next, which later
  documents join.
- ``split`` (Megatron, nanoGPT, torchtitan, Hugging Face ``group_texts``): documents are
  concatenated into one token stream, cut every ``seq_len`` tokens; a document is present in every
  window its tokens reach. A document without tokens belongs to the window of the token before it.

``place`` states where one document goes as a short sequence of pieces. Every kernel that walks
documents through windows (window diversity, token-share uniformity, the window-aware orderings)
asks it, and only keeps its own bookkeeping:

    close_first, head, n_full, tail, close_last = place(fill, tokens, seq_len, model)
    if close_first: close the open window
    add `head` tokens to the open window             # the document is present there
    n_full times: close the window, add seq_len tokens to the next one (the document alone)
    if tail > 0: close the window, add `tail` tokens to the next one
    if close_last: close the window

Closing a window with tokens finishes it; closing one without tokens discards it (it can only
hold zero-token documents, which the original toolkit drops there too).
"""

from __future__ import annotations

from numba import njit

PACKING_MODELS = ("whole", "split")
WHOLE = 0
SPLIT = 1


def packing_model(name: str) -> int:
    """The kernels' integer code of a packing model name ("whole" or "split")."""
    if name not in PACKING_MODELS:
        raise ValueError(f"packing must be one of {', '.join(PACKING_MODELS)}, not {name!r}")
    return PACKING_MODELS.index(name)


@njit(cache=True, nogil=True, inline="always")
def place(fill, tokens, seq_len, model):
    """Where a document of ``tokens`` goes when the open window holds ``fill`` tokens (see the module doc).

    Returns (close_first, head, n_full, tail, close_last).
    """
    if model == WHOLE:
        if fill + tokens <= seq_len:
            return False, tokens, 0, 0, False
        head = min(tokens, seq_len)
        rest = tokens - head
        tail = rest % seq_len
        return True, head, rest // seq_len, tail, tail == 0 and head == seq_len
    # SPLIT: a window exactly full stays open (for zero-token documents) until tokens need room.
    close_first = fill == seq_len and tokens > 0
    if close_first:
        fill = 0
    head = min(tokens, seq_len - fill)
    rest = tokens - head
    if rest == 0:
        return close_first, head, 0, 0, False
    n_full = (rest - 1) // seq_len
    return close_first, head, n_full, rest - n_full * seq_len, False


@njit(cache=True, nogil=True, inline="always")
def n_pieces(n_full, tail):
    """How many windows a placed document puts tokens in (the open one, full ones, the tail one)."""
    return 1 + n_full + (1 if tail > 0 else 0)


@njit(cache=True, nogil=True, inline="always")
def piece_tokens(piece, head, n_full, tail, seq_len):
    """Tokens of the document in its ``piece``-th window (0: the open window)."""
    if piece == 0:
        return head
    return seq_len if piece <= n_full else tail


@njit(cache=True, nogil=True, inline="always")
def advance(stamp, cluster, tokens, window, fill, seq_len, model):
    """Pack one document of ``cluster``; mark ``stamp[cluster] = window`` for every window it is present in.

    For orderings that only need to know which clusters the open window holds: windows are
    numbered as they open (a discarded empty window keeps its number). Returns (window, fill).
    """
    close_first, head, n_full, tail, close_last = place(fill, tokens, seq_len, model)
    if close_first:
        window += 1
        fill = 0
    for piece in range(n_pieces(n_full, tail)):
        if piece > 0:
            window += 1
            fill = 0
        stamp[cluster] = window
        fill += piece_tokens(piece, head, n_full, tail, seq_len)
    if close_last:
        window += 1
        fill = 0
    return window, fill
