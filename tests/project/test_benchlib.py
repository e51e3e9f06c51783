"""scripts/benchlib.py without a GPU: results files named by family and GPU, the time budget of
the searches, interleaved medians, the torch graph's size, the tables, the tune-and-summarise loop
on recorded timings (ReplayBackend), and every script importable."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from autogen.report import render_table

SCRIPTS = Path(__file__).resolve().parent.parent.parent / "scripts"
if str(SCRIPTS) not in sys.path:  # as `python scripts/bench_x.py` has it
    sys.path.append(str(SCRIPTS))

import benchlib  # noqa: E402

ASSET = Path(__file__).parent.parent / "assets" / "replay_sgemv_8192x16.json"


@pytest.mark.parametrize("device, short", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("Tesla V100-SXM2-16GB", "v100"), ("NVIDIA L40S", "l40s"),
    ("", "unknown_gpu"), (None, "unknown_gpu")])
def test_the_gpu_short_name_is_the_model(device, short):
    assert benchlib.gpu_short_name(device) == short


def test_results_are_written_whole_as_family_and_gpu(tmp_path):
    path = benchlib.write_results(tmp_path, "hgemv", "NVIDIA H100 80GB HBM3", {"problems": [1]})
    assert path == tmp_path / "hgemv_h100.json" == benchlib.results_path(tmp_path, "hgemv", "NVIDIA H100 80GB HBM3")
    benchlib.write_results(tmp_path, "hgemv", "NVIDIA H100 80GB HBM3", {"problems": [1, 2], "wall_s": 3.0})
    assert json.loads(path.read_text()) == {"gpu": "NVIDIA H100 80GB HBM3", "problems": [1, 2], "wall_s": 3.0}
    assert [p.name for p in tmp_path.iterdir()] == ["hgemv_h100.json"]  # no temporary left beside it


def test_searches_share_the_budget_by_weight_less_the_fixed_cost():
    budget = benchlib.Budget(total_s=100.0, fixed_s=4.0, at_least_s=3.0)
    assert budget.search_s(0.0, [1.0] * 4) == 21.0  # 100 / 4 - 4
    assert budget.search_s(60.0, [1.0, 1.0]) == 16.0  # (100 - 60) / 2 - 4
    assert budget.search_s(99.0, [1.0, 1.0]) == 3.0  # late: the least a search gets
    weighted = benchlib.Budget(total_s=100.0, fixed_s=4.0, at_least_s=4.0, reserve_s=20.0)
    assert weighted.search_s(0.0, [4.0, 2.0, 1.0, 1.0]) == 36.0  # (100 - 20) * 4 / 8 - 4
    capped = benchlib.Budget(total_s=100.0, timeout_s=10.0)
    assert capped.search_s(0.0, [1.0]) == 10.0
    assert benchlib.Budget(timeout_s=7.0).search_s(50.0, [1.0]) == 7.0
    assert benchlib.Budget().search_s(50.0, [1.0]) is None


def test_a_budget_too_small_for_its_problems_says_so():
    # 20 problems at 3 + 10 s each and 40 s kept: 300 s needed, so 100 s is short (session 18's
    # H200 scan run measured nothing for 10 of its problems); 300 s, or no budget, is not.
    budget = benchlib.Budget(total_s=100.0, fixed_s=3.0, at_least_s=10.0, reserve_s=40.0)
    assert "a budget of 100 s is short for 20 problems" in budget.shortfall(20)
    assert "300 s in all" in budget.shortfall(20)
    assert benchlib.Budget(total_s=300.0, fixed_s=3.0, at_least_s=10.0, reserve_s=40.0).shortfall(20) is None
    assert benchlib.Budget(timeout_s=5.0).shortfall(20) is None


def test_interleaved_medians_alternate_the_order_and_give_median_and_spread():
    order = []

    def sampler(label, values):
        values = iter(values)

        def one():
            order.append(label)
            return next(values)
        return one

    medians = benchlib.interleaved_medians({"a": sampler("a", [5.0, 1.0, 3.0]), "b": sampler("b", [2.0, 2.0, 8.0])}, 3)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert medians == {"a": (3.0, 4.0), "b": (2.0, 6.0)}


def test_a_torch_graph_holds_whole_passes_over_the_sets_of_about_the_target_time():
    assert benchlib.graph_calls(3, 10.0) == 201  # 2000 us / 10 us = 200, up to a multiple of 3
    assert benchlib.graph_calls(3, 0.001) == benchlib.MAX_CALLS + 1  # capped, then whole passes
    assert benchlib.graph_calls(5, 5000.0) == 5  # a long call: one pass over the sets


def test_torch_functions_are_checked_timed_and_a_failure_reported(monkeypatch):
    class Cuda:  # the calls time_torch_functions makes on torch.cuda after timing
        synchronize = empty_cache = staticmethod(lambda: None)

    torch = type("torch", (), {"cuda": Cuda})
    captured = []
    monkeypatch.setattr(benchlib, "torch_graph", lambda torch, call, sets: (captured.append(call(sets - 1)), 4))
    monkeypatch.setattr(benchlib, "torch_graph_medians",
                        lambda torch, graphs, rounds: {label: (10.0 + len(label), 0.5) for label in graphs})

    def check(label, fn):
        if label == "broken":
            raise RuntimeError("no kernel image\nmore")
        return fn(1) * 1e-7

    functions = {"ours": lambda t: t, "peer": lambda t: 2 * t, "broken": lambda t: t, "absent": None}
    result = benchlib.time_torch_functions(torch, functions, [1, 2, 3], check, rounds=3)
    assert result["ours"]["time_us"] == 14.0 and result["ours"]["error"] == 1e-7
    assert result["peer"]["spread_us"] == 0.5 and result["peer"]["error"] == 2e-7
    assert result["broken"] == {"failed": "RuntimeError: no kernel image"}
    assert "absent" not in result and captured == [3, 6]  # each captured over the last of 3 sets too


def test_render_table_aligns_columns_and_leaves_a_short_rows_last_cell_uncounted():
    assert render_table([("a", "x"), ("long label", None)]) == "a           x\nlong label  -"
    text = benchlib.table(("shape", "us", "kernel"), [("16384x16", "3.125", "k1"), ("no winner: a long reason",)])
    assert text.splitlines() == ["shape     us     kernel", "16384x16  3.125  k1", "no winner: a long reason"]


def test_winner_cells_say_why_there_is_no_winner():
    cells = benchlib.winner_cells({"winner": None, "no_winner": "every variant failed"})
    assert cells == ("every variant failed",) + (None,) * (len(benchlib.WINNER_HEADER) - 1)
    summary = {"winner": {"kernel": "k", "time_us": 2.0, "peer_time_us": 3.0, "speedup_vs_peer": 1.5,
                          "gb_per_s": 1234.5, "pct_of_floor": None}}
    assert benchlib.winner_cells(summary) == ("k", "2.000", "3.000", "1.50", "1234", None)


@pytest.mark.skipif(not ASSET.exists(), reason="recording not present")
def test_tune_each_summarises_each_problem_tuned_on_recorded_timings(monkeypatch, db_url):
    from autogen.catalog import pretuned
    from autogen.search import tuner
    from autogen.core.registry import get_family
    from autogen.testing.replay import ReplayBackend, load

    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    recording = load(ASSET)
    given = []

    def replayed(problem, options, progress=None):
        given.append(options)
        backend = ReplayBackend(recording)
        return tuner.Tuner(problem, options, lambda _line: None, backend_factory=lambda *_args: backend).run()

    monkeypatch.setattr(tuner, "tune", replayed)
    problem = get_family("sgemv").problem(m=8192, n=16)
    [(tuned, result, summary)] = benchlib.tune_each(
        [problem], lambda _p: {"trials": 6, "db_url": db_url, "workers": 1}, benchlib.Budget(timeout_s=50.0))
    pretuned.pretuned_db.cache_clear()
    assert tuned is problem and given[0].timeout_s == 50.0 and given[0].trials == 6
    winner = summary["winner"]
    assert summary["gpu"] == recording["device"]["name"] == result.device.name
    assert winner["peer"] == recording["peer"]["name"] and winner["peer_time_us"] > 0
    assert winner["speedup_vs_peer"] == round(winner["peer_time_us"] / winner["time_us"], 3)
    assert winner["pct_of_floor"] is not None and summary["bench_wall_s"] >= 0


def test_every_script_imports_without_a_gpu(monkeypatch):
    for path in sorted(SCRIPTS.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)  # as an import has it (dataclasses look there)
        try:
            spec.loader.exec_module(module)
        except ModuleNotFoundError as exc:  # a script for the PyTorch door, where torch is missing
            if (exc.name or "").split(".")[0] != "torch":
                raise
            continue
        assert path.stem == "benchlib" or callable(getattr(module, "main", None)), path.name
