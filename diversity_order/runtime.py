"""Run-time helpers the pipelines share: device and process-group start-up, stage timing, progress.

Progress: a tqdm bar when stderr is a terminal; otherwise (log files, nohup, Slurm) one log line
every ``progress_log_seconds()`` with the count, rate and ETA, so a long job logged to a file
still shows it is alive. The interval comes from ``DIVERSITY_ORDER_PROGRESS_SECONDS`` (default
30), which tests set low to exercise that path.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
import time
from collections.abc import Iterator

from . import distributed
from .errors import UserError
from .interrupts import stop_if_interrupted

log = logging.getLogger("diversity_order")

PROGRESS_SECONDS_ENV = "DIVERSITY_ORDER_PROGRESS_SECONDS"
# Bytes in the MB the logs say (decimal, as "10.4 MB of records" and the files written are said).
MB = 1_000_000
DEFAULT_PROGRESS_SECONDS = 30.0


def progress_log_seconds() -> float:
    """Seconds between progress lines when no bar is drawn."""
    try:
        return max(0.0, float(os.environ.get(PROGRESS_SECONDS_ENV, DEFAULT_PROGRESS_SECONDS)))
    except ValueError:
        return DEFAULT_PROGRESS_SECONDS


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Progress of one long loop: a bar in a terminal, periodic log lines elsewhere.

    ``bar=False`` (``--no-progress``) draws no bar; the log lines still come (``silent`` stops
    both): the first at the
    first update, then one every ``progress_log_seconds()``. With ``total_work`` (e.g. tokens,
    when items differ in size) rates and the ETA are also given in work units, and the ETA
    comes from the work rate. ``total_size`` (e.g. the items' bytes, known before the work, where its amount is
    not): the ETA comes from the rate of ``update``'s ``size`` instead, so one huge first item (a 6 MB record in the
    first batch said 196 hours for 8 s of work) does not skew it. Each line ends with the peak memory, or
    ``note()`` when given.
    """

    def __init__(self, total: int | None, desc: str, unit: str = "documents", rate_unit: str = "docs",
                 bar: bool = True, total_work: int | None = None, work_unit: str = "tokens", note=None,
                 silent: bool = False, scale: int = 1, total_size: int | None = None):
        self.total_size, self.size = total_size, 0
        self.total, self.desc, self.unit, self.rate_unit = total, desc, unit, rate_unit
        self.scale = scale  # counts are shown divided by this (e.g. bytes as MB)
        self.total_work, self.work_unit = total_work, work_unit
        self.done = self.work = 0
        self.note = note
        self.started = time.monotonic()
        self.last_line = None
        self.interval = progress_log_seconds()
        self.silent = silent  # e.g. torchrun ranks other than 0: no bar, no lines
        self._bar = None
        if bar and not silent and sys.stderr.isatty():
            from tqdm.auto import tqdm

            bytes_like = scale > 1
            self._bar = tqdm(total=total, desc=desc, unit="B" if bytes_like else rate_unit.rstrip("s") or "it",
                             unit_scale=bytes_like, unit_divisor=1000, leave=False)

    def set_total(self, total: int) -> None:
        """The total, once known (after the loop started, e.g. the rows of files whose metadata was read)."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def update(self, n: int, work: int = 0, size: int = 0) -> None:
        self.done += n
        self.work += work
        self.size += size
        if self._bar is not None:
            self._bar.update(n)
            extra = [f"{self.work:,} {self.work_unit}"] if self.work else []
            self._bar.set_postfix_str(", ".join(extra + ([self.note()] if self.note else [])), refresh=False)
        elif not self.silent and (self.last_line is None or time.monotonic() - self.last_line >= self.interval):
            self.last_line = time.monotonic()
            log.info("%s", self.line())

    def line(self) -> str:
        """``desc: done of total unit (pct), rate, [work rate,] ETA[; note]``."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        done, total = self.done / self.scale, (self.total or 0) / self.scale
        digits = _decimals(max(done, total)) if self.scale > 1 else 0
        # A rank's byte range ends inside its last record, which it reads whole: at most 100% is said.
        percent = min(100.0, 100 * self.done / self.total) if self.total else None
        parts = [f"{self.desc}: {done:,.{digits}f}" + (f" of {total:,.{digits}f}" if self.total else "") + f" {self.unit}"
                 + (f" ({percent:.0f}%)" if percent is not None else ""),
                 f"{done / elapsed:,.1f} {self.rate_unit}/s"]
        if self.work:
            parts.append(f"{self.work / elapsed:,.0f} {self.work_unit}/s")
        remaining, rate = None, None
        if self.total_size:
            remaining, rate = self.total_size - self.size, self.size / elapsed
        elif self.total_work:
            remaining, rate = self.total_work - self.work, self.work / elapsed
        elif self.total:
            remaining, rate = self.total - self.done, self.done / elapsed
        if remaining is not None:
            parts.append(f"ETA {_clock(remaining / rate)}" if rate > 0 else "ETA ?")
        return ", ".join(parts) + ", " + (self.note() if self.note else memory_text())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_) -> None:
        self.close()


