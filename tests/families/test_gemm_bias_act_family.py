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
