"""The command line: one module per script (``curate_dataset``, ``extract_deep_embeddings``,
``compare_clusterings``, ``animate_ordering``), and here what they share: argument parsing, logging
set-up, and turning user errors (and Ctrl-C) into one line.

Each script module imports only the standard library at the top; the package's heavy imports
(numpy, torch, numba) happen inside ``main``, under ``run_main``, so a Ctrl-C at any moment ends
with one line rather than a traceback. ``console()`` is the installed command's entry point.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from ..errors import UserError

log = logging.getLogger("diversity_order")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line usage error (``error: PROG: --flag ...``, exit 2), like the scripts' other errors.

    argparse would print the whole usage block first; ``--help`` still shows it.
    """

    def __init__(self, description: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=description, **kwargs)

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see --help)\n")


def add_output_flags(parser, progress: bool = True) -> None:
    """The flags every script shares for what it prints: -v, and --no-progress where it has bars."""
    if progress:
        parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


INTERRUPTED = "interrupted: files already written are complete; nothing half-written was kept"


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a script's main; user errors become one line on stderr and exit code 2, Ctrl-C exit code 130."""
    try:
        return main(argv) or 0
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
