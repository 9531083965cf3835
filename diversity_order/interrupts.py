"""Whether Ctrl-C was pressed, for code that must stop though a library dropped the KeyboardInterrupt.

Python raises KeyboardInterrupt wherever the main thread is, and some libraries catch and drop it (seen
during a UMAP fit: the run went on to write every file). A command's Ctrl-C handler (``cli.run_command``)
calls ``request_interrupt``; stages (``runtime.StageTimer``) call ``stop_if_interrupted`` when they start
and end, so such a run stops at the next stage. No imports: the handler is set before anything heavy loads.
"""

from __future__ import annotations

_requested = {"set": False}


def request_interrupt() -> None:
    """Ctrl-C was pressed: ``stop_if_interrupted`` raises KeyboardInterrupt from now on."""
    _requested["set"] = True


def stop_if_interrupted() -> None:
    if _requested["set"]:
        raise KeyboardInterrupt
