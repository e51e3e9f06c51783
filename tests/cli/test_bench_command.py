"""`autogen bench` end to end on the CPU: the GPU side replaced by the replay test aid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tuning_db import TuningDB

from autogen.cli.main import main
from autogen.core.registry import get_family
from autogen.testing.replay import ReplayEvaluator, load

RECORDING = load(Path(__file__).parent.parent / "assets" / "replay_sgemv_8192x16.json")
SGEMV = get_family("sgemv")


class ReplayIsolatedEvaluator(ReplayEvaluator):
    """Stands where autogen.gpu.worker.IsolatedEvaluator stands; answers from the recording."""

    def __init__(self, spec, timeout_s: float = 60.0):
        super().__init__(RECORDING)
        from tuning_db.records import DeviceIdentity
        self.device = DeviceIdentity(**RECORDING["device"])

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


@pytest.fixture
def replayed_gpu(monkeypatch):
    import autogen.gpu.compile
    import autogen.gpu.device
    import autogen.gpu.worker
    import autogen.cli.commands

    monkeypatch.setattr(autogen.gpu.worker, "IsolatedEvaluator", ReplayIsolatedEvaluator)
    monkeypatch.setattr(autogen.gpu.device, "require_cupy", lambda: None)
    monkeypatch.setattr(autogen.cli.commands, "compile_cubin", lambda source, arch, **options: source.encode())


def recorded_config():
    return next(c for c in SGEMV.space.enumerate()
                if RECORDING["trials"].get(SGEMV.kernel_name("float32", c), {}).get("status") == "ok")


def test_bench_re_measures_the_stored_winner_against_the_peer(replayed_gpu, db_url, capsys):
    from dbfixtures import store_winner
    from tuning_db.records import DeviceIdentity

    device = DeviceIdentity(**RECORDING["device"])
    config = recorded_config()
    store_winner(TuningDB(db_url), device, 8192, 16, time_us=9.0, params=config.as_dict())
    assert main(["bench", "sgemv", "--m", "8192", "--n", "16", "--db", db_url, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    name = SGEMV.kernel_name("float32", config)
    samples = sorted(RECORDING["trials"][name]["samples_us"])
    assert document["kernel"] == name and document["stored_time_us"] == 9.0
    assert document["time_us"] == round(samples[len(samples) // 2], 4)
    assert document["peer"] == RECORDING["peer"]["name"]
    assert document["speedup_vs_peer"] == round(RECORDING["peer"]["time_us"] / document["time_us"], 3)
    assert main(["bench", "sgemv", "--m", "8192", "--n", "16", "--db", db_url]) == 0
    table = capsys.readouterr().out
    assert "time now" in table and "speedup" in table and "relative L2 error" in table


def test_bench_without_a_stored_winner_says_so(replayed_gpu, db_url, capsys):
    assert main(["bench", "sgemv", "--m", "8192", "--n", "16", "--db", db_url]) == 1
    assert "nothing tuned for sgemv float32 m=8192,n=16" in capsys.readouterr().err
