#!/usr/bin/env python3
"""`compare-clusterings` without installing (`python compare_clusterings.py --help`).

The code is diversity_order/cli/compare_clusterings.py.
"""

import sys

try:
    from diversity_order.cli import run_main  # noqa: F401  (run_main, main, parse_args: for tests and callers)
    from diversity_order.cli.compare_clusterings import console, main, parse_args  # noqa: F401
except KeyboardInterrupt:  # Ctrl-C while Python is still importing: one line, as at any other moment
    print("interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(console())
