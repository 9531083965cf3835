"""What the four scripts share: logging set-up, stage timing, device choice, error handling."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from .errors import UserError

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


class StageTimer:
    """Times named stages, logs each one's wall time and keeps them for the metadata."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.peak_rss_mb: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        log.info("%s ...", name)
        started = time.perf_counter()
        yield
        elapsed = time.perf_counter() - started
        self.seconds[name] = round(self.seconds.get(name, 0.0) + elapsed, 3)
        self.peak_rss_mb[name] = peak_rss_mb()
        log.info("%s done in %.1f s (peak memory so far %.0f MB)", name, elapsed, self.peak_rss_mb[name])


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20) if sys.platform == "darwin" else peak / 1024, 1)


def resolve_device(device: str, gpu: int):
    """'auto' -> cuda:GPU when CUDA is available, else cpu; 'cuda' uses --gpu's index."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = f"cuda:{gpu}"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise UserError(f"--gpu {index}: only {torch.cuda.device_count()} GPU(s) visible")
    elif device != "cpu":
        raise UserError(f"--device {device}: expected auto, cpu, cuda or cuda:N")
    return torch.device(device)


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a script's main; user errors become one line on stderr and exit code 2."""
    try:
        return main(argv) or 0
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: files already written are complete; nothing half-written was kept", file=sys.stderr)
        return 130


def load_matrix(path: Path, flag: str) -> np.ndarray:
    """An N x D float matrix from ``.npy`` (float32, memory-mapped), or a one-line error naming ``flag``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{flag} {path}: file not found")
    try:
        matrix = np.load(path, mmap_mode="r")
    except (ValueError, OSError) as exc:
        raise UserError(f"{flag} {path}: not a readable .npy file ({exc})") from None
    if matrix.ndim != 2 or matrix.shape[1] < 1:
        raise UserError(f"{flag} {path}: expected a 2-D N x D matrix, found shape {matrix.shape}")
    if not np.issubdtype(matrix.dtype, np.floating):
        raise UserError(f"{flag} {path}: expected floating-point values, found {matrix.dtype}")
    return np.asarray(matrix, dtype=np.float32)