def _decimals(largest: float) -> int:
    """Decimals for figures in a scaled unit (MB) up to ``largest``: its first two digits ("0 of 0 MB", or "0.0 of
    0.0 MB" for a 30 KB file, said nothing), none from 10 on, at most 6 (a file of a few bytes)."""
    if largest >= 10:
        return 0
    return min(6, 1 - math.floor(math.log10(largest))) if largest > 0 else 1


@contextlib.contextmanager
def heartbeat(what: str) -> Iterator[None]:
    """Log "still WHAT" every ``progress_log_seconds()`` while a step that reports nothing itself runs.

    For library calls with no progress hook (a UMAP fit takes minutes on a busy machine): a log
    file shows the run is alive rather than minutes of silence.
    """
    import threading

    interval, started, stop = progress_log_seconds(), time.monotonic(), threading.Event()

    def beat() -> None:
        while interval > 0 and not stop.wait(interval):
            log.info("%s: still running after %s, %s", what, _clock(time.monotonic() - started), memory_text())

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def prefetched(items, depth: int = 2):
    """``items`` produced ``depth`` ahead by a background thread (reading and parsing the next batches
    while the caller works on this one). What the producer raises is raised here, at the item where it
    happened; closing the generator stops the producer."""
    import queue
    import threading

    handoff, stop, done = queue.Queue(depth), threading.Event(), object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        handoff.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
            handoff.put((done, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            handoff.put((done, exc))

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = handoff.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()


class Behind:
    """Runs jobs in submission order on one background thread while the caller goes on, at most
    ``depth`` of them unfinished (``submit`` waits for room): the caller's next steps overlap them,
    and with ``depth`` > 1 a slow job does not stall the caller at once (embedding: with one, the
    tokenizer waited for the pooling of the batch before ~8% of the time). A job's error stops the
    jobs after it and is raised by the next ``submit`` or ``wait``."""

    def __init__(self, name: str, depth: int = 1):
        import threading

        self._name, self._threading = name, threading
        self._room = threading.BoundedSemaphore(depth)
        self._jobs: list = []
        self._wake = threading.Condition()
        self._thread = None
        self._error = None
        self._unfinished = 0

    def submit(self, job, *args) -> None:
        self._raise_error()
        self._room.acquire()
        with self._wake:
            self._jobs.append((job, args))
            self._unfinished += 1
            self._wake.notify_all()
        if self._thread is None:
            self._thread = self._threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._jobs:
                    self._wake.wait()
                job, args = self._jobs.pop(0)
            if job is None:
                return
            if self._error is None:  # after a failed job, the rest are dropped
                try:
                    job(*args)
                except BaseException as exc:  # noqa: BLE001 - raised by the next submit or wait
                    self._error = exc
            with self._wake:
                self._unfinished -= 1
                self._wake.notify_all()
            self._room.release()

    def wait(self, raise_error: bool = True) -> None:
        """Wait for every job submitted (the thread ends; a later submit starts another)."""
        if self._thread is not None:
            with self._wake:
                while self._unfinished:
                    self._wake.wait()
                self._jobs.append((None, ()))
                self._wake.notify_all()
            self._thread.join()
            self._thread = None
        if raise_error:
            self._raise_error()
        else:
            self._error = None

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


def memory_text(device=None) -> str:
    """Peak memory so far: the GPU's on a CUDA device, else this process's resident set."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        return f"peak GPU {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
    return f"peak RSS {peak_rss_mb() / 1024:.1f} GiB"


class StageTimer:
    """Times named stages, logs each one's wall time and keeps them for the metadata; a stage that starts
    or ends after Ctrl-C raises KeyboardInterrupt (``interrupts.stop_if_interrupted``)."""

    def __init__(self) -> None:
        import threading

        self.seconds: dict[str, float] = {}
        # CPU time: comparable on a busy machine. This process's, except for stages run side by side
        # (``side_by_side``): their thread's own, since the process's counts the other stages' too.
        self.cpu_seconds: dict[str, float] = {}
        self.peak_rss_mb: dict[str, float] = {}
        self.beside: set[str] = set()  # stages that ran side by side with others
        self._thread = threading.local()
        self.created = time.perf_counter()

    def finished_line(self) -> str:
        """The run's last log line: its wall time since this timer was made, and its peak memory."""
        return f"Done in {_clock(time.perf_counter() - self.created)} (h:mm:ss), {memory_text()}"

    @contextlib.contextmanager
    def stage(self, said: str, key: str | None = None) -> Iterator[None]:
        """Time a stage, logged as ``said``, recorded under ``key`` (``said`` when None; a key without the run's
        paths reads the same in every run's metadata)."""
        name = key or said
        stop_if_interrupted()
        log.info("%s ...", said)
        if "numba" in sys.modules:  # its kernels may compile in this stage (importing numba here costs 0.3 s)
            notice_compiling()
        beside = getattr(self._thread, "beside", False)
        cpu_clock = time.thread_time if beside else time.process_time
        started, cpu_started = time.perf_counter(), cpu_clock()
        compiling_before = compile_seconds()
        yield
        stop_if_interrupted()
        elapsed, cpu = time.perf_counter() - started, cpu_clock() - cpu_started
        compiling = compile_seconds() - compiling_before
        self.seconds[name] = round(self.seconds.get(name, 0.0) + elapsed, 3)
        self.cpu_seconds[name] = round(self.cpu_seconds.get(name, 0.0) + cpu, 3)
        self.peak_rss_mb[name] = peak_rss_mb()
        if beside:
            self.beside.add(name)
        # First runs only: numba compiling the package's kernels (cached afterwards) can be most of a stage.
        # (Not for stages beside others: the compile time is the process's, and may be another stage's.)
        compiled = (f"; {compiling:.1f} s of it compiling the package's numba kernels, first run only"
                    if compiling >= 0.5 and not beside else "")
        log.info("%s done in %.1f s (%.1f CPU-s%s; peak memory so far %.0f MB%s)", said, elapsed, cpu,
                 " in its thread, beside other stages" if beside else "", self.peak_rss_mb[name], compiled)
        release_free_memory()

    @contextlib.contextmanager
    def side_by_side(self) -> Iterator[None]:
        """Stages timed in this thread run beside others (see ``stage``)."""
        self._thread.beside = True
        try:
            yield
        finally:
            self._thread.beside = False


def side_by_side(timer: StageTimer, *jobs: tuple) -> None:
    """Run ``jobs`` (each ``(function, *args)``) at once, one thread each, and wait for all of them.

    The first error raised in any job is raised here as soon as it happens; the threads are daemons,
    so that error, or Ctrl-C, ends the run without waiting for the other jobs (what they leave
    half-written are atomic writes' temp files, swept by a later run as a killed run's are)."""
    import queue
    import threading

    ended: queue.Queue = queue.Queue()

    def run(function, *args) -> None:
        try:
            with timer.side_by_side():
                function(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
            ended.put(exc)
            return
        ended.put(None)

    for job in jobs:
        threading.Thread(target=run, args=job, name=f"stage {job[0].__name__}", daemon=True).start()
    for _ in jobs:
        while True:
            try:
                error = ended.get(timeout=0.5)  # a timeout, so Ctrl-C reaches this thread promptly
                break
            except queue.Empty:
                continue
        if error is not None:
            raise error


def release_free_memory() -> None:
    """Give the heap's free pages back to the system between stages. glibc keeps freed blocks under
    its mmap threshold (which grows to 32 MB as large arrays are freed) inside the heap: per-document
    arrays of a few million entries freed by one stage still counted as this process's memory in the
    next. A no-op where the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20) if sys.platform == "darwin" else peak / 1024, 1)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one, e.g. under taskset or Slurm)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_device(device: str, gpu: int) -> str:
    """'auto' -> 'cuda:GPU' when CUDA is available, else 'cpu'; 'cuda' uses --gpu's index.

    A name, not a torch.device: a CPU run needs no torch (its import costs about a second), and
    where the machine has no GPU driver at all, 'auto' is settled without it.
    """
    if device == "cpu" or (device == "auto" and not _gpu_driver_present()):
        return "cpu"
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
        return f"cuda:{index}"
    if device != "cpu":
        raise UserError(f"--device {device}: expected auto, cpu, cuda or cuda:N")
    return device


def _gpu_driver_present() -> bool:
    """False only where torch could not see a GPU either: Linux without an NVIDIA or ROCm driver's
    files (also none of WSL's), or macOS. Elsewhere, or once torch is imported, ask torch."""
    if "torch" in sys.modules:
        return True
    if sys.platform == "darwin":
        return False
    if not sys.platform.startswith("linux"):
        return True
    markers = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
    return any(os.path.exists(path) for path in markers)


def start(device: str, gpu: int):
    """The device this process computes on ('cpu' or 'cuda:N'), and its torchrun context (trivial
    without torchrun).

    Under torchrun every process joins the process group (NCCL on GPUs, gloo on CPUs) and takes
    its local GPU.
    """
    resolved = resolve_device(device, gpu)
    ctx = distributed.init_from_env(resolved.startswith("cuda"))
    if ctx.active and resolved.startswith("cuda"):
        resolved = resolve_device(f"cuda:{ctx.local_rank}", ctx.local_rank)
    return resolved, ctx


class CompileNotice:
    """Says once, in the log, that the package's numba kernels are being compiled: the first run after
    installing or upgrading spends up to a minute there with nothing else to show (later runs load them
    from numba's cache, which sends no such event). Listens to numba's ``numba:compile`` events."""

    def __init__(self) -> None:
        import numba.core.event as numba_events

        class _Listener(numba_events.Listener):
            def on_start(listener, event) -> None:
                module = event.data["dispatcher"].py_func.__module__
                if self.depth == 0:
                    self.started = time.perf_counter()
                    # Only ours are timed: they are cached on disk, so "first run only" holds (some other
                    # packages' kernels, UMAP's nearest-neighbour search among them, compile in every run).
                    self.timing = self._ours(module)
                self.depth += 1
                self.on_compile(module)

            def on_end(listener, event) -> None:
                self.depth -= 1
                if self.depth == 0 and self.timing:
                    self.seconds += time.perf_counter() - self.started

        self.listener = _Listener()
        self.said = False
        self.depth = 0  # compiles nest (a kernel compiles the kernels it calls): time the outermost
        self.started = 0.0
        self.timing = False
        self.seconds = 0.0  # spent compiling this package's kernels, outermost compiles summed

    @staticmethod
    def _ours(module: str) -> bool:
        return module.split(".")[0] == __name__.split(".")[0]

    def on_compile(self, module: str) -> None:
        if not self.said and self._ours(module):
            self.said = True
            log.info("Compiling the package's numba kernels this run uses (each once after installing or "
                     "upgrading, the first time a run needs it; cached for later runs; up to a minute)")

    def install(self) -> CompileNotice:
        import numba.core.event as numba_events

        numba_events.register("numba:compile", self.listener)
        return self

    def remove(self) -> None:
        import numba.core.event as numba_events

        numba_events.unregister("numba:compile", self.listener)


@functools.cache
def notice_compiling() -> CompileNotice:
    """Install the process's one ``CompileNotice`` (the first stage timed after numba was imported does)."""
    return CompileNotice().install()


def compile_seconds() -> float:
    """Seconds numba has spent compiling in this process since ``notice_compiling`` (0 before)."""
    return notice_compiling.cache_info().currsize and notice_compiling().seconds
