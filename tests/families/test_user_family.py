"""A family of the user's own (examples/mykernels/axpy.py) works exactly as a built-in one, without
a GPU: found by its namespaced name (import or entry point), every point renders and compiles
with nvcc, a replay-backed tune stores it under its own name, the dispatcher's chain and the CLI
see it, and it exports with its self-test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tuning_db import TuningDB

from autogen.cli.main import main
from autogen.core.registry import all_families, get_family
from autogen.core.render import render
from autogen.testing.replay import RECORDING_FORMAT, ReplayBackend
from autogen.search.tuner import TuneOptions, Tuner
from autogen.gpu.evaluator import WorkSpec
from dbfixtures import H100
from nvcc_tools import ARCHS, nvcc_compile, nvcc_or_skip

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))  # as `pip install ./examples` or PYTHONPATH=examples would

AXPY = get_family("mykernels.axpy")  # imported on demand by its dotted name
PROBLEM = AXPY.problem(n=1_000_003)


def synthetic_recording() -> dict:
    """TEST AID: timings made up from the parameters (wider vectors and more items faster), so
    that the search has something to rank. Never a reported figure: plumbing only."""
    trials = {}
    for config in AXPY.space.enumerate():
        time_us = 400.0 / (config["vector_width"] * config["items_per_thread"]) + config["block_size"] / 100
        trials[AXPY.kernel_name("float32", config)] = {"status": "ok", "reason": "", "error": 1e-8,
                                                      "samples_us": [time_us, time_us * 1.001, time_us * 0.999]}
    return {"format": RECORDING_FORMAT, "device": H100.__dict__, "peer": {"name": "cupy multiply + add",
                                                                           "time_us": 250.0},
            "problem": {"family": AXPY.name, "dtype": "float32", "shape_key": PROBLEM.shape_key}, "trials": trials}


def test_the_family_is_namespaced_and_found_by_its_module():
    assert AXPY.name == "mykernels.axpy" and AXPY.symbol == "mykernels_axpy"
    assert AXPY.module == "mykernels.axpy" and "mykernels.axpy" in all_families()
    assert WorkSpec.of(PROBLEM).family_module == "mykernels.axpy"  # the GPU worker re-imports it there
    assert AXPY.template_dirs()[0] == EXAMPLES / "mykernels"


def test_the_example_is_one_module_and_one_template_under_200_lines():
    lines = sum(len((EXAMPLES / "mykernels" / name).read_text().splitlines()) for name in ("axpy.py", "axpy.cu.j2"))
    assert lines < 200


def test_every_point_renders_and_compiles_with_nvcc(tmp_path):
    sources = [render(AXPY, "float32", config) for config in AXPY.space.enumerate()]
    assert len(sources) == AXPY.space.size() == 27
    for arch in ARCHS:
        report = nvcc_compile(sources, arch, tmp_path)
        assert report.count("Compiling entry function") == 27 and "spill stores" in report


def test_reference_and_inputs(tmp_path):
    import numpy as np

    inputs = AXPY.make_inputs(AXPY.problem(n=37), np, np.random.default_rng(0), {"alpha": 1.5})
    assert np.isnan(inputs["out"]).all()
    expected = AXPY.reference(AXPY.problem(n=37), inputs)
    assert np.allclose(expected, 1.5 * inputs["x"] + inputs["y"])


def tune_with_replay(db_url, trials=12):
    backend = ReplayBackend(synthetic_recording())
    tuner = Tuner(PROBLEM, TuneOptions(db_url=db_url, workers=1, trials=trials), progress=lambda _line: None,
                  backend_factory=lambda *_args: backend)
    return tuner.run(), backend


def test_a_replay_backed_tune_stores_results_under_the_namespaced_name(db_url):
    result, backend = tune_with_replay(db_url)
    assert result.measured == 12 and result.winner is not None
    stored = TuningDB(db_url).trials(result.device, "mykernels.axpy", "float32", PROBLEM.shape_key)
    assert len(stored) == 12 and all(t.kernel_name.startswith("mykernels_axpy_f32_") for t in stored)
    assert backend.evaluator.evaluated[0] == AXPY.kernel_name("float32", AXPY.default_config())


def test_the_dispatcher_chain_serves_the_tuned_user_kernel(db_url, monkeypatch):
    from autogen.catalog import pretuned
    from autogen.runtime.dispatch import Dispatcher

    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    result, _ = tune_with_replay(db_url)
    dispatcher = Dispatcher(db_url)
    served, winner = next(dispatcher._candidates(AXPY, PROBLEM, H100, False))
    assert served == "exact" and winner.trial.kernel_name == result.winner.trial.kernel_name
    steps = [step for step, _ in dispatcher._candidates(AXPY, AXPY.problem(n=4096), H100, False)]
    assert steps == ["nearest", "default"]
    pretuned.pretuned_db.cache_clear()


def test_the_cli_lists_shows_and_exports_it(db_url, tmp_path, capsys):
    tune_with_replay(db_url)
    assert main(["list", "--family", "mykernels.axpy", "--db", db_url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["family"] for r in rows] == ["mykernels.axpy"]
    assert main(["show", "mykernels.axpy", "--n", str(PROBLEM["n"]), "--db", db_url, "--gpu", H100.name,
                 "--json"]) == 0
    assert "mykernels_axpy_f32_" in json.loads(capsys.readouterr().out)["source"]
    out = tmp_path / "export"
    assert main(["export", "mykernels.axpy", "--out", str(out), "--gpu", H100.name, "--db", db_url,
                 "--self-test"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == [".autogen-export.json", "CMakeLists.txt", "Makefile",
                                                     "autogen_mykernels_axpy.cu",
                                                     "autogen_mykernels_axpy.h",
                                                     "autogen_mykernels_axpy_selftest.cu",
                                                     "autogen_mykernels_axpy_selftest.data"]
    nvcc = nvcc_or_skip()
    for target in ("all", "selftest"):
        done = subprocess.run(["make", "-C", str(out), target, f"NVCC={nvcc}", "ARCH=sm_90"], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr[-3000:]


def test_help_of_a_user_family_shows_its_dims(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "mykernels.axpy", "--help"])
    text = capsys.readouterr().out
    assert "--n N,N..." in text and "--m" not in text


def test_an_installed_package_is_found_through_its_entry_point(tmp_path):
    # A package installed elsewhere: a dist-info whose entry point names the module.
    info = tmp_path / "autogen_mykernels-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: autogen-mykernels\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[autogen.families]\nmykernels.axpy = mykernels.axpy\n")
    code = "from autogen.family import all_families; print(' '.join(all_families()))"
    paths = [str(tmp_path), str(EXAMPLES), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "mykernels.axpy" in done.stdout.split()
    # The CLI's family list comes from the same place.
    done = subprocess.run([sys.executable, "-m", "autogen", "tune", "--help"], capture_output=True, text=True,
                          env=env, timeout=60, cwd=tmp_path)
    assert "mykernels.axpy" in done.stdout
