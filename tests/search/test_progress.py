"""A tune's progress: bars on a terminal, the plain line log elsewhere (autogen.search.progress), on the
replayed H100 recording (no GPU)."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
from tuning_db import TuningDB

from autogen.core.registry import get_family
from autogen.search.progress import ProgressOutput, TrialDone
from autogen.testing.replay import ReplayBackend, load
from autogen.search.tuner import TuneOptions, Tuner

ASSET = Path(__file__).parent.parent / "assets" / "replay_sgemv_8192x16.json"
PROBLEM = get_family("sgemv").problem(m=8192, n=16)


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr does in an interactive shell."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def recording():
    if not ASSET.exists():
        pytest.skip(f"recording {ASSET.name} not present")
    return load(ASSET)


def tune(db_url, recording, progress, trials=12):
    return Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, trials=trials), progress=progress,
                 backend_factory=lambda *_args: ReplayBackend(recording)).run()


def test_a_terminal_gets_a_bar_with_trials_best_and_times(db_url, recording):
    stream = Terminal()
    output = ProgressOutput(stream)
    assert output.bars
    result = tune(db_url, recording, output)
    output.close()
    text = stream.getvalue()
    assert "\r" in text  # the bar redrawn in place
    stored = TuningDB(db_url).trials(result.device, "sgemv", "float32", PROBLEM.shape_key)
    best = min(t.time_us for t in stored if t.status == "ok")  # the search's best, as the bar shows it
    final = text.rsplit("\r", 1)[-1]
    assert f"{PROBLEM}: 12/12 trials" in final and "best " in final
    assert "<00:00]" in final  # elapsed < remaining
    assert "tuning sgemv" in text and "wall time" in text  # the other lines, above the bar
    assert " us (best " not in text  # no line per measured trial; failed ones are written
    assert f"best {best:.2f} us" in final


def test_elsewhere_every_trial_is_a_line_as_before(db_url, recording):
    stream = io.StringIO()  # not a terminal: a pipe, a file, a CI log
    output = ProgressOutput(stream)
    assert not output.bars
    tune(db_url, recording, output)
    lines = stream.getvalue().splitlines()
    trial_lines = [line for line in lines if line.startswith("[")]
    assert len(trial_lines) == 12 and trial_lines[0].startswith("[1/12] sgemv_")
    assert all(" us (best " in line or ": FAILED " in line for line in trial_lines)
    assert "\r" not in stream.getvalue()


def test_json_keeps_the_plain_log_on_a_terminal(db_url, recording):
    stream = Terminal()
    output = ProgressOutput(stream, bars=False)  # what `autogen tune --json` asks for
    tune(db_url, recording, output)
    assert "\r" not in stream.getvalue() and "[12/12] " in stream.getvalue()


def test_one_bar_per_problem_and_failures_written_above():
    stream = Terminal()
    output = ProgressOutput(stream)
    output(TrialDone("sgemv m=1", 1, 1, 4, "k1", 2.0, 2.0, gpu=0))
    output(TrialDone("sgemv m=2", 1, 1, 4, "k2", None, None, "compile: boom", gpu=1))
    output(TrialDone("sgemv m=1", 2, 3, 4, "k3", 1.5, 1.5, gpu=0))  # a helper stored one meanwhile
    assert set(output._bars) == {"sgemv m=1", "sgemv m=2"}
    assert output._bars["sgemv m=1"].n == 3 and output._bars["sgemv m=2"].n == 1
    output.close()
    text = stream.getvalue()
    assert "[gpu 1] [1/4] k2: FAILED compile: boom" in text
    assert "best 1.50 us, gpu 0" in text


def test_a_trial_event_is_its_line_and_crosses_processes():
    event = TrialDone("sgemv m=1", 3, 5, 60, "k", 1.25, 1.0)
    assert event == "[3/60] k: 1.25 us (best 1.00 us)"
    again = pickle.loads(pickle.dumps(event.on_gpu(1)))
    assert again == "[gpu 1] [3/60] k: 1.25 us (best 1.00 us)" and again.stored == 5 and again.gpu == 1


def test_the_cli_shows_bars_only_without_json(monkeypatch):
    from autogen.cli import tuning
    seen = []

    def fake_tune_problems(problems, options, progress, on_result=None):
        seen.append(progress.bars)
        raise KeyboardInterrupt  # nothing to tune here: only the progress output is checked

    import autogen.distributed.multi_gpu
    monkeypatch.setattr(autogen.distributed.multi_gpu, "tune_problems", fake_tune_problems)
    monkeypatch.setattr("autogen.gpu.device.require_gpu", lambda: None)
    monkeypatch.setenv("AUTOGEN_NO_PRESTART", "1")
    monkeypatch.setattr("sys.stderr", Terminal())
    from autogen.cli.main import main
    assert main(["tune", "sgemv", "--m", "64", "--n", "16", "--json"]) == 130
    assert main(["tune", "sgemv", "--m", "64", "--n", "16"]) == 130
    assert seen == [False, True]
    assert tuning  # imported by main
