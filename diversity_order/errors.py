"""Errors the user can fix: the scripts print these as one line and exit non-zero."""

from __future__ import annotations

import errno
import math

# Integer flags are bounded so that arithmetic on them (token offsets, window fills, sizes of
# arrays they shape) never overflows 64 bits: a mistyped 10**30 is an error, not a traceback.
MAX_COUNT = 2**40
# Upper bounds that only keep numbers sane (counts, sizes), not a range to choose from: a value below the low end is
# told the low end alone ("--n-clusters 0: must be at least 1", not "within 1..2,147,483,648").
SANITY_BOUNDS = frozenset({2**31, MAX_COUNT})


# What a write that found no room raises: a full disk, a spent quota, a file larger than the file system (FAT's
# 4 GiB) or ``ulimit -f`` allows.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class UserError(Exception):
    """An error caused by the user's input or flags: the scripts print its message as one line and exit 2, no traceback."""


class EveryRankError(UserError):
    """A UserError every torchrun rank raises with the same message (a check all of them make, or one whose verdict
    they share): rank 0 alone prints it, so the shared stderr holds it once."""


def check_range(value, flag: str, low, high, what: str = "") -> None:
    """Raise a UserError naming ``flag`` unless ``low <= value <= high`` (and a finite number)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and low <= value <= high
    if not ok:
        too_small = isinstance(value, int | float) and not isinstance(value, bool) and value < low
        if high == math.inf:
            bound = f"a finite number, at least {low:,}"
        elif too_small and high in SANITY_BOUNDS:  # a bound only there to keep numbers sane says nothing to a 0
            bound = f"at least {low:,}"
        else:
            bound = f"within {low:,}..{high:,}"
        raise UserError(f"{flag} {value}: must be {bound}{f' ({what})' if what else ''}")
