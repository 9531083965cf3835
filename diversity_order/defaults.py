"""The defaults the scripts share, written once (the original toolkit's values).

``--seed 42`` for every random choice, ``--n-clusters 30`` and ``--seq-len 131072`` tokens.
"""

DEFAULT_SEED = 42
DEFAULT_N_CLUSTERS = 30
DEFAULT_SEQ_LEN = 131072
