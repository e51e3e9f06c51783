"""scripts/sim_scale_out.py without a database: the problems it takes and the synthetic recording
it makes for a family other than the replayed one (whose made-up times only keep a simulated
search busy: the simulation measures throughput)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autogen.core.registry import get_family
from autogen.testing.replay import ReplayEvaluator, load

SCRIPT = Path(__file__).resolve().parent.parent.parent / "scripts" / "sim_scale_out.py"


def _script():
    spec = importlib.util.spec_from_file_location("sim_scale_out", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_problem_is_family_dtype_and_dims():
    sim = _script()
    spec = sim.parse_problem("transpose:float16:rows=4099,cols=3001")
    assert spec == {"family": "transpose", "dtype": "float16", "dims": {"rows": 4099, "cols": 3001}}
    problem = sim.make_problem(spec)
    assert (problem.family, problem.dtype, problem["rows"]) == ("transpose", "float16", 4099)
    assert sim.make_problem(sim.parse_problem(sim.DEFAULT_PROBLEM)).shape_key == "m=4096,n=16"


def test_the_synthetic_recording_holds_every_point_the_search_would_measure(tmp_path):
    sim = _script()
    spec = sim.parse_problem("transpose:float32:rows=4099,cols=3001")
    recording = load(sim.synthetic_recording(spec, tmp_path / "recording.json"))
    family, problem = get_family("transpose"), sim.make_problem(spec)
    wanted = {family.kernel_name(problem.dtype, c, problem.traits) for c in family.space.enumerate()
              if not family.reject_reason(problem, c)}
    assert set(recording["trials"]) == wanted and wanted
    assert recording["problem"]["shape_key"] == problem.shape_key
    assert recording["device"] == load(sim.RECORDING)["device"]  # the replayed GPU's identity
    name = sorted(wanted)[0]
    outcome = ReplayEvaluator(recording).evaluate(name, name.encode(), {})
    assert outcome.status == "ok" and 5.0 <= min(outcome.samples_us) <= 25.1
    again = load(sim.synthetic_recording(spec, tmp_path / "again.json"))
    assert again["trials"][name] == recording["trials"][name]  # the same times every time
