"""A GPU helping to search a problem that another GPU owns, in a process of its own.

Why a process and not a thread: the search loop's host work (Optuna's asks, the claims, the
stores) is Python and holds the GIL. A 1-GPU sgemv search is host-bound already, so a second
loop as a thread of the same process only splits that host time between two GPUs, and two GPUs
ran slower than one (docs/distributed.md, "a helper process per GPU"). In
a process of its own the helper's loop has its own interpreter, as a worker on another machine
has, and cooperates with the owner only through the tuning database: claims, the global trial
budget and the shared Optuna study (autogen.search.loop, autogen.search.studies).

The parent (autogen.distributed.multi_gpu) and a helper talk over one pipe:

    helper -> parent   ("progress", line)        any time; the parent prints it as [gpu N] line
                       ("ready", DeviceIdentity)  its backend is up (GPU worker, Optuna imported)
                       ("counts", SearchCounts)   its search loop is over
                       ("error", text)            it failed (after its counts, if it searched)
    parent -> helper   Go(...)                    search, from the owner's begin(); or
                       None                       stop without searching

A helper is spawned before its owner's begin() is over, so that its start-up (interpreter,
imports, GPU worker, compile pool) overlaps the owner's; it waits for Go once it is ready.

Stopping: a helper ignores SIGINT (Ctrl-C reaches the parent too, which decides). The parent
ends a helper with SIGTERM, on which its search loop gives its claims back at its next step; a
helper whose parent is gone (killed with SIGKILL) sends itself SIGTERM.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from autogen.core.problem import Problem
from autogen.gpu.worker import stop_with_parent

# How long a helper that was told to stop, or whose search is over, may take to exit (it closes
# its GPU worker and compile pool) before it is sent SIGTERM; and how long it then has before it
# is killed (its search loop stops after the variant on its GPU now).
EXIT_S = 30.0
TERMINATE_S = 5.0


@dataclass(frozen=True)
class HelpRequest:
    """What a helper process needs to search a problem on its GPU; picklable."""

    problem: Problem
    options: object  # TuneOptions (its compile workers: the helper's own pool)
    backend_factory: object  # GpuBackend, or a picklable test aid (autogen.testing.replay)
    device_index: int
    slot: int  # its index among the problem's search loops (offsets its sampler's seed)


@dataclass(frozen=True)
class Go:
    """Search: the owner's begin() found ``device`` and ``start``, ``elapsed_s`` ago (its
    timeout counts from there)."""

    device: object  # DeviceIdentity
    start: object  # autogen.search.warmstart.StartingPoint
    elapsed_s: float


# -- the parent's side ------------------------------------------------------------------------------


class HelperProcess:
    """A helper process, started at once, and what it reported; ``progress`` gets its lines.
    Used by one thread of the parent; end() may be called from another (cleanup)."""

    def __init__(self, request: HelpRequest, progress: Callable[[str], None], search: Callable):
        self.progress = progress
        self.failed = False  # it reported an error
        self.stopped = False  # told to stop: its exit is no failure
        self._exited = False
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        # Not a daemon: a daemonic process may not start the GPU worker and the compile pool.
        self.process = context.Process(target=_helper_main, args=(child_conn, request, search),
                                       name=f"autogen-helper-gpu{request.device_index}")
        try:
            self.process.start()
        finally:
            child_conn.close()  # the child's end: the pipe reads EOF once the child is gone

    def ready(self):
        """Wait until its backend is up: its GPU's DeviceIdentity; None when it failed or died."""
        return self._read_until("ready")

    def go(self, device, start, elapsed_s: float) -> None:
        self._send(Go(device, start, elapsed_s))

    def stop(self) -> None:
        self.stopped = True
        self._send(None)

    def result(self):
        """Wait until its search is over: its SearchCounts; None when it died first."""
        return self._read_until("counts")

    def close(self) -> None:
        """Read what it still says until it exits (its last lines, an error after its counts),
        then reap it."""
        self._read_until(None, timeout_s=EXIT_S)
        self.end(grace_s=TERMINATE_S)

    def end(self, grace_s: float = EXIT_S) -> None:
        """Reap the process: given ``grace_s`` to exit, then stopped with SIGTERM (its search
        loop gives its claims back), then killed."""
        process = self.process
        process.join(grace_s)
        if process.is_alive():
            process.terminate()
            process.join(TERMINATE_S)
        if process.is_alive():
            process.kill()
            process.join()

    def _send(self, message) -> None:
        try:
            self._conn.send(message)
        except OSError:
            pass  # it died: its reader reports it

    def _read_until(self, wanted: str | None, timeout_s: float | None = None):
        """Forward its lines and errors until a message of kind ``wanted`` (its value is
        returned), the end of the pipe, or ``timeout_s`` (None)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._exited:
            if deadline is not None and not self._conn.poll(max(0.0, deadline - time.monotonic())):
                return None
            try:
                kind, value = self._conn.recv()
            except (EOFError, OSError):
                self._on_exit()
                return None
            if kind == "progress":
                self.progress(value)
            elif kind == "error":
                self.failed = True
                self.progress(f"helper process failed: {value}")
            elif kind == wanted:
                return value
        return None

    def _on_exit(self) -> None:
        self._exited = True
        self.process.join(TERMINATE_S)
        code = self.process.exitcode
        if not (self.failed or self.stopped) and code != 0:
            self.progress(f"helper process died (exit code {code})")


# -- the helper's side ------------------------------------------------------------------------------


class _Parent:
    """The helper's end of the pipe; several threads of the search report through it."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, kind: str, value) -> None:
        with self.lock:
            try:
                self.conn.send((kind, value))
            except OSError:
                pass  # the parent is gone: stop_with_parent's watch stops this process

    def progress(self, line: str) -> None:
        self.send("progress", line)

    def receive(self):
        """The parent's word (a Go, or None to stop); None when the parent is gone."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None


class _Stop:
    """SIGTERM in a helper: the parent ending it (Ctrl-C, an error), or its own watch once its
    parent is gone. While it searches, the search loop is asked to stop at its next step: it
    gives its claims back, never cut midway through a database transaction (an exception raised
    there can leave a connection holding SQLite's write lock, and this process's own threads
    then wait the busy timeout out). Before, nothing is claimed: KeyboardInterrupt ends it."""

    def __init__(self):
        self.event = threading.Event()
        self.searching = False

    def __call__(self, _signum, _frame) -> None:
        if not self.searching:
            raise KeyboardInterrupt
        self.event.set()


def _helper_main(conn, request: HelpRequest, search: Callable) -> None:
    # `search(parent, request, stop)` runs the helper's part of the search (autogen.distributed.
    # multi_gpu.search_as_helper): this module is the process and its pipe, not the tuner.
    # Ctrl-C reaches the whole process group; the parent decides, and ends its helpers with
    # SIGTERM. Ignored here, SIGINT is ignored by the GPU worker and compile pool started here
    # too: none dies under a variant in flight, each is closed by this process on its way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    # The parent's stdout carries its --json document: nothing of a helper's may go there.
    os.dup2(2, 1)
    parent = _Parent(conn)
    stop_with_parent(os.getppid())  # orphaned, it stops as if the parent had ended it
    try:
        search(parent, request, stop)
    except KeyboardInterrupt:
        pass  # stopped before its search
    except BaseException as exc:
        parent.send("error", f"{type(exc).__name__}: {exc}")
        raise SystemExit(1) from None
