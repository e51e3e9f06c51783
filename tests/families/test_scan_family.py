"""scan on the CPU: traits, keys and the --exclusive switch, the space's constraints and pruning,
the plan of both modes, inputs and references (exact integers, wrapping int32 sums), the float
bound (exact sums, the chain allowance, a dropped element caught), a sample compiled with nvcc
for sm_90 (-Werror), the host launchers, and the CLI's help and bad input."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from autogen.core.registry import get_family
from autogen.core.render import render
from autogen.errors import UsageError
from autogen.families.scan import SPACE, bound_violation, exact_sums, scan_values
from nvcc_tools import extreme_configs, nvcc_compile

FAMILY = get_family("scan")


def config(**changes):
    return FAMILY.space.check({**FAMILY.default_params, **changes})


def test_problem_keys_and_traits():
    problem = FAMILY.problem("int32", n=2**24, scan="exclusive", acc_dtype="int64")
    assert problem.shape_key == "n=16777216,scan=exclusive,acc_dtype=int64"
    assert FAMILY.problem(n=7)["scan"] == "inclusive" and FAMILY.problem(n=7).dtype == "float32"
    with pytest.raises(UsageError, match="acc_dtype int64 is for int32"):
        FAMILY.problem("float16", n=7, acc_dtype="int64")
    assert FAMILY.kernel_name("int32", config(), (("scan", "inclusive"), ("acc_dtype", "int64"))).startswith("scan_i32_int64_")


def test_space_constraints_hold_for_every_point():
    points = list(SPACE.enumerate())
    assert {p["mode"] for p in points} == {"lookback", "reduce_scan"}
    assert {p["block_scan"] for p in points} == {"warp_shuffle", "raking"}
    for p in points:
        assert p["vector_width"] <= p["items_per_thread"] <= {1024: 8, 512: 16}.get(p["block_size"], 32)
        if p["block_scan"] == "raking":
            assert p["block_size"] * p["items_per_thread"] // p["vector_width"] <= 4096
    assert SPACE.violations({**FAMILY.default_params, "vector_width": 8, "items_per_thread": 4})


def test_pruning_by_dtype_and_shape():
    big = FAMILY.problem("float32", n=2**24)
    assert FAMILY.reject_reason(big, config(vector_width=8)) is None  # two 16-byte loads
    assert FAMILY.reject_reason(FAMILY.problem("float16", n=2**24), config(vector_width=8)) is None
    wide = FAMILY.problem("int32", n=2**24, acc_dtype="int64")
    assert "spills" in FAMILY.reject_reason(wide, config(items_per_thread=32))
    assert "twice" in FAMILY.reject_reason(FAMILY.problem(n=100), config())
    seeds = FAMILY.seed_configs(FAMILY.problem("bfloat16", n=2**28))
    assert seeds[0] == FAMILY.default_config() and any(s["vector_width"] == 8 for s in seeds)


def test_plans_and_workspace():
    problem = FAMILY.problem("int32", n=1_000_003, scan="exclusive")
    look = FAMILY.plan(problem, config())
    assert [s.suffix for s in look] == ["_init", ""]
    assert look[1].launch.grid[0] == -(-1_000_003 // 4096)
    two = FAMILY.plan(problem, config(mode="reduce_scan"))
    assert [s.suffix for s in two] == ["_reduce", "_scan", ""]
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(0), {"values": "small"})
    assert look[1].args(inputs)[3] == 1  # exclusive reaches the kernel
    status_words, _sums = FAMILY.workspace_sizes(problem)
    assert status_words >= look[1].launch.grid[0]
    inputs["status"] = inputs["status"][:3]
    with pytest.raises(ValueError, match="status"):
        look[0].args(inputs)


def test_references_and_exact_integer_compare():
    rng = np.random.default_rng(1)
    problem = FAMILY.problem("int32", n=5000)
    inputs = FAMILY.make_inputs(problem, np, rng, {"values": "wide"})
    ref = FAMILY.reference(problem, inputs)
    assert ref.dtype == np.float64 and ref.min() >= -2**31 and ref.max() < 2**31  # wrapped like int32
    inputs["out"][...] = ref.astype(np.int32)
    assert exact_sums(np, inputs["out"], ref) == (0.0, "")
    inputs["out"][4000] += 1
    error, reason = exact_sums(np, inputs["out"], ref)
    assert math.isinf(error) and "at 4000" in reason
    wide = FAMILY.problem("int32", n=5000, acc_dtype="int64", scan="exclusive")
    winputs = FAMILY.make_inputs(wide, np, rng, {"values": "wide"})
    wref = FAMILY.reference(wide, winputs)
    assert wref[0] == 0 and wref[-1] == np.cumsum(winputs["x"].astype(np.int64))[-2]
    assert winputs["out"].dtype == np.int64


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_float_bound(dtype):
    from autogen.core.dtypes import round_trip, to_float64

    rng = np.random.default_rng(2)
    problem = FAMILY.problem(dtype, n=20_000)
    exact = FAMILY.make_inputs(problem, np, rng, {"values": "exact"})
    x = to_float64(np, exact["x"], dtype)
    assert np.all(x == np.round(x))  # integers: every partial sum exact in fp32
    ref, mag = FAMILY.reference(problem, exact), FAMILY.reference_magnitude(problem, exact)
    rounded = round_trip(np, ref, dtype)
    assert bound_violation(np, rounded, ref, mag, dtype) == ""
    dropped = rounded.copy()
    dropped[10_000:] -= x[10_000] if x[10_000] else 1.0  # one element lost: every later sum off by it
    assert "exact sums" in bound_violation(np, round_trip(np, dropped, dtype), ref, mag, dtype) or dtype != "float32"
    uniform = FAMILY.make_inputs(problem, np, rng, {"values": "uniform"})
    ref, mag = FAMILY.reference(problem, uniform), FAMILY.reference_magnitude(problem, uniform)
    fp32_sums = np.cumsum(to_float64(np, uniform["x"], dtype).astype(np.float32), dtype=np.float32)  # sequential fp32
    assert bound_violation(np, round_trip(np, fp32_sums.astype(np.float64), dtype), ref, mag, dtype) == ""
    assert "NaN" in bound_violation(np, np.full_like(ref, np.nan), ref, mag, dtype)


def test_scan_values_exact_case_stays_exact_at_large_n():
    x = scan_values(np, np.random.default_rng(3), 2**22, "float32", "exact")
    assert float(np.abs(x).sum()) < 2**24


def test_sample_compiles_with_nvcc(tmp_path):
    traits = [("float32", "auto"), ("int32", "auto"), ("int32", "int64"), ("bfloat16", "auto")]
    sources = ["#include <cuda_runtime.h>"]
    configs = extreme_configs(FAMILY)
    for index, (dtype, acc) in enumerate(traits):
        for c in configs[index::len(traits)]:
            sources.append(render(FAMILY, dtype, c, host_launcher=True, traits=(("scan", "inclusive"), ("acc_dtype", acc))))
    report = nvcc_compile(sources, "sm_90", tmp_path)
    assert "spill" not in report.replace("0 bytes spill", "")


def test_cli_help_and_bad_input():
    run = [sys.executable, "-m", "autogen", "tune", "scan"]
    shown = subprocess.run(run + ["--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "--exclusive" in shown.stdout and "--acc-dtype" in shown.stdout
    bad = subprocess.run(run + ["--n", "1000", "--dtype", "float16", "--acc-dtype", "int64"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "int64" in bad.stderr


def test_export_with_self_test_builds_for_sm90(tmp_path):
    """`autogen export scan --self-test` from made-up winners (fp32 inclusive, int32 into int64
    exclusive, bf16 by reduce-then-scan at a shape past the shipped data): the library and the
    self-test (its hook included) build for sm_90 with warnings as errors."""
    from test_export import H100, WERROR, build_library, run, run_export, store_winner
    from nvcc_tools import nvcc_or_skip
    from tuning_db import TuningDB

    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    winners = [("float32", {"n": 4096, "scan": "inclusive", "acc_dtype": "auto"}, dict(FAMILY.default_params)),
               ("int32", {"n": 1_000_003, "scan": "exclusive", "acc_dtype": "int64"},
                {**FAMILY.default_params, "block_scan": "raking", "items_per_thread": 8}),
               ("bfloat16", {"n": 2**22, "scan": "inclusive", "acc_dtype": "auto"},
                {**FAMILY.default_params, "mode": "reduce_scan", "vector_width": 8})]
    with TuningDB(url) as db:
        for i, (dtype, dims, params) in enumerate(winners):
            store_winner(db, H100, "scan", dims, params, 2.0 + i, 3.0 + i, dtype=dtype)
    out = tmp_path / "out"
    assert run_export("scan", "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0
    selftest = (out / "autogen_scan_selftest.cu").read_text()
    assert "kExclusive = true" in selftest and "using Out = long long" in selftest
    library = build_library(out / "autogen_scan.cu", "sm_90", tmp_path)
    run([nvcc_or_skip(), "-arch=sm_90", "-std=c++17", "-O3", *WERROR, str(out / "autogen_scan_selftest.cu"),
         str(library), "-o", str(tmp_path / "selftest")])
