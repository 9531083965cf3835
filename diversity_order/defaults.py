"""The defaults the scripts share, written once (the original toolkit's values).

``--seed 42`` for every random choice, ``--n-clusters 30``, ``--ordering stratified`` and ``--seq-len 131072``
tokens.
"""

DEFAULT_SEED = 42
# The seeds numpy's and scikit-learn's generators take.
MAX_SEED = 2**32 - 1
DEFAULT_N_CLUSTERS = 30
DEFAULT_ORDERING = "stratified"  # the original toolkit's greedy
DEFAULT_SEQ_LEN = 131072
