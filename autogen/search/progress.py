"""A tune's progress on stderr: one line per event, or progress bars on a terminal.

The search reports each stored trial as a TrialDone (autogen.search.loop); everything else it reports
is a line of text. `ProgressOutput` writes them:
  * plain (stderr is not a terminal, or `--json`): every event as the line it always was;
  * with bars (stderr is a terminal): one tqdm bar per problem (so one per GPU where several GPUs
    tune several problems), showing the trials stored of the budget, the best time so far, the
    elapsed and the estimated remaining time; the other lines, failed trials included, are
    written above the bars.
tqdm is imported only once a bar is needed: a tune answered from the database shows none.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import TextIO

from autogen.report import terminal_text


class TrialDone(str):
    """One trial of a search stored: the progress line it always was (a str, so a caller that
    collects lines gets that line), with where the search stands for a bar. Picklable: a GPU
    agent (autogen.distributed.gpu_agent) sends it to its parent as it is."""

    FIELDS = ("problem", "done", "stored", "budget", "kernel", "time_us", "best_us", "reason", "gpu")

    problem: str  # str(Problem): one bar per problem
    done: int  # trials this search loop measured (its line's count)
    stored: int  # trials of the problem stored, by any worker (the bar's count)
    budget: int
    kernel: str
    time_us: float | None  # None: failed
    best_us: float | None
    reason: str  # why it failed
    gpu: int | None  # the GPU whose search loop measured it, where several GPUs tune

    def __new__(cls, problem: str, done: int, stored: int, budget: int, kernel: str, time_us: float | None,
                best_us: float | None, reason: str = "", gpu: int | None = None):
        prefix = (f"[gpu {gpu}] " if gpu is not None else "") + f"[{done}/{budget}] {kernel}: "
        if time_us is None or best_us is None:
            line = prefix + f"FAILED {reason[:160]}"
        else:
            line = prefix + f"{time_us:.2f} us (best {best_us:.2f} us)"
        event = super().__new__(cls, line)
        for name, value in zip(cls.FIELDS, (problem, done, stored, budget, kernel, time_us, best_us, reason, gpu)):
            setattr(event, name, value)
        return event

    def on_gpu(self, gpu: int | None) -> "TrialDone":
        """The same event, measured on GPU ``gpu`` (its line says so)."""
        return TrialDone(*(getattr(self, name) for name in self.FIELDS[:-1]), gpu=gpu)

    def __reduce__(self):
        return TrialDone, tuple(getattr(self, name) for name in self.FIELDS)


class ProgressOutput:
    """The `progress` callable of a tune (Tuner, tune_problems): takes lines and TrialDone
    events from any thread. ``bars`` None: bars where ``stream`` is a terminal."""

    def __init__(self, stream: TextIO | None = None, bars: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.bars = _is_terminal(self.stream) if bars is None else bars
        self._bars: dict[str, object] = {}  # problem -> its tqdm bar
        self._lock = threading.RLock()

    def __call__(self, event) -> None:
        with self._lock:
            if self.bars and isinstance(event, TrialDone):
                self._advance(event)
                if event.time_us is not None:
                    return  # a failure's reason is written above the bars too
            self.write(str(event))

    def write(self, line: str) -> None:
        """One line of text, above the bars where there are any. Lines name stored kernels, GPUs
        and workers: what a database says never reaches the terminal raw."""
        line = terminal_text(line)
        with self._lock:
            if self._bars:
                from tqdm import tqdm
                tqdm.write(line, file=self.stream)
            else:
                print(line, file=self.stream, flush=True)

    @contextlib.contextmanager
    def aside(self):
        """Around output to another stream of the same terminal (a result table on stdout):
        the bars are cleared before it and drawn again after."""
        with self._lock:
            if not self._bars:
                yield
                return
            from tqdm import tqdm
            with tqdm.external_write_mode(file=self.stream):
                yield

    def finish(self, problem: str) -> None:
        """The problem's bar drawn a last time and left in place (its search is over)."""
        with self._lock:
            bar = self._bars.pop(problem, None)
            if bar is not None:
                bar.close()

    def close(self) -> None:
        with self._lock:
            for problem in list(self._bars):
                self.finish(problem)

    def _advance(self, event: TrialDone) -> None:
        bar = self._bars.get(event.problem)
        if bar is None:
            from tqdm import tqdm
            bar = self._bars[event.problem] = tqdm(
                total=event.budget, desc=event.problem, unit="trial", file=self.stream, dynamic_ncols=True,
                leave=True, bar_format="{desc}: {n_fmt}/{total_fmt} trials |{bar}|{postfix} "
                                       "[{elapsed}<{remaining}]")
        best = f"best {event.best_us:.2f} us" if event.best_us is not None else "no time yet"
        bar.set_postfix_str(best + (f", gpu {event.gpu}" if event.gpu is not None else ""), refresh=False)
        bar.update(max(0, min(event.stored, event.budget) - bar.n))


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
