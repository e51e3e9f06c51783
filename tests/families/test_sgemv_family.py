"""The sgemv family on the CPU: rendering, naming, geometry, reference and inputs."""

import numpy as np
import pytest

from autogen.errors import UsageError
from autogen.core.registry import get_family

FAMILY = get_family("sgemv")
CONFIGS = list(FAMILY.space.enumerate())


def test_space_is_the_documented_size_and_holds_the_seed_strategies():
    assert len(CONFIGS) == 1296
    names = {c["threads_per_row"] for c in CONFIGS}
    assert {2, 16, 32, 256} <= names  # several rows per warp, warp per row, several warps per row
    assert any(c["vector_width"] == 4 for c in CONFIGS)


def test_procedural_name_spells_every_parameter():
    config = FAMILY.space.check({"threads_per_row": 4, "vector_width": 4, "warps_per_block": 4,
                                 "rows_per_group": 1, "unroll": 2, "x_path": "ldg", "reduce": "shfl"})
    assert FAMILY.kernel_name("float32", config) == "sgemv_f32_tpr4_vw4_wpb4_rpg1_u2_xldg_rshfl"


@pytest.mark.parametrize("m", [1, 3, 127, 128, 129, 16384])
def test_launch_grid_covers_every_row(m):
    problem = FAMILY.problem(m=m, n=16)
    for config in CONFIGS[::37]:
        launch = FAMILY.launch(problem, config)
        rows_per_block = FAMILY.rows_per_block(config)
        assert launch.block[0] == 32 * config["warps_per_block"]
        assert (launch.grid[0] - 1) * rows_per_block < m <= launch.grid[0] * rows_per_block


def test_reference_matches_a_plain_loop():
    problem = FAMILY.problem(m=5, n=7)
    rng = np.random.default_rng(1)
    for case in FAMILY.validation_cases(problem):
        inputs = FAMILY.make_inputs(problem, np, rng, case)
        expected = [case["alpha"] * sum(float(inputs["A"][i, j]) * float(inputs["x"][j]) for j in range(7))
                    + (case["beta"] * float(inputs["y"][i]) if case["beta"] else 0.0) for i in range(5)]
        np.testing.assert_allclose(FAMILY.reference(problem, inputs), expected, rtol=1e-12)


def test_inputs_are_random_and_the_output_poisoned_when_beta_is_zero():
    problem = FAMILY.problem(m=64, n=33)
    rng = np.random.default_rng(2)
    poisoned = FAMILY.make_inputs(problem, np, rng, {"alpha": 1.0, "beta": 0.0})
    assert np.isnan(poisoned["y"]).all()
    assert np.count_nonzero(poisoned["A"]) == poisoned["A"].size
    assert -0.5 <= poisoned["A"].min() and poisoned["A"].max() < 0.5
    honoured = FAMILY.make_inputs(problem, np, rng, {"alpha": 1.0, "beta": 2.0})
    assert np.isfinite(honoured["y"]).all()
    assert not np.array_equal(poisoned["A"], honoured["A"])  # fresh inputs each time


def test_bytes_moved_counts_each_operand_once():
    problem = FAMILY.problem(m=4096, n=4096)
    assert FAMILY.bytes_moved(problem, {"beta": 0.0}) == 4 * (4096 * 4096 + 4096 + 4096)
    assert FAMILY.bytes_moved(problem, {"beta": 1.0}) == 4 * (4096 * 4096 + 4096 + 2 * 4096)
    assert FAMILY.flops(problem) == 2 * 4096 * 4096


@pytest.mark.parametrize("dims, fragment", [
    ({"m": 0, "n": 16}, "m must be between 1"),
    ({"m": 16, "n": -3}, "n must be between 1"),
    ({"m": 16}, "missing n"),
    ({"m": 16, "n": 16, "k": 2}, "unknown k"),
    ({"m": 2**31, "n": 1}, "m must be between 1"),
])
def test_bad_shapes_are_usage_errors(dims, fragment):
    with pytest.raises(UsageError) as info:
        FAMILY.problem(**dims)
    assert fragment in str(info.value)


def test_search_prunes_variants_that_overshoot_small_rows():
    problem = FAMILY.problem(m=16384, n=16)
    wide = FAMILY.space.check({**FAMILY.default_params, "threads_per_row": 256, "warps_per_block": 8})
    assert "spans over twice n=16" in FAMILY.reject_reason(problem, wide)
    narrow = FAMILY.space.check({**FAMILY.default_params, "threads_per_row": 4, "unroll": 1})
    assert FAMILY.reject_reason(problem, narrow) is None


@pytest.mark.parametrize("params", [{}, {"vector_width": 1, "threads_per_row": 4}, {"vector_width": 2, "x_path": "smem"},
                                    {"vector_width": 4, "threads_per_row": 256, "warps_per_block": 8}])
def test_matrix_loads_skip_l1_and_x_loads_keep_it(params):
    # A is read once per launch; x is re-read by every row group: only A's loads may bypass L1.
    import re
    from autogen.core.render import render
    config = FAMILY.space.check({**FAMILY.default_params, **params})
    source = render(FAMILY, "float32", config)
    body = source[source.index('extern "C" __global__'):]
    a_loads = re.findall(r"(\w+)\((?:reinterpret_cast<const float\d?\*>\()?A \+", body)
    assert a_loads and set(a_loads) == {"load_once"}
    assert not re.search(r"load_once\((?:reinterpret_cast<const float\d?\*>\()?x \+", body)
    assert "ld.global.nc.L1::no_allocate" in source
