"""TEST AID: a backend that replays timings recorded on a real GPU.

Like Kernel Tuner's simulation runner, it lets the search loop, resumption and storage run in CI
without a GPU: "compiling" returns the source text, and "evaluating" a variant returns the
samples recorded for its kernel name (or the failure recorded for it). It is never a default and
never the source of a reported figure; recordings are written by `record()` from a database
filled by a real tuning run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuning_db import TuningDB
from tuning_db.records import DeviceIdentity

from autogen.core.problem import Problem
from autogen.gpu.evaluator import Ceilings, Outcome
from autogen.gpu.measure import EARLY_FACTOR, sample_until

RECORDING_FORMAT = 1


def record(db: TuningDB, device: DeviceIdentity, problem: Problem, path: Path) -> int:
    """Write every trial stored for `problem` on `device` as a recording; returns the count."""
    trials = db.trials(device, problem.family, problem.dtype, problem.shape_key, "cold")
    winner = db.winner(device, problem.family, problem.dtype, problem.shape_key)
    document = {
        "format": RECORDING_FORMAT,
        "device": dataclasses.asdict(device),
        "problem": {"family": problem.family, "dtype": problem.dtype, "shape_key": problem.shape_key},
        "peer": {"name": winner.peer_name, "time_us": winner.peer_time_us} if winner else None,
        "trials": {t.kernel_name: {"status": t.status, "reason": t.reason, "samples_us": list(t.samples_us),
                                   "error": t.error} for t in trials if t.status != "rejected"},
    }
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return len(document["trials"])


MEET_TIMEOUT_S = 120.0  # how long an evaluator waits for the others of its meeting


@dataclass(frozen=True)
class Meeting:
    """Evaluators of one problem that start measuring together: each marks its arrival in
    ``folder`` at its first evaluation, then waits until ``parties`` have arrived (at most
    MEET_TIMEOUT_S). On a loaded machine one tuner process (or helper process) may start seconds
    after the others, which would otherwise have measured the whole budget before it began: a
    test of how several tuners share a problem then depends on how busy the machine is."""

    folder: str
    parties: int

    def attend(self, problem_mark: str) -> float:
        """Wait for the others; returns the seconds waited."""
        began = time.monotonic()
        folder = Path(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{problem_mark}.{os.getpid()}.{time.monotonic_ns()}").touch()
        deadline = time.monotonic() + MEET_TIMEOUT_S
        while len(list(folder.glob(f"{problem_mark}.*"))) < self.parties and time.monotonic() < deadline:
            time.sleep(0.01)
        return time.monotonic() - began


class ReplayEvaluator:
    """Answers the calls the tuner makes of a GPU evaluator, from a recording."""

    def __init__(self, recording: dict, crash_on: frozenset[str] = frozenset(), delay_s: float = 0.0,
                 fault_after: int | None = None, meeting: tuple[Meeting, str] | None = None,
                 log: tuple[str, str] | None = None):
        self.recording = recording
        self.crash_on = crash_on  # kernel names whose evaluation kills the "worker"
        self.delay_s = delay_s  # per evaluation, so that concurrent tuners overlap as on a GPU
        self.fault_after = fault_after  # evaluations answered before evaluate raises (a lost GPU)
        self.meeting = meeting  # (the Meeting, this problem's mark): attended before the first evaluation
        self.restarts = 0
        self.met_after_s = 0.0  # the meeting's wait, within the first evaluation
        self.evaluated: list[str] = []
        self.cpu_at: list[float] = []  # the process's CPU seconds at each evaluation (simulations' cost per trial)
        # (file, problem mark): each evaluation appended as a line "mark kernel pid epoch-seconds",
        # by any process (helper processes' included)
        self.log = log
        self.retimed: list[list[str]] = []

    def evaluate(self, kernel_name: str, cubin: bytes, params: dict, best_us: float | None = None) -> Outcome:
        assert kernel_name.encode() in cubin, "the source handed over is not this variant's"
        if self.meeting is not None:
            meeting, mark = self.meeting
            self.meeting = None
            self.met_after_s = meeting.attend(mark)
        if self.fault_after is not None and len(self.evaluated) >= self.fault_after:
            raise RuntimeError(f"replayed GPU fault after {self.fault_after} evaluations")
        self.evaluated.append(kernel_name)
        self.cpu_at.append(time.process_time())
        if self.log is not None:
            with open(self.log[0], "a") as log:  # one short write per line: processes' lines never mix
                log.write(f"{self.log[1]} {kernel_name} {os.getpid()} {time.time():.3f}\n")
        if self.delay_s:
            time.sleep(self.delay_s)
        if kernel_name in self.crash_on:
            self.restarts += 1
            return Outcome(kernel_name, "failed", "GPU worker died in evaluate (exit code -9)")
        entry = self.recording["trials"].get(kernel_name)
        if entry is None:
            return Outcome(kernel_name, "failed", "not in the recording")
        if entry["status"] != "ok":
            return Outcome(kernel_name, "failed", entry["reason"] or "failed when recorded")
        samples = iter(entry["samples_us"])
        kept = sample_until(lambda: next(samples), len(entry["samples_us"]),
                            EARLY_FACTOR * best_us if best_us else None)
        return Outcome(kernel_name, "ok", "", entry["error"], kept)

    def time_peer(self) -> tuple[str, tuple[float, ...]] | None:
        peer = self.recording.get("peer")
        return (peer["name"], (peer["time_us"],) * 3) if peer and peer["time_us"] else None

    def retime(self, candidates, rounds: int, timeout_s: float | None = None) -> dict[str, tuple[float, ...]]:
        self.retimed.append([name for name, _cubin, _params in candidates])
        return {name: tuple(self.recording["trials"][name]["samples_us"][:rounds])
                for name, _cubin, _params in candidates}

    def ceilings(self) -> Ceilings:
        # Not measured: a test aid's roofline is a fixed, clearly fake pair, never reported.
        return Ceilings(copy_gbs=3000.0, fp32_tflops=60.0)


class ReplayBackend:
    """Drop-in for autogen.gpu.backend.GpuBackend: Tuner(..., backend_factory=ReplayBackend.factory(doc))."""

    def __init__(self, recording: dict, crash_on: frozenset[str] = frozenset(), delay_s: float = 0.0,
                 device_index: int | None = None, fault_after: int | None = None,
                 meeting: tuple[Meeting, str] | None = None, log: tuple[str, str] | None = None):
        if recording.get("format") != RECORDING_FORMAT:
            raise ValueError(f"unsupported recording format {recording.get('format')!r}")
        self.device = DeviceIdentity(**recording["device"])
        self.device_index = device_index  # the "GPU" it stands for (autogen.distributed.multi_gpu)
        self.free_bytes = 80 * 2**30
        self.evaluator = ReplayEvaluator(recording, crash_on, delay_s, fault_after, meeting, log)
        self.compiled: list[str] = []
        self.compiled_options: list[tuple[str, ...]] = []  # each compile's family options

    @classmethod
    def factory(cls, recording: dict, crash_on: frozenset[str] = frozenset(), delay_s: float = 0.0,
                made: list | None = None, fault_after: dict[int, int] | None = None,
                meet_in: str | Path | None = None, meet: dict[Problem, int] | None = None,
                log_to: str | Path | None = None) -> "ReplayFactory":
        """A backend_factory; every backend it makes in this process is appended to ``made``
        when given. ``fault_after``: GPU (device index) -> evaluations its evaluator answers
        before it raises, as a GPU lost mid-search. ``meet``: problem -> how many evaluators
        (tuner or helper processes, in any process) start measuring it together, meeting in the
        folder ``meet_in`` (see Meeting). ``log_to``: a file every evaluation of every backend
        it makes, in any process, appends a line to: the problem and the kernel evaluated."""
        meetings = {_mark(p.family, p.dtype, p.dims): Meeting(str(meet_in), parties)
                    for p, parties in (meet or {}).items()}
        return ReplayFactory(recording, frozenset(crash_on), delay_s, made, dict(fault_after or {}), meetings,
                             None if log_to is None else str(log_to))

    def __enter__(self) -> "ReplayBackend":
        return self

    def __exit__(self, *exc_info) -> None:
        pass

    def compile(self, source: str, arch: str, family_options: tuple[str, ...] = ()) -> concurrent.futures.Future:
        self.compiled.append(source)
        self.compiled_options.append(tuple(family_options))
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(source.encode())
        return future


@dataclass
class ReplayFactory:
    """ReplayBackend.factory's backend_factory. Picklable, so that a helper process of
    autogen.distributed.multi_gpu builds the same replaying backends on its "GPU": ``made`` (the backends
    made, for the tests to inspect) stays in the process that made them; a helper process
    starts with none, and its measurements come back as its search counts."""

    recording: dict
    crash_on: frozenset[str] = frozenset()
    delay_s: float = 0.0
    made: list | None = None
    fault_after: dict[int, int] = field(default_factory=dict)
    meetings: dict[str, Meeting] = field(default_factory=dict)  # problem mark -> its Meeting
    log_to: str | None = None  # see ReplayBackend.factory

    def __call__(self, spec, _workers, _eval_timeout_s, **_shared) -> ReplayBackend:
        device_index = getattr(spec, "device_index", None)
        mark = _mark(spec.family, spec.dtype, spec.dims)
        meeting = (self.meetings[mark], mark) if mark in self.meetings else None
        backend = ReplayBackend(self.recording, self.crash_on, self.delay_s, device_index,
                                self.fault_after.get(device_index), meeting,
                                None if self.log_to is None else (self.log_to, mark))
        if self.made is not None:
            self.made.append(backend)
        return backend

    def identity(self) -> DeviceIdentity:
        """What the tuner asks first (a search complete in the database needs no backend)."""
        return DeviceIdentity(**self.recording["device"])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "made": None}  # another process's backends are not this list's


def _mark(family: str, dtype: str, dims) -> str:
    """A problem's name in a Meeting's folder."""
    return "-".join([family, dtype] + [f"{name}{value}" for name, value in dims])


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())
