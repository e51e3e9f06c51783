"""gemm_bias_act on the CPU: sgemm's space without split-K, the batch as grid.z, pruning and seeds
that count the batch, the float64 reference per activation, sgemm's rendered source unchanged by
the template hooks the family uses, a sample through nvcc (sm_90, no spills), the CLI."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autogen.core.registry import get_family
from autogen.core.render import render, source_hash
from autogen.errors import UsageError
from autogen.families._gemm import SPACE as SGEMM_SPACE
from family_checks import held
from nvcc_tools import float_bits as floats, harness_error, harness_output as harness

FAMILY = get_family("gemm_bias_act")
SGEMM = get_family("sgemm")


def problem(batch, m, n, k, act="relu"):
    return FAMILY.problem(batch=batch, m=m, n=n, k=k, act=act)


def config(**changes):
    return FAMILY.space.check({**FAMILY.default_params, **changes})


# -- space, problems, names ---------------------------------------------------------------------------


def test_space_is_sgemm_s_without_split_k():
    assert FAMILY.space.param("split_k").choices == (1,)
    assert FAMILY.space.names == SGEMM_SPACE.names
    assert 5_000 <= FAMILY.space.size() < SGEMM_SPACE.size()
    assert FAMILY.dims == ("batch", "m", "n", "k") and FAMILY.roofline == "compute"


def test_problems_default_batch_1_and_check_act_and_batch():
    assert FAMILY.problem(m=3, n=5, k=7).shape == {"batch": 1, "m": 3, "n": 5, "k": 7, "act": "relu"}
    assert problem(8, 1024, 1024, 1024, "gelu").shape["act"] == "gelu"
    with pytest.raises(UsageError, match="act must be one of"):
        problem(1, 4, 4, 4, "tanh")
    with pytest.raises(UsageError, match="over 65535"):
        problem(65536, 4, 4, 4)


def test_kernel_names_carry_the_activation():
    p = problem(2, 64, 64, 64, "gelu")
    name = FAMILY.kernel_name("float32", FAMILY.default_config(), p.traits)
    assert name == "gemm_bias_act_f32_gelu_bm128_bn128_bk8_tm8_tn8_wl4x8_vw4_sw4_pad4_plregs_sk1_mb1_foij"


# -- launch, pruning, seeds ---------------------------------------------------------------------------


def test_plan_is_one_kernel_with_the_batch_as_grid_z():
    p = problem(6, 1000, 37, 4100)
    steps = FAMILY.plan(p, FAMILY.default_config())
    assert len(steps) == 1 and steps[0].launch.grid == (8, 1, 6) and steps[0].launch.block == (256, 1, 1)
    args = held(steps[0].args({"A": "A", "B": "B", "bias": "bias", "C": "C"}))
    assert args == ("A", "B", "bias", "C", 1000, 37, 4100, 1000 * 4100, 4100 * 37, 1000 * 37)
    assert [a.dtype for a in args[4:]] == [np.int32] * 3 + [np.int64] * 3


def test_small_tiles_are_pruned_where_the_batch_fills_the_gpu():
    small = config(block_m=32, block_n=32, thread_m=4, thread_n=4)
    assert FAMILY.reject_reason(problem(1, 512, 512, 512), small) is None  # 16 tiles of 128 x 128
    assert "fill 4 waves" in FAMILY.reject_reason(problem(64, 512, 512, 512), small)


def test_seeds_are_sgemm_s_templates_for_the_per_batch_shape():
    seeds = FAMILY.seed_configs(problem(8, 1024, 1024, 1024))
    assert seeds and all(c["split_k"] == 1 for c in seeds)
    assert (seeds[0]["block_m"], seeds[0]["block_n"], seeds[0]["pipeline"]) == (128, 128, "regsedge")
    # One 1024^2 matrix is 64 tiles, under one wave: sgemm would split k, the batch fills the GPU.
    assert {(c["block_m"], c["block_n"]) for c in seeds} == {(128, 128)}
    tiny = FAMILY.seed_configs(problem(1, 3, 5, 7))
    assert tiny and all(c["split_k"] == 1 for c in tiny)


# -- data and reference -------------------------------------------------------------------------------


@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
def test_inputs_poisoned_and_reference_per_activation(act):
    p = problem(3, 7, 5, 9, act)
    inputs = FAMILY.make_inputs(p, np, np.random.default_rng(0), FAMILY.validation_cases(p)[0])
    assert inputs["A"].shape == (3, 7, 9) and inputs["B"].shape == (3, 9, 5) and inputs["bias"].shape == (5,)
    assert np.isnan(inputs["C"]).all()
    x = np.einsum("bmk,bkn->bmn", inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)) + inputs["bias"]
    from math import erf
    expected = {"none": x, "relu": np.maximum(x, 0),
                "gelu": np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))(x)}[act]
    assert np.allclose(FAMILY.reference(p, inputs), expected, rtol=1e-12, atol=1e-14)
    magnitude = FAMILY.reference_magnitude(p, inputs)
    assert (magnitude >= np.abs(x) - 1e-12).all()


def test_bytes_and_flops():
    p = problem(8, 1024, 512, 256)
    assert FAMILY.flops(p) == 2 * 8 * 1024 * 512 * 256
    assert FAMILY.bytes_moved(p) == 4 * (8 * (1024 * 256 + 256 * 512 + 1024 * 512) + 512)


# -- rendering: sgemm unchanged, the hooks filled ------------------------------------------------------


def test_sgemm_renders_as_before_the_hooks():
    # The shipped catalog's sgemm winners keep their source hashes (the stale check compares them).
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "autogen" / "catalog" / "data"
    entries = [e["trial"] for path in sorted(folder.glob("*.json")) for e in json.loads(path.read_text())["entries"]
               if e["trial"]["family"] == "sgemm"]
    assert len(entries) >= 10
    for trial in entries:
        assert source_hash(render(SGEMM, "float32", SGEMM.space.check(trial["params"]))) == trial["source_hash"]
    source = render(SGEMM, "float32", SGEMM.default_config(), host_launcher=True)
    assert "{%" not in source and "block" not in source.split("\n")[0]
    assert "value.x = alpha * acc[i][j0 + 0];" in source and "const float value = alpha * acc[i][j0 + j];" in source


def test_the_family_fills_sgemm_s_hooks():
    p = problem(2, 64, 64, 64, "gelu")
    source = render(FAMILY, "float32", config(), host_launcher=True, traits=p.traits)
    assert "A += blockIdx.z * stride_a;" in source and "constexpr float beta = 0.0f;" in source
    assert "value.w = activate(acc[i][j0 + 3] + __ldg(bias + gn + 3));" in source
    assert "erff(x * 0.70710678118654752f)" in source and "alpha * acc[" not in source
    assert "dim3((unsigned int)tiles, 1, (unsigned int)batch), 256" in source
    # The main loop is sgemm's, line for line.
    loop = SGEMM_LOOP.search(render(SGEMM, "float32", SGEMM.default_config())).group(0)
    assert loop in source


SGEMM_LOOP = re.compile(r"    const int tid = threadIdx\.x;.*?compute\(t & 1\);", re.S)


@pytest.mark.parametrize("act", ["relu", "gelu", "none"])
def test_activation_forms(act):
    source = render(FAMILY, "float32", config(), traits=problem(1, 8, 8, 8, act).traits)
    body = source[source.index("float activate(float x)"):].split("}")[0]
    expected = {"relu": "x < 0.0f ? 0.0f : x", "gelu": "x * 0.5f * (1.0f + erff(", "none": "return x;"}[act]
    assert expected in body


def test_a_sample_compiles_for_sm_90_without_spills(tmp_path):
    from nvcc_tools import nvcc_compile

    p = problem(64, 512, 512, 512, "gelu")
    configs = FAMILY.seed_configs(p)[:1] + [config(pipeline="async2", vector_width=1, store_width=1)]
    sources = {FAMILY.kernel_name("float32", c, p.traits): render(FAMILY, "float32", c, True, p.traits)
               for c in configs}
    report = nvcc_compile(["#include <cuda_runtime.h>", *sources.values()], "sm_90", tmp_path)
    assert set(re.findall(r"Compiling entry function '(\w+)'", report)) == set(sources)
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", report))


# -- CLI --------------------------------------------------------------------------------------------


def test_cli_help_and_bad_input(capsys):
    from autogen.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["tune", "gemm_bias_act", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--batch" in text and "--act" in text
    assert main(["tune", "gemm_bias_act", "--m", "64", "--n", "64", "--k", "64", "--act", "swish"]) == 2
    assert "act must be one of relu, gelu, none" in capsys.readouterr().err
    assert main(["tune", "gemm_bias_act", "--batch", "70000", "--m", "4", "--n", "4", "--k", "4"]) == 2
    assert "over 65535" in capsys.readouterr().err


# -- export: the self-test's hook (templates/gemm_bias_act/selftest.cu.j2) ----------------------------

HOOK_HARNESS = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define main autogen_selftest_main
#include "autogen_gemm_bias_act_selftest.cu"
#undef main

// rows R n k: the rows (of all batch * m) the reference checks.
// inputs act batch m n k seed: A, B, bias (bits of float32), one line each; then whether C is all NaN.
// error act batch m n k seed < out: the error of out against that case's inputs, and why.
template <class W>
int run(const std::string& mode, int batch, int m, int n, int k, unsigned long long seed)
{
    std::vector<float> a((std::size_t)batch * m * k), b((std::size_t)batch * k * n), bias(n), c((std::size_t)batch * m * n);
    selftest::Rng rng(seed);
    W::make_inputs(rng, a, b, bias, c);
    if (mode == "inputs") {
        for (const std::vector<float>* v : {&a, &b, &bias}) print_bits(*v);
        bool poisoned = true;
        for (float x : c) poisoned = poisoned && x != x;
        std::printf("%d\n", (int)poisoned);
        return 0;
    }
    std::vector<float> out(c.size());
    if (!read_bits(out)) return 2;
    std::string why;
    const double error = W::output_error(a, b, bias, out, batch, m, n, k, &why);
    std::printf("%.17g\n%s\n", error, why.c_str());
    return 0;
}

int main(int argc, char** argv)
{
    if (argc < 5) return 2;
    const std::string mode = argv[1];
    if (mode == "rows") {
        for (long long r : autogen_gemm_bias_act_relu_test::Workload::checked_rows(std::atoll(argv[2]), std::atoi(argv[3]),
                                                                                  std::atoi(argv[4])))
            std::printf("%lld ", r);
        std::printf("\n");
        return 0;
    }
    const std::string act = argv[2];
    const int batch = std::atoi(argv[3]), m = std::atoi(argv[4]), n = std::atoi(argv[5]), k = std::atoi(argv[6]);
    const unsigned long long seed = std::strtoull(argv[7], nullptr, 10);
    if (act == "relu") return run<autogen_gemm_bias_act_relu_test::Workload>(mode, batch, m, n, k, seed);
    if (act == "gelu") return run<autogen_gemm_bias_act_gelu_test::Workload>(mode, batch, m, n, k, seed);
    return run<autogen_gemm_bias_act_none_test::Workload>(mode, batch, m, n, k, seed);
}
"""
TUNED = (8, 1024, 1024, 1024)  # its data would be over MAX_CASE_BYTES: the hook checks it


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An export with the self-test: one entry point per act, each with one variant tuned at TUNED."""
    from test_export import H100, run_export, store_winner
    from tuning_db import TuningDB

    root = tmp_path_factory.mktemp("gemm_bias_act_export")
    url = f"sqlite:///{root / 'tuning.db'}"
    with TuningDB(url) as db:
        for act in ("relu", "gelu", "none"):
            tuned = problem(*TUNED, act=act)
            store_winner(db, H100, FAMILY.name, {}, FAMILY.default_config(tuned).as_dict(), 360.0, 350.0,
                         shape_key=tuned.shape_key)
    out = root / "autogen_gemm_bias_act"
    assert run_export(FAMILY.name, "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0
    return out


def test_every_entry_point_gets_the_hook_with_its_activation(exported):
    selftest = (exported / "autogen_gemm_bias_act_selftest.cu").read_text()
    assert "no self-test hook" not in selftest and selftest.count("class Workload {") == 3
    assert selftest.count(f"static constexpr double kTolerance = {FAMILY.tolerance};") == 3
    assert "std::erf(x * 0.70710678118654752440)" in selftest
    for act in ("relu", "gelu", "none"):
        hook = selftest[selftest.index(f"namespace autogen_gemm_bias_act_{act}_test {{"):]
        hook = hook[:hook.index("}  // namespace")]
        assert f'"act={act}, C poisoned"' in hook
        assert ("std::erf" in hook) == (act == "gelu")
        # The tuned shape and the one past it are the hook's (their data would be too large).
        assert "e.checked.push_back({ {8, 1024, 1024, 1024}});" in hook
        assert "e.checked.push_back({ {9, 1025, 1025, 1025}});" in hook


@pytest.fixture(scope="module")
def hook_harness(exported):
    from nvcc_tools import build_hook_harness
    return build_hook_harness(exported, "autogen_gemm_bias_act.cu", HOOK_HARNESS)


def test_hook_checks_every_row_of_small_shapes_and_a_sample_of_the_batch(hook_harness):
    assert [int(r) for r in harness(hook_harness, "rows", 3 * 19, 23, 40)[0].split()] == list(range(57))
    rows = [int(r) for r in harness(hook_harness, "rows", 8 * 1024, 1024, 1024)[0].split()]
    assert len(rows) == 190 and rows[:47] == list(range(47)) and rows[-47:] == list(range(8192 - 47, 8192))
    assert rows == sorted(set(rows)) and len({r // 1024 for r in rows}) == 8  # every batch entry


@pytest.mark.parametrize("act", ["relu", "gelu", "none"])
def test_hook_error_passes_fp32_results_and_catches_wrong_ones(hook_harness, act):
    batch, m, n, k, seed = 3, 19, 23, 40, 7
    lines = harness(hook_harness, "inputs", act, batch, m, n, k, seed)
    a, b, bias = (floats(line) for line in lines[:3])
    assert lines[3] == "1" and (np.abs(a) <= 0.5).all() and (np.abs(bias) <= 0.5).all()
    problem_ = problem(batch, m, n, k, act)
    inputs = {"A": a.reshape(batch, m, k), "B": b.reshape(batch, k, n), "bias": bias}
    ref = FAMILY.reference(problem_, inputs, np)
    magnitude = FAMILY.reference_magnitude(problem_, inputs, np)

    def error(out):
        return harness_error(hook_harness, out, "error", act, batch, m, n, k, seed)

    got, why = error(ref)
    want = np.linalg.norm(ref.astype(np.float32) - ref) / np.linalg.norm(magnitude)
    assert why == "" and got == pytest.approx(want, rel=1e-6, abs=1e-12) and got < 1e-7
    assert error(ref + 1e-3 * magnitude.max())[0] > FAMILY.tolerance
    if act != "none":  # the activation is the entry point's: the pre-activation is wrong
        pre = FAMILY.reference(problem(batch, m, n, k, "none"), inputs, np)
        assert error(pre)[0] > FAMILY.tolerance
    bad = ref.copy()
    bad[-1, -1, -1] = np.nan
    got, why = error(bad)
    assert got == float("inf") and "NaN/inf" in why
