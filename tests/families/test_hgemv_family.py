"""The hgemv family on the CPU: space, naming, geometry and launches per batch, pruning, inputs,
float64 reference, tolerances, and the export with its self-test hook (built with nvcc, its host
side run on the CPU against the Python family)."""

from __future__ import annotations

import functools
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autogen.core.dtypes import to_float64, to_storage
from autogen.errors import ArgumentError, InvalidConfigError, UsageError
from autogen.export.writer import entry_symbol
from autogen.core.registry import get_family
from autogen.families.hgemv import GUARD, SMALLEST_NORMAL, TOLERANCES, _rank, alignment_period, batch_tile_for
from autogen.core.render import render
from family_checks import held

FAMILY = get_family("hgemv")
DTYPES = ("float16", "bfloat16")


@functools.cache
def all_configs() -> tuple:
    """Every point of the space, enumerated (for some seconds) by the first test that needs it:
    at import, every pytest-xdist worker paid it while collecting, whichever ran this file."""
    return tuple(FAMILY.space.enumerate())


def config(**params):
    return FAMILY.space.check({**FAMILY.default_params, **params})


# -- space, names, geometry ------------------------------------------------------------------------


def test_space_size_and_every_issue_parameter():
    configs = all_configs()
    # 4752 CUDA-core variants loading A a chunk at a time, 2908 of them (unroll >= 2) also step by
    # step, and 200 tensor-core (x_path=mma) ones; the 1036 of one vector through x_path=ldg also
    # with tail=peeled; the 160 tensor-core ones of one row group per block also split over 2, 4
    # and 8 blocks (split_k); the 880 tensor-core ones again with A double-buffered (a_buffers=2);
    # the 280 of 256-thread blocks of each a_buffers bounded for 2 blocks per SM, and the 168 of
    # them with one register set of A and rows_per_group * unroll <= 2 for 3 (min_blocks); the
    # 4688 x_path=smem ones of the chunk schedule again requesting A before x is staged (early);
    # and 920 rows in flight (row_align=peeled through x_path=ldg: 10 whole-warp geometries x
    # batch tiles 1 to 4 (3 theirs alone) x the 23 of pack width, rows per group and unroll whose
    # weights in flight fit (rows_per_group * unroll * pack_width <= 32), chunk schedule, checked
    # tail, shuffles), 84 of whose 256-thread blocks at three and four vectors are also bounded to
    # 64 registers (min_blocks=4: 21 combinations of pack width, rows per group, unroll and a batch
    # tile of 3 or 4, at the 4 geometries of 8 warps)
    assert len(configs) == 7860 + 1036 + 3968 + 3 * 160 + 880 + 2 * 280 + 168 + 4688 + 920 + 84
    early = [c for c in configs if c["load_schedule"] == "early"]
    assert len(early) == 4688 and all(c["x_path"] == "smem" for c in early)
    flight = [c for c in configs if c["row_align"] == "peeled" and c["x_path"] == "ldg"]
    assert len(flight) == 920 + 84 and all(c["threads_per_row"] >= 32 and c["batch_tile"] <= 4 for c in flight)
    bounded = [c for c in flight if c["min_blocks"] > 1]
    assert len(bounded) == 84 and all(c["min_blocks"] == 4 and c["warps_per_block"] == 8 and c["batch_tile"] >= 3
                                      for c in bounded)
    assert all(c in flight for c in configs if c["batch_tile"] == 3)
    # row_align=peeled: the x_path smem and mma variants again, x staged from the rows' head, and
    # through x_path=ldg only the rows in flight
    assert all(c["x_path"] != "ldg" or c in flight for c in configs if c["row_align"] == "peeled")
    assert sum(c["load_schedule"] == "step" and c["tail"] == "checked" and c["row_align"] == "scalar" for c in configs) == 2908
    assert all(c["x_path"] == "mma" and c["threads_per_row"] == 32 * c["warps_per_block"]
               for c in configs if c["split_k"] > 1)
    peeled = [c for c in configs if c["tail"] == "peeled"]
    assert len(peeled) == 1036 and all(c["x_path"] == "ldg" and c["batch_tile"] == 1 for c in peeled)
    names = set(FAMILY.space.names)
    assert names == {"threads_per_row", "pack_width", "warps_per_block", "rows_per_group", "unroll", "x_path",
                     "reduce", "batch_tile", "load_schedule", "tail", "row_align", "split_k", "a_buffers",
                     "min_blocks"}
    assert FAMILY.space.param("pack_width").choices == (2, 4, 8)  # half2, 64-bit and 128-bit accesses
    assert {c["threads_per_row"] for c in configs} == {4, 8, 16, 32, 64, 128, 256}
    assert FAMILY.dims == ("m", "n", "batch") and FAMILY.dtypes == DTYPES


def test_constraints_bound_shared_memory_and_registers():
    for c in all_configs():
        columns = c["threads_per_row"] * c["pack_width"] * c["unroll"]
        if c["x_path"] == "smem":
            assert 4 * columns * c["batch_tile"] <= 32 * 1024
        assert c["rows_per_group"] * c["unroll"] * c["pack_width"] <= 32
        assert c["rows_per_group"] * c["batch_tile"] <= 16 or c["x_path"] == "mma"
        assert c["threads_per_row"] <= 32 * c["warps_per_block"]
        assert c["reduce"] == "shfl" or c["threads_per_row"] > 32
        # Static shared memory of the variant (x tile, reduction arrays) stays under 48 KiB.
        block = 32 * c["warps_per_block"]
        tile = 4 * columns * c["batch_tile"] if c["x_path"] == "smem" else 0
        partial = 4 * c["rows_per_group"] * c["batch_tile"] * (block if c["reduce"] == "smem" else c["warps_per_block"])
        assert tile + partial <= 48 * 1024


def test_procedural_name_spells_every_parameter():
    c = config(threads_per_row=64, pack_width=4, warps_per_block=8, rows_per_group=2, unroll=1, x_path="smem",
               reduce="smem", batch_tile=4)
    assert FAMILY.kernel_name("bfloat16", c) == "hgemv_bf16_tpr64_pw4_wpb8_rpg2_u1_xsmem_rsmem_bt4"
    assert FAMILY.kernel_name("float16", FAMILY.default_config()) == "hgemv_f16_tpr32_pw8_wpb4_rpg1_u2_xldg_rshfl_bt1"
    # load_schedule came later: named only when it is not the chunk schedule every older winner has
    stepped = config(threads_per_row=256, warps_per_block=8, rows_per_group=2, load_schedule="step")
    assert FAMILY.kernel_name("float16", stepped) == "hgemv_f16_tpr256_pw8_wpb8_rpg2_u2_xldg_rshfl_bt1_lsstep"


@pytest.mark.parametrize("params", [dict(unroll=1), dict(x_path="mma", threads_per_row=256, warps_per_block=8)])
def test_step_by_step_loads_need_several_steps_of_the_cuda_core_loop(params):
    with pytest.raises(InvalidConfigError, match="load_schedule=step needs unroll >= 2"):
        config(load_schedule="step", **params)


@pytest.mark.parametrize("x_path", ["ldg", "mma"])
def test_early_loads_need_x_staged_in_shared_memory(x_path):
    with pytest.raises(InvalidConfigError, match="load_schedule=early needs x_path=smem"):
        config(load_schedule="early", x_path=x_path, threads_per_row=256, warps_per_block=8)


@pytest.mark.parametrize("row_align", ["scalar", "peeled"])
def test_early_requests_the_chunks_weights_before_staging_its_x(row_align):
    def chunk_loop(source):  # the column loop: from its head to the end of the kernel
        return source[re.search(r"for \(long long c0 = 0; c0 < n", source).start():]
    params = dict(x_path="smem", threads_per_row=128, rows_per_group=2, row_align=row_align)
    for pdl in (False, True):
        chunk = chunk_loop(render(FAMILY, "float16", config(**params), pdl=pdl))
        early = chunk_loop(render(FAMILY, "float16", config(load_schedule="early", **params), pdl=pdl))
        staged = "__syncthreads();  // the previous tile is no longer being read"
        assert chunk.index(staged) < chunk.index("load_weights4(A") < chunk.index("fmaf(a, xf")
        assert early.index("load_weights4(A") < early.index(staged)
        assert early.count("load_weights4(A") == chunk.count("load_weights4(A")
    assert "_lsearly" in FAMILY.kernel_name("float16", config(load_schedule="early", **params))


def test_step_by_step_requests_each_steps_packs_inside_its_step():
    def loop_of(source):  # the multiply-add loop of the vector path, from its first line to x's
        end = source.index("float xf[PW * BT]")
        return source[source.rindex("for (int u = 0; u < UNROLL; ++u) {", 0, end):end]
    for pdl in (False, True):
        chunk = render(FAMILY, "float16", config(rows_per_group=2), pdl=pdl)
        step = render(FAMILY, "float16", config(rows_per_group=2, load_schedule="step"), pdl=pdl)
        assert "load_weights4(" not in loop_of(chunk) and "load_weights4(" in loop_of(step)
        if pdl:  # the first chunk is still requested before griddepcontrol.wait
            assert step.index("load_weights4(A") < step.index("griddepcontrol.wait;")


@pytest.mark.parametrize("m", [1, 3, 127, 128, 129, 4096, 128256])
def test_launch_grid_covers_every_row(m):
    problem = FAMILY.problem(m=m, n=4096)
    for c in all_configs()[::41]:
        launch = FAMILY.launch(problem, c)
        rows = 32 * c["warps_per_block"] // c["threads_per_row"] * c["rows_per_group"]
        rows *= 16 if c["x_path"] == "mma" else 1  # a row group of warps computes 16-row tiles
        assert FAMILY.rows_per_block(c) == rows
        assert launch.block == (32 * c["warps_per_block"], 1, 1)
        blocks = launch.grid[0] // c["split_k"]  # a cluster of split_k blocks per block of rows
        assert blocks * c["split_k"] == launch.grid[0]
        # whole windows of `period` blocks (rows in flight with row groups: rows pack_width apart)
        period = alignment_period(problem, c)
        windows, rest = divmod(blocks, period)
        assert rest == 0 and (windows - 1) * rows * period < m <= windows * rows * period


@pytest.mark.parametrize("batch, tile, starts", [
    (1, 1, [0]), (1, 8, [0]), (3, 4, [0]), (4, 4, [0]), (8, 8, [0]), (8, 4, [0, 4]), (8, 1, list(range(8))),
    (9, 8, [0, 8]), (20, 8, [0, 8, 16]),
])
def test_plan_launches_one_tile_of_vectors_each(batch, tile, starts):
    problem = FAMILY.problem("bfloat16", m=100, n=70, batch=batch)
    c = config(batch_tile=tile)
    steps = FAMILY.plan(problem, c)
    assert [s.suffix for s in steps] == [""] * len(starts)
    inputs = {"A": "A", "x": "x", "y": "y", "alpha": 2.0, "beta": 0.5}
    for step, j0 in zip(steps, starts):
        args = held(step.args(inputs))
        assert args[:3] == ("A", "x", "y")
        assert [int(a) for a in args[3:7]] == [100, 70, batch, j0]
        assert all(isinstance(a, np.int32) for a in args[3:7])
        assert (float(args[7]), float(args[8])) == (2.0, 0.5) and all(isinstance(a, np.float32) for a in args[7:])
        assert step.launch == FAMILY.launch(problem, c)
    # Every vector is computed by exactly one launch.
    covered = [j for j0 in starts for j in range(j0, min(batch, j0 + tile))]
    assert covered == list(range(batch))


def test_host_launcher_loops_over_the_tiles_with_the_python_grid():
    c = config(threads_per_row=8, warps_per_block=2, rows_per_group=2, batch_tile=4)
    source = render(FAMILY, "float16", c, host_launcher=True)
    name = FAMILY.kernel_name("float16", c)
    assert f"extern \"C\" cudaError_t {name}_launch({FAMILY.c_params}, cudaStream_t stream)" in source
    rows = FAMILY.rows_per_block(c)
    assert rows == 16
    assert f"const dim3 grid((unsigned int)((m - 1) / {rows} + 1));" in source
    assert "for (long long j0 = 0; j0 < batch; j0 += 4)" in source
    assert "if (m <= 0 || n <= 0 || batch <= 0) return cudaErrorInvalidValue;" in source
    assert "_launch(" not in render(FAMILY, "float16", c)  # NVRTC builds get device code only


def test_templates_use_bit_patterns_and_no_headers():
    for dtype in DTYPES:
        source = render(FAMILY, dtype, FAMILY.default_config())
        assert "#include" not in source and "__half" not in source and "__nv_bfloat16" not in source
        assert ("cvt.f32.f16" in source) == (dtype == "float16")
        assert ("cvt.rn.bf16.f32" in source) == (dtype == "bfloat16")


@pytest.mark.parametrize("params, skips_l1", [
    ({}, True), ({"x_path": "smem"}, True), ({"x_path": "mma", "batch_tile": 8}, True),
    ({"threads_per_row": 4, "pack_width": 4}, True),  # 4 lanes x 8 bytes: whole 32-byte sectors
    ({"threads_per_row": 8, "pack_width": 2}, True),
    ({"threads_per_row": 4, "pack_width": 2}, False)])  # 16 bytes: half a sector per load
def test_weights_skip_l1_where_each_load_covers_whole_sectors(params, skips_l1):
    # A is read once per launch: its pack loads must not allocate in L1, where x is re-read, unless
    # a load covers only part of a sector whose rest the next unrolled step reads.
    source = render(FAMILY, "float16", config(**params))
    body = source[source.index('extern "C" __global__'):]
    a_loads = set(re.findall(r"(load_[a-z]+)\d\(A \+", body))
    assert a_loads == ({"load_weights"} if skips_l1 else {"load_words"})
    assert ("ld.global.nc.L1::no_allocate" in source) == skips_l1
    assert not re.search(r"load_weights\d\(x", body)


# -- problems and pruning --------------------------------------------------------------------------


def test_batch_defaults_to_one_and_any_batch_is_a_problem():
    assert FAMILY.problem(m=8, n=8).shape_key == "m=8,n=8,batch=1"
    assert FAMILY.problem("bfloat16", m=8, n=8, batch=8).dtype == "bfloat16"
    assert FAMILY.problem(m=8, n=8, batch=37)["batch"] == 37  # several launches of at most 8 vectors


@pytest.mark.parametrize("dtype, dims, fragment", [
    ("float16", {"m": 0, "n": 16}, "m must be between 1"),
    ("float16", {"m": 16, "n": -3}, "n must be between 1"),
    ("float16", {"m": 16, "n": 16, "batch": 0}, "batch must be between 1"),
    ("float16", {"n": 16}, "missing m"),
    ("float16", {"m": 16, "n": 16, "k": 2}, "unknown k"),
    ("float16", {"m": 2**31, "n": 1}, "m must be between 1"),
    ("float32", {"m": 16, "n": 16}, "supports dtype float16, bfloat16"),
])
def test_bad_problems_are_usage_errors(dtype, dims, fragment):
    with pytest.raises(UsageError) as info:
        FAMILY.problem(dtype, **dims)
    assert fragment in str(info.value)


@pytest.mark.parametrize("batch, tile", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (7, 8), (8, 8), (9, 8), (64, 8)])
def test_search_times_only_the_tile_that_covers_the_batch(batch, tile):
    assert batch_tile_for(batch) == tile
    problem = FAMILY.problem(m=4096, n=4096, batch=batch)
    for choice in (1, 2, 4, 8):
        reason = FAMILY.reject_reason(problem, config(batch_tile=choice))
        assert (reason is None) == (choice == tile), (choice, reason)
        if reason:
            assert f"batch_tile={choice} for batch={batch}" in reason


@pytest.mark.parametrize("batch, tile", [(1, 1), (2, 2), (3, 3), (4, 4), (5, 8)])
def test_rows_in_flight_take_a_tile_of_three_for_three_vectors(batch, tile):
    # rows in flight read x in whole units only when the launch covers the batch exactly: a batch
    # of 3 takes a tile of 3 there (a tile of 4 would read it element by element); other forms
    # index x by powers of two and keep the tile of 4
    flight = dict(row_align="peeled", x_path="ldg", threads_per_row=128, unroll=2)
    assert batch_tile_for(batch, flight) == tile
    assert batch_tile_for(batch, dict(FAMILY.default_params)) == (4 if batch == 3 else tile)
    problem = FAMILY.problem(m=3000, n=4099, batch=batch)
    for choice in (1, 2, 3, 4):
        reason = FAMILY.reject_reason(problem, config(batch_tile=choice, **flight))
        assert (reason is None) == (choice == tile), (choice, reason)
    assert "batch_tile=3 needs row_align=peeled with x_path=ldg" in FAMILY.space.violations(
        dict(FAMILY.default_params, batch_tile=3))[0]


def test_a_rows_in_flight_winner_is_adapted_to_each_batch():
    flight = dict(FAMILY.default_params, row_align="peeled", threads_per_row=128, unroll=2)
    for batch in (1, 2, 3, 4):
        adapted = FAMILY.seed_from(FAMILY.problem(m=3000, n=4099, batch=batch), flight)
        assert adapted == {**flight, "batch_tile": batch}
    # past 4 vectors rows in flight have no tile: the shape's default (tensor cores)
    eight = FAMILY.problem(m=3000, n=4099, batch=8)
    assert FAMILY.seed_from(eight, flight) == FAMILY.default_config(eight).as_dict()
    # a winner of aligned rows read whole becomes rows in flight on odd rows, with its tile of 3
    scalar = dict(flight, row_align="scalar")
    assert FAMILY.seed_from(FAMILY.problem(m=3000, n=4099, batch=3), scalar) == {**flight, "batch_tile": 3}


def test_search_prunes_row_groups_that_overshoot_short_rows():
    problem = FAMILY.problem(m=16384, n=16)
    wide = config(threads_per_row=256, warps_per_block=8)
    assert "threads_per_row*pack_width=2048 spans over twice n=16" in FAMILY.reject_reason(problem, wide)
    assert "unroll=2 reaches past n=16" in FAMILY.reject_reason(problem, config(threads_per_row=16, pack_width=4))
    assert FAMILY.reject_reason(problem, config(threads_per_row=16, pack_width=4, unroll=1)) is None
    big = FAMILY.problem(m=4096, n=4096)
    assert FAMILY.reject_reason(big, FAMILY.default_config()) is None


# -- data ------------------------------------------------------------------------------------------


def decoded(array, dtype):
    return to_float64(np, array, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3])
def test_reference_matches_a_plain_loop_over_the_values_read(dtype, batch):
    problem = FAMILY.problem(dtype, m=5, n=7, batch=batch)
    rng = np.random.default_rng(1)
    for case in FAMILY.validation_cases(problem):
        inputs = FAMILY.make_inputs(problem, np, rng, case)
        A, x, y = (decoded(inputs[k], dtype) for k in ("A", "x", "y"))
        x2 = x.reshape(7, batch)
        want = np.empty((5, batch))
        for i in range(5):
            for j in range(batch):
                want[i, j] = case["alpha"] * math.fsum(A[i, k] * x2[k, j] for k in range(7))
                if case["beta"]:
                    want[i, j] += case["beta"] * y.reshape(5, batch)[i, j]
        got = FAMILY.reference(problem, inputs)
        assert got.shape == inputs["y"].shape == ((5,) if batch == 1 else (5, batch))
        np.testing.assert_allclose(got.reshape(5, batch), want, rtol=1e-12)
        terms = abs(case["alpha"]) * (np.abs(A) @ np.abs(x)) + (abs(case["beta"]) * np.abs(y) if case["beta"] else 0)
        np.testing.assert_allclose(FAMILY.reference_magnitude(problem, inputs),
                                   np.abs(got) + GUARD * terms + SMALLEST_NORMAL[dtype], rtol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_are_fresh_random_halves_and_the_output_poisoned(dtype):
    problem = FAMILY.problem(dtype, m=64, n=33, batch=4)
    rng = np.random.default_rng(2)
    storage = np.float16 if dtype == "float16" else np.uint16
    cases = FAMILY.validation_cases(problem)
    assert [c["beta"] for c in cases] == [0.0, 1.25, 0.0]
    poisoned = FAMILY.make_inputs(problem, np, rng, cases[0])
    assert all(poisoned[k].dtype == storage for k in ("A", "x", "y"))
    assert poisoned["A"].shape == (64, 33) and poisoned["x"].shape == (33, 4) and poisoned["y"].shape == (64, 4)
    y = FAMILY.output_values(problem, poisoned, "y", np)
    assert np.isnan(y.astype(np.float64)).all()
    A = decoded(poisoned["A"], dtype)
    assert np.count_nonzero(A) >= A.size - 2 and -0.5 <= A.min() and A.max() <= 0.5
    honoured = FAMILY.make_inputs(problem, np, rng, cases[1])
    assert np.isfinite(decoded(honoured["y"], dtype)).all()
    assert not np.array_equal(poisoned["A"], honoured["A"])  # fresh inputs each time
    vector = FAMILY.make_inputs(FAMILY.problem(dtype, m=9, n=5), np, rng, cases[0])
    assert vector["x"].shape == (5,) and vector["y"].shape == (9,)


@pytest.mark.parametrize("n", [1, 2, 3, 4096, 4097, 14336])
def test_large_case_overflows_half_accumulation_but_not_y(n):
    problem = FAMILY.problem("float16", m=3, n=n, batch=2)
    case = FAMILY.validation_cases(problem)[2]
    assert case["values"] == "large" and case["beta"] == 0.0
    assert case["alpha"] == 2.0 ** -math.ceil(math.log2(n)) and math.frexp(case["alpha"])[0] == 0.5  # a power of 2
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(3), case)
    A, x = decoded(inputs["A"], "float16"), decoded(inputs["x"], "float16")
    assert A.min() >= 128 and A.max() <= 240 and x.min() >= 128 and x.max() <= 240
    assert (A * A).max() < 65504  # a single product fits fp16
    ref = FAMILY.reference(problem, inputs)
    assert np.isfinite(ref).all() and np.abs(ref).max() < 65504  # y fits fp16
    # A kernel that sums any four products in fp16 gets inf.
    if n >= 4:
        with np.errstate(over="ignore"):
            half_sum = sum(inputs["A"][:, k:k + 1] * inputs["x"][k:k + 1, :] for k in range(4))
        assert half_sum.dtype == np.float16 and np.isinf(half_sum).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_tolerance_passes_the_rounded_reference_and_catches_real_bugs(dtype):
    tolerance = TOLERANCES[dtype]
    assert FAMILY.tolerance_for(FAMILY.problem(dtype, m=1, n=1)) == tolerance
    # The bound the tolerance doubles: the relative rounding of y to the dtype.
    rounding = 2.0**-11 if dtype == "float16" else 2.0**-8
    assert 2 * rounding <= tolerance <= 2.1 * rounding
    for m, n, batch in [(1, 1, 1), (3, 5, 2), (257, 4099, 1), (64, 1000, 8)]:
        problem = FAMILY.problem(dtype, m=m, n=n, batch=batch)
        rng = np.random.default_rng(m + n)
        for case in FAMILY.validation_cases(problem):
            inputs = FAMILY.make_inputs(problem, np, rng, case)
            expected = FAMILY.reference(problem, inputs)
            magnitude = FAMILY.reference_magnitude(problem, inputs)
            # A correct kernel: the exact result rounded to the dtype once.
            inputs["y"] = to_storage(np, expected.astype(np.float32), dtype)
            error, reason = FAMILY.compare(problem, inputs, expected, magnitude)
            assert reason == "" and error <= tolerance / 2, (problem, case, error)
            if n >= 1000 and case["values"] == "uniform":
                # A kernel that drops one pack of 8 columns of every row fails.
                A = decoded(inputs["A"], dtype).copy()
                A[:, 8:16] = 0
                x = decoded(inputs["x"], dtype)
                wrong = case["alpha"] * (A @ x) + (case["beta"] * decoded(inputs["y"], dtype) if case["beta"] else 0)
                inputs["y"] = to_storage(np, wrong.astype(np.float32), dtype)
                error, reason = FAMILY.compare(problem, inputs, expected, magnitude)
                assert error > tolerance, (problem, case, error)
        # Left unwritten (NaN): caught.
        case = FAMILY.validation_cases(problem)[0]
        inputs = FAMILY.make_inputs(problem, np, rng, case)
        expected = FAMILY.reference(problem, inputs)
        error, reason = FAMILY.compare(problem, inputs, expected, FAMILY.reference_magnitude(problem, inputs))
        assert "NaN" in reason


@pytest.mark.parametrize("dtype", DTYPES)
def test_validation_allows_the_rounding_of_y_to_its_type_on_top(dtype):
    # The shared rule (autogen.gpu.measure.judge): past the tolerance, y may be off by what the
    # float64 reference loses when rounded to y's type, measured against hgemv's own magnitude.
    from autogen.core.compare import relative_error
    from autogen.gpu.measure import judge

    problem = FAMILY.problem(dtype, m=300, n=64, batch=2)
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(4), FAMILY.validation_cases(problem)[0])
    expected, magnitude = FAMILY.reference(problem, inputs), FAMILY.reference_magnitude(problem, inputs)
    assert FAMILY.output_dtype(problem, inputs, "y", np) == dtype
    rounded = to_float64(np, to_storage(np, expected, dtype), dtype)
    floor = FAMILY.representable_error(problem, inputs, expected, magnitude, np)
    assert floor == relative_error(np, rounded, expected, magnitude)[0]
    assert 0 < floor < (2.0**-11 if dtype == "float16" else 2.0**-8)
    inputs["y"] = to_storage(np, rounded, dtype)
    assert judge(FAMILY, problem, inputs, expected, magnitude, np)[1] == ""
    allowed = TOLERANCES[dtype] + floor
    inputs["y"] = to_storage(np, expected * (1 + 2 * allowed), dtype)
    assert judge(FAMILY, problem, inputs, expected, magnitude, np)[1].startswith("relative L2 error")


def test_bytes_and_flops():
    problem = FAMILY.problem(m=4096, n=4096, batch=4)
    assert FAMILY.bytes_moved(problem, {"beta": 0.0}) == 2 * (4096 * 4096 + 4096 * 4 + 4096 * 4)
    assert FAMILY.bytes_moved(problem, {"beta": 1.0}) == 2 * (4096 * 4096 + 4096 * 4 + 2 * 4096 * 4)
    assert FAMILY.weight_bytes(problem) == 2 * 4096 * 4096
    assert FAMILY.flops(problem) == 2 * 4096 * 4096 * 4


def test_rank_of_x_operands():
    assert _rank(np.zeros(3)) == 1 and _rank(np.zeros((3, 2))) == 2
    with pytest.raises(ArgumentError, match="2-dimensional"):
        _rank(np.zeros((3, 2, 1)))

    class Interface:
        __cuda_array_interface__ = {"shape": (5, 4)}

    assert _rank(Interface()) == 2


def test_entry_symbol_names_every_dtype():
    assert [entry_symbol(FAMILY, d) for d in DTYPES] == ["autogen_hgemv_f16", "autogen_hgemv_bf16"]


# -- export and the self-test hook ---------------------------------------------------------------------

from conftest import gpu_unavailable_reason  # noqa: E402
from nvcc_tools import nvcc_or_skip  # noqa: E402
from test_export import H100, WERROR, build_library, run, run_export, store_winner  # noqa: E402
from tuning_db import TuningDB  # noqa: E402

ARCH = "sm_90"
WINNERS = {
    "float16": {(4096, 4096, 1): FAMILY.default_params,
                (4096, 4096, 4): dict(FAMILY.default_params, batch_tile=4, x_path="smem", unroll=1),
                (1000, 37, 1): dict(FAMILY.default_params, threads_per_row=4, pack_width=2, rows_per_group=4,
                                    unroll=4),
                (4096, 4096, 8): dict(FAMILY.default_params, batch_tile=8, x_path="mma", rows_per_group=2),
                (1000, 4103, 3): dict(FAMILY.default_params, batch_tile=4, x_path="mma", threads_per_row=256,
                                      warps_per_block=8, unroll=2, row_align="peeled", split_k=4)},
    "bfloat16": {(4096, 4096, 8): dict(FAMILY.default_params, threads_per_row=128, warps_per_block=8, batch_tile=8,
                                       reduce="smem", rows_per_group=2, unroll=1),
                 (128, 8192, 2): dict(FAMILY.default_params, threads_per_row=256, warps_per_block=8, batch_tile=2,
                                      x_path="smem", pack_width=4, unroll=1),
                 (14336, 4096, 4): dict(FAMILY.default_params, threads_per_row=64, batch_tile=4, x_path="mma",
                                        rows_per_group=2, unroll=2)},
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export_hgemv")
    url = f"sqlite:///{root / 'tuning.db'}"
    with TuningDB(url) as db:
        for dtype, shapes in WINNERS.items():
            for i, (shape, params) in enumerate(shapes.items()):
                store_winner(db, H100, "hgemv", dict(zip(FAMILY.dims, shape)), params, 2.0 + i, 3.0 + i, dtype=dtype)
    out = root / "autogen_hgemv"
    assert run_export("hgemv", "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0
    return out


@pytest.fixture(scope="module")
def library(exported, tmp_path_factory) -> Path:
    return build_library(exported / "autogen_hgemv.cu", ARCH, tmp_path_factory.mktemp("library"))


def test_export_has_an_entry_point_and_hook_per_dtype(exported):
    header = (exported / "autogen_hgemv.h").read_text()
    selftest = (exported / "autogen_hgemv_selftest.cu").read_text()
    assert "no self-test hook" not in selftest
    for dtype in DTYPES:
        symbol = entry_symbol(FAMILY, dtype)
        assert f"cudaError_t {symbol}({FAMILY.c_params}, cudaStream_t stream);" in header
        namespace = selftest.split(f"namespace {symbol}_test {{", 1)[1].split(f"}}  // namespace {symbol}_test", 1)[0]
        assert "class Workload {" in namespace
        assert f"static constexpr double kTolerance = {TOLERANCES[dtype]};" in namespace
        assert ("float_to_half_bits" in namespace) == (dtype == "float16")
        assert ("float_to_bf16_bits" in namespace) == (dtype == "bfloat16")
        for params in WINNERS[dtype].values():
            name = FAMILY.kernel_name(dtype, FAMILY.space.check(params))
            assert f'e.variants.push_back({{"{name}", {name}_launch}});' in namespace
    assert not re.search(r"#\s*include\s*[<\"]cuda_(fp16|bf16)", selftest)


def test_selftest_builds_for_sm90_and_fails_cleanly_without_a_gpu(harness):
    # The harness is the self-test built for sm_90 with warnings as errors; with no arguments it
    # runs the self-test's own main.
    if gpu_unavailable_reason() is not None:
        done = subprocess.run([str(harness)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "no CUDA GPU available" in done.stdout, done.stdout + done.stderr


# The self-test with its main renamed, driving the hook's static members on the CPU. Values
# travel as 16-bit patterns.
HARNESS = r"""
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define main autogen_selftest_main
#include "autogen_hgemv_selftest.cu"
#undef main

void print_bits(const std::vector<std::uint16_t>& values)
{
    for (std::size_t i = 0; i < values.size(); ++i) std::printf("%s%u", i ? " " : "", (unsigned int)values[i]);
    std::printf("\n");
}

void print_doubles(const std::vector<double>& values)
{
    for (std::size_t i = 0; i < values.size(); ++i) std::printf("%s%.17g", i ? " " : "", values[i]);
    std::printf("\n");
}

// inputs m n b case seed: A, x, y, "alpha beta", the reference, the magnitude.
// error m n b case seed < y_out: the error of y_out against that case's inputs, and why.
template <class W>
int family(const std::string& mode, int m, int n, int b, int c, unsigned long long seed)
{
    selftest::Rng rng(seed);
    std::vector<std::uint16_t> a((std::size_t)m * n), x((std::size_t)n * b), y((std::size_t)m * b), out(y.size());
    W::make_inputs(c, rng, a, x, y);
    const float alpha = W::alpha_of(c, n), beta = W::beta_of(c);
    if (mode == "inputs") {
        std::vector<double> ref, magnitude;
        W::reference(a, x, y, m, n, b, alpha, beta, ref, magnitude);
        print_bits(a);
        print_bits(x);
        print_bits(y);
        std::printf("%.17g %.17g\n", (double)alpha, (double)beta);
        print_doubles(ref);
        print_doubles(magnitude);
        return 0;
    }
    for (std::uint16_t& v : out) {
        unsigned int bits = 0;
        if (std::scanf("%u", &bits) != 1) return 2;
        v = (std::uint16_t)bits;
    }
    std::string why;
    const double error = W::output_error(a, x, y, out, m, n, b, alpha, beta, &why);
    std::printf("%.17g\n%s\n", error, why.c_str());
    return 0;
}

int main(int argc, char** argv)
{
    if (argc == 1) return autogen_selftest_main(argc, argv);  // the self-test itself
    if (argc != 8) return 2;
    const std::string mode = argv[1], dtype = argv[2];
    const int m = std::atoi(argv[3]), n = std::atoi(argv[4]), b = std::atoi(argv[5]), c = std::atoi(argv[6]);
    const unsigned long long seed = std::strtoull(argv[7], nullptr, 10);
    return dtype == "float16" ? family<@F16@::Workload>(mode, m, n, b, c, seed)
                              : family<@BF16@::Workload>(mode, m, n, b, c, seed);
}
"""


@pytest.fixture(scope="module")
def harness(exported, library, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("harness")
    source = work / "harness_hgemv.cu"
    source.write_text(HARNESS.replace("@F16@", entry_symbol(FAMILY, "float16") + "_test")
                      .replace("@BF16@", entry_symbol(FAMILY, "bfloat16") + "_test"))
    binary = work / "harness_hgemv"
    # Built as the self-test is built (it holds the whole self-test, main renamed): one host
    # compile of the self-test's code checks it builds and serves the hook's tests.
    run([nvcc_or_skip(), f"-arch={ARCH}", "-std=c++17", "-O3", *WERROR, f"-I{exported}", str(source), str(library),
         "-o", str(binary)])
    return binary


def call(binary: Path, *args, stdin: str | None = None) -> list[str]:
    return run([str(binary), *map(str, args)], input=stdin).stdout.splitlines()


def bits(line: str, dtype: str) -> np.ndarray:
    values = np.array([int(b) for b in line.split()], dtype=np.uint16)
    return values.view(np.float16) if dtype == "float16" else values


@pytest.mark.parametrize("dtype", DTYPES)
def test_hook_inputs_and_reference_match_the_python_family(harness, dtype):
    for m, n, b in [(1, 1, 1), (3, 5, 2), (7, 33, 8), (5, 70, 3)]:
        for c in range(4):
            lines = call(harness, "inputs", dtype, m, n, b, c, 40 + c)
            A, x, y = bits(lines[0], dtype).reshape(m, n), bits(lines[1], dtype), bits(lines[2], dtype)
            x, y = (x, y) if b == 1 else (x.reshape(n, b), y.reshape(m, b))
            alpha, beta = map(float, lines[3].split())
            python_case = FAMILY.validation_cases(FAMILY.problem(dtype, m=m, n=n, batch=b))[min(c, 2)]
            if c == 3:
                python_case = FAMILY.validation_cases(FAMILY.problem(dtype, m=m, n=n, batch=b))[0]
            assert (alpha, beta) == (python_case["alpha"], python_case["beta"]), c
            values = {k: decoded(v, dtype) for k, v in (("A", A), ("x", x), ("y", y))}
            if beta == 0.0:
                assert np.isnan(values["y"]).all()
            else:
                assert np.isfinite(values["y"]).all()
            bound = (128, 240) if c == 2 else (-0.5, 0.5)
            assert bound[0] <= values["A"].min() and values["A"].max() <= bound[1]
            assert bound[0] <= values["x"].min() and values["x"].max() <= bound[1]
            problem = FAMILY.problem(dtype, m=m, n=n, batch=b)
            inputs = {"A": A, "x": x, "y": y, "alpha": alpha, "beta": beta}
            ref = np.array([float(v) for v in lines[4].split()])
            magnitude = np.array([float(v) for v in lines[5].split()])
            np.testing.assert_allclose(ref, FAMILY.reference(problem, inputs).ravel(), rtol=1e-12, atol=1e-300)
            np.testing.assert_allclose(magnitude, FAMILY.reference_magnitude(problem, inputs).ravel(), rtol=1e-12)
    # The same seed repeats a run's inputs; another does not.
    first = call(harness, "inputs", dtype, 4, 9, 2, 0, 5)
    assert first == call(harness, "inputs", dtype, 4, 9, 2, 0, 5) != call(harness, "inputs", dtype, 4, 9, 2, 0, 6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_hook_error_passes_right_outputs_and_catches_wrong_ones(harness, dtype):
    tolerance = TOLERANCES[dtype]
    m, n, b = 9, 300, 3
    for c in range(4):
        lines = call(harness, "inputs", dtype, m, n, b, c, 60 + c)
        ref = np.array([float(v) for v in lines[4].split()])

        def error_of(values):
            encoded = to_storage(np, np.asarray(values, dtype=np.float32), dtype).view(np.uint16)
            out = call(harness, "error", dtype, m, n, b, c, 60 + c, stdin=" ".join(map(str, encoded.tolist())) + "\n")
            return float(out[0]), (out[1] if len(out) > 1 else "")

        error, why = error_of(ref)
        assert why == "" and error <= tolerance / 2, (c, error)
        error, why = error_of(np.full_like(ref, np.nan))
        assert error == math.inf and "NaN/inf" in why
        error, why = error_of(ref * 1.02)
        assert why == "" and error > tolerance



# -- tensor cores (x_path=mma) ------------------------------------------------------------------------

def test_mma_variants_are_whole_warps_of_128_bit_loads():
    mma_configs = [c for c in all_configs() if c["x_path"] == "mma" and c["split_k"] == 1 and c["a_buffers"] == 1
                   and c["min_blocks"] == 1]
    assert len(mma_configs) == 400  # 200 geometries and tiles, each with row_align scalar and peeled
    for c in mma_configs:
        assert c["pack_width"] == 8 and c["threads_per_row"] >= 32 and c["reduce"] == "shfl"
        assert c["rows_per_group"] <= 2 and c["rows_per_group"] * c["unroll"] <= 4
        groups = 32 * c["warps_per_block"] // c["threads_per_row"]
        assert FAMILY.rows_per_block(c) == 16 * c["rows_per_group"] * groups
    # every batch tile has tensor-core variants (a tile of 8 vectors costs the same mma as 1)
    assert {c["batch_tile"] for c in mma_configs} == {1, 2, 4, 8}
    with pytest.raises(Exception, match="pack_width=8 only"):
        config(x_path="mma", pack_width=4)
    with pytest.raises(Exception, match="threads_per_row >= 32"):
        config(x_path="mma", threads_per_row=16)


def test_mma_overshoot_counts_the_columns_a_row_group_covers():
    # A row group of tpr lanes covers tpr columns per step (32 per warp), not tpr * 8.
    c = config(x_path="mma", threads_per_row=32, batch_tile=8, unroll=2)
    assert FAMILY.reject_reason(FAMILY.problem(m=4096, n=16, batch=8), c) is None
    wide = config(x_path="mma", threads_per_row=256, warps_per_block=8, batch_tile=8, unroll=1)
    assert "spans over twice" in FAMILY.reject_reason(FAMILY.problem(m=4096, n=64, batch=8), wide)


def emulate_mma(config, A, x, j0, alpha, beta, y, vector_ok):
    """The mma template's indexing in NumPy: each block, group, warp and lane of the launch loads
    what the template loads into its fragments, the PTX m16n8k16 layouts multiply them, the
    group's warps are summed and the lanes store what the template stores. A mirror of the index
    arithmetic (the hardware's own layout is checked by the GPU tests)."""
    m, n = A.shape
    batch = x.shape[1]
    tpr, rpg, unroll, bt = config["threads_per_row"], config["rows_per_group"], config["unroll"], config["batch_tile"]
    wpr, groups = tpr // 32, 32 * config["warps_per_block"] // tpr
    step, chunk = 32 * wpr, 32 * wpr * unroll
    nv = min(bt, batch - j0)
    blocks = -(-m // FAMILY.rows_per_block(config))
    out = y.copy()
    for block in range(blocks):
        for group in range(groups):
            tile0 = block * groups * 16 * rpg + group * 16 * rpg
            acc = np.zeros((wpr, rpg, 32, 4))  # per warp of the group, tile, lane, accumulator
            for kw in range(wpr):
                for c0 in range(0, n, chunk):
                    for u in range(unroll):
                        halves, xv = {}, {}  # what each lane loads: 8 halves per row, 8 of x
                        for lane in range(32):
                            g, t = lane // 4, lane % 4
                            col = c0 + u * step + kw * 32 + 8 * t
                            for r in range(rpg):
                                for h in range(2):
                                    row = tile0 + 16 * r + 8 * h + g
                                    vals = np.zeros(8)
                                    for k in range(8):
                                        ok = (col < n) if vector_ok else (col + k < n)
                                        if row < m and ok:
                                            vals[k] = A[row, col + k]
                                    halves[lane, r, h] = vals
                            xv[lane] = np.array([x[col + k, j0 + g] if (g < nv and col + k < n) else 0.0
                                                 for k in range(8)])
                        for s in range(2):  # the template's two mmas: columns col + 4s .. col + 4s + 3
                            for r in range(rpg):
                                # registers as the template passes them: a0 = row g words 2s, a1 = row
                                # g+8 word 2s, a2 = row g word 2s+1, a3 = row g+8 word 2s+1; b0, b1 =
                                # x words 2s, 2s+1 (a word: halves (low, high)).
                                # PTX m16n8k16: a0 (g, 2t+e), a1 (g+8, 2t+e), a2 (g, 2t+8+e),
                                # a3 (g+8, 2t+8+e); b0 (k 2t+e, n g), b1 (k 2t+8+e, n g);
                                # c0c1 (g, n 2t+e), c2c3 (g+8, n 2t+e).
                                Amat, Bmat = np.zeros((16, 16)), np.zeros((16, 8))
                                for lane in range(32):
                                    g, t = lane // 4, lane % 4
                                    lo, hi = halves[lane, r, 0], halves[lane, r, 1]
                                    regs = [lo[4 * s:4 * s + 2], hi[4 * s:4 * s + 2], lo[4 * s + 2:4 * s + 4],
                                            hi[4 * s + 2:4 * s + 4]]
                                    bregs = [xv[lane][4 * s:4 * s + 2], xv[lane][4 * s + 2:4 * s + 4]]
                                    for e in range(2):
                                        Amat[g, 2 * t + e] = regs[0][e]
                                        Amat[g + 8, 2 * t + e] = regs[1][e]
                                        Amat[g, 2 * t + 8 + e] = regs[2][e]
                                        Amat[g + 8, 2 * t + 8 + e] = regs[3][e]
                                        Bmat[2 * t + e, g] = bregs[0][e]
                                        Bmat[2 * t + 8 + e, g] = bregs[1][e]
                                C = Amat @ Bmat
                                for lane in range(32):
                                    g, t = lane // 4, lane % 4
                                    acc[kw, r, lane] += [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t],
                                                         C[g + 8, 2 * t + 1]]
            total = acc.sum(axis=0)
            for r in range(rpg):
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    for i in range(4):
                        h, j = i // 2, 2 * t + i % 2
                        row = tile0 + 16 * r + 8 * h + g
                        if row < m and j < nv:
                            value = alpha * total[r, lane, i]
                            out[row, j0 + j] = value if beta == 0.0 else beta * out[row, j0 + j] + value
    return out


@pytest.mark.parametrize("params, shape, vector_ok", [
    ({"threads_per_row": 32, "warps_per_block": 2, "rows_per_group": 1, "unroll": 2, "batch_tile": 8}, (37, 70, 5), True),
    ({"threads_per_row": 64, "warps_per_block": 4, "rows_per_group": 2, "unroll": 1, "batch_tile": 4}, (50, 136, 6), True),
    ({"threads_per_row": 32, "warps_per_block": 1, "rows_per_group": 2, "unroll": 1, "batch_tile": 2}, (19, 37, 3), False),
])
def test_mma_fragment_mapping_computes_the_product(params, shape, vector_ok):
    c = config(x_path="mma", **params)
    m, n, batch = shape
    rng = np.random.default_rng(3)
    if vector_ok:
        n -= n % 8
    A, x = rng.random((m, n)) - 0.5, rng.random((n, batch)) - 0.5
    y = np.full((m, batch), np.nan)
    for j0 in FAMILY.tiles(FAMILY.problem(m=m, n=n, batch=batch), c):
        y = emulate_mma(c, A, x, j0, 1.5, 0.0, y, vector_ok)
    np.testing.assert_allclose(y, 1.5 * (A @ x), rtol=1e-12, atol=1e-12)


def test_mma_template_uses_the_emulated_layout():
    source = render(FAMILY, "float16", config(x_path="mma", batch_tile=8))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in source
    assert "bf16.bf16" in render(FAMILY, "bfloat16", config(x_path="mma", batch_tile=8))
    # the index arithmetic emulate_mma mirrors
    for fragment in ("const int g = wl / 4, t = wl % 4;",
                     "const long long col = c0 + u * STEP + kw * 32 + 8 * t;",
                     "const long long row = tile0 + 16 * r + 8 * h + g;",
                     "mma_16x8x16(acc[r], aw[r][0][u][2 * s], aw[r][1][u][2 * s], aw[r][0][u][2 * s + 1],",
                     "aw[r][1][u][2 * s + 1], xw[u][2 * s], xw[u][2 * s + 1]);",
                     "const int h = i / 2, j = 2 * t + i % 2;",
                     # x staged in shared memory: column pairs (even column in the low half) per
                     # vector, and a lane's fragment the 8 columns col .. col + 7 of vector g
                     "const unsigned short* src = x + c * ldx + j0;",
                     "x_words(x, c0 + CHUNK + 2 * p, limit, ldx, j0, nv, x_whole, x_even[i]);",
                     "x_words(x, c0 + CHUNK + 2 * p + 1, limit, ldx, j0, nv, x_whole, x_odd[i]);",
                     "x_tile[buffer ^ 1][j][p] = __byte_perm(x_even[i][j / 2], x_odd[i][j / 2], (j % 2) ? 0x7632 : 0x5410);",
                     "x_tile[buffer][g][(u * STEP + kw * 32 + 8 * t) / 2]"):
        assert fragment in source, fragment


# -- programmatic dependent launch -----------------------------------------------------------------------

PDL_CONFIGS = [config(), config(x_path="smem", batch_tile=4, unroll=1),
               config(threads_per_row=128, reduce="smem", rows_per_group=2, batch_tile=8, pack_width=4, unroll=1),
               config(x_path="mma", batch_tile=8, rows_per_group=2),
               config(x_path="mma", threads_per_row=128, batch_tile=1, unroll=2),
               config(x_path="mma", threads_per_row=256, warps_per_block=8, batch_tile=8, row_align="peeled"),
               config(x_path="smem", threads_per_row=128, rows_per_group=2, load_schedule="step", row_align="peeled"),
               config(x_path="smem", threads_per_row=128, rows_per_group=2, load_schedule="early", row_align="peeled"),
               config(x_path="smem", threads_per_row=32, unroll=4, load_schedule="early"),
               config(x_path="mma", threads_per_row=256, warps_per_block=8, batch_tile=4, unroll=2, row_align="peeled",
                      split_k=4),
               config(x_path="mma", threads_per_row=128, warps_per_block=4, batch_tile=8, rows_per_group=2, unroll=2,
                      split_k=2)]


@pytest.mark.parametrize("index", range(len(PDL_CONFIGS)))
def test_pdl_variant_waits_after_the_first_weights_and_before_x(index):
    from autogen.core.render import PDL_SUFFIX
    c = PDL_CONFIGS[index]
    plain, pdl = render(FAMILY, "float16", c), render(FAMILY, "float16", c, pdl=True)
    assert "griddepcontrol" not in plain and "pdl" not in plain
    assert f"{FAMILY.kernel_name('float16', c)}{PDL_SUFFIX}(" in pdl
    assert pdl.count('asm volatile("griddepcontrol.wait') == 1
    assert pdl.count('asm volatile("griddepcontrol.launch_dependents') == 1
    body = pdl[pdl.index("extern \"C\" __global__"):]
    wait = body.index("asm volatile(\"griddepcontrol.wait")
    first_a = body.index("load_weights")
    x_reads = [body.index(p) for p in ("__ldg(x", "load_scalar(x", "x + c * BT", "x + g", "x_words(x") if p in body]
    y_read = body.index("to_float(*out)" if c["x_path"] == "mma" else "to_float(out[j])")
    assert first_a < wait < min(x_reads) and wait < y_read
    # no L2 prefetch of whole rows; the dependents are released after the last load, before the stores
    assert "prefetch.global" not in body
    assert re.search(r"for \(long long c0 = (0|c_first);", body).start() < body.index('asm volatile("griddepcontrol.launch_dependents') < y_read


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_pdl_variants_compile_without_spills(tmp_path, arch):
    from nvcc_tools import nvcc_compile
    sources = [render(FAMILY, d, c, pdl=True) for d in DTYPES for c in PDL_CONFIGS]
    report = nvcc_compile(sources, arch, tmp_path)
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", report))
    assert all(f == "0" for f in re.findall(r"(\d+) bytes stack frame", report))
    source = tmp_path / "pdl.cu"
    source.write_text(render(FAMILY, "float16", PDL_CONFIGS[3], pdl=True))
    ptx = tmp_path / "pdl.ptx"
    subprocess.run([nvcc_or_skip(), f"-arch={arch}", "-ptx", "-o", str(ptx), str(source)], check=True)
    text = ptx.read_text()
    assert ("griddepcontrol.wait" in text) == (arch == "sm_90")
    assert "mma.sync.aligned.m16n8k16" in text


def test_default_config_per_shape():
    assert FAMILY.default_config() == config()
    assert FAMILY.default_config(FAMILY.problem(m=4096, n=4096))["unroll"] == 4  # 4 packs in flight
    assert FAMILY.default_config(FAMILY.problem(m=4096, n=16))["unroll"] == 2
    for batch, tile in ((2, 2), (3, 4), (8, 8), (20, 8)):
        c = FAMILY.default_config(FAMILY.problem(m=4096, n=4096, batch=batch))
        assert c["x_path"] == "mma" and c["batch_tile"] == tile
        assert FAMILY.reject_reason(FAMILY.problem(m=4096, n=4096, batch=batch), c) is None
        # 4096 rows: 256 blocks of one 16-row tile, 8 warps splitting the columns
        assert FAMILY.launch(FAMILY.problem(m=4096, n=4096, batch=batch), c).grid == (256, 1, 1)
        assert c["threads_per_row"] == 256 and c["warps_per_block"] == 8


def test_warm_start_gives_other_batches_winners_this_batch_tile():
    from types import SimpleNamespace

    from autogen.search import warmstart

    def winner(shape_key, **params):
        trial = SimpleNamespace(family="hgemv", dtype="float16", shape_key=shape_key,
                                params=dict(FAMILY.default_params, **params))
        return SimpleNamespace(trial=trial)

    db = SimpleNamespace(winners=lambda **_: [winner("m=4096,n=4096,batch=1", threads_per_row=64),
                                              winner("m=4096,n=4096,batch=8", x_path="mma", threads_per_row=256,
                                                     warps_per_block=8, unroll=4, batch_tile=8)])
    device = SimpleNamespace(name="GPU", compute_capability="9.0")
    problem = FAMILY.problem(m=4096, n=4096, batch=4)
    seeds = warmstart.seeds(db, device, FAMILY, problem, True)
    assert all(s["batch_tile"] == 4 for s in seeds)
    # both winners re-tiled for 4 vectors, nearest (batch 8) first; then the family's own seeds not
    # among them (256 blocks of 16 rows: the default split over 2 blocks)
    assert [(s["x_path"], s["split_k"]) for s in seeds] == [("mma", 1), ("ldg", 1), ("mma", 2)]
    # the batch-8 winner re-tiled is this batch's default: tried once
    assert seeds[0] == FAMILY.default_config(problem).as_dict()


def test_a_winner_of_aligned_rows_is_adapted_to_long_rows_off_the_boundary():
    # seed_from (the warm start, and the dispatcher before a shape is tuned): a winner that would
    # read rows off the 16-byte boundary element by element takes its peeled twin, else the default
    aligned_ldg = dict(FAMILY.default_params, threads_per_row=128, warps_per_block=4, rows_per_group=2, unroll=2,
                       tail="peeled")
    odd = FAMILY.problem(m=3000, n=4099, batch=1)
    assert FAMILY.seed_from(odd, aligned_ldg) == FAMILY.default_config(odd).as_dict()
    assert FAMILY.space.check(FAMILY.seed_from(odd, aligned_ldg))["row_align"] == "peeled"
    mma = dict(FAMILY.default_params, x_path="mma", threads_per_row=256, warps_per_block=8, unroll=4, batch_tile=4)
    twin = FAMILY.seed_from(FAMILY.problem(m=3000, n=4099, batch=3), mma)
    assert {k: v for k, v in twin.items() if k != "row_align"} == {k: v for k, v in mma.items() if k != "row_align"}
    assert twin["row_align"] == "peeled"
    # rows on the boundary, short odd rows, and a pack that divides n keep the winner's form
    assert FAMILY.seed_from(FAMILY.problem(m=3000, n=4096, batch=1), aligned_ldg) == {**aligned_ldg, "batch_tile": 1}
    assert FAMILY.seed_from(FAMILY.problem(m=300, n=1003, batch=1), aligned_ldg)["row_align"] == "scalar"
    half2 = dict(aligned_ldg, pack_width=2)
    assert FAMILY.seed_from(FAMILY.problem(m=3000, n=4098, batch=1), half2) == half2


def test_warm_start_tries_this_shape_in_the_sibling_dtype_first():
    from types import SimpleNamespace

    from autogen.search import warmstart

    def winner(dtype, shape_key, **params):
        trial = SimpleNamespace(family="hgemv", dtype=dtype, shape_key=shape_key,
                                params=dict(FAMILY.default_params, **params))
        return SimpleNamespace(trial=trial)

    stored = [winner("bfloat16", "m=4096,n=11008,batch=1", threads_per_row=128),  # nearest same-dtype
              winner("float16", "m=4096,n=14336,batch=1", threads_per_row=4, pack_width=2),  # sibling, other shape
              winner("float16", "m=4096,n=11008,batch=1", threads_per_row=256, pack_width=8,
                     warps_per_block=8)]
    db = SimpleNamespace(winners=lambda dtype, **_: [w for w in stored if w.trial.dtype == dtype])
    device = SimpleNamespace(name="GPU", compute_capability="9.0")
    seeds = warmstart.seeds(db, device, FAMILY, FAMILY.problem("bfloat16", m=4096, n=11000), True)
    # float16's winner of 4096 x 11000? none: only the same-dtype neighbour, then the defaults
    assert seeds[0]["threads_per_row"] == 128 and all(s["threads_per_row"] != 4 for s in seeds)
    seeds = warmstart.seeds(db, device, FAMILY, FAMILY.problem("bfloat16", m=4096, n=11008), True)
    assert (seeds[0]["threads_per_row"], seeds[0]["pack_width"]) == (256, 8)  # this shape in float16
    assert all(s["threads_per_row"] != 4 for s in seeds)  # a sibling's other shapes are not seeds


def test_long_rows_of_one_vector_also_seed_the_long_row_config():
    wide = FAMILY.seed_configs(FAMILY.problem("bfloat16", m=4096, n=11008))
    assert wide[0] == FAMILY.default_config(FAMILY.problem("bfloat16", m=4096, n=11008))
    checked = ["hgemv_bf16_tpr32_pw8_wpb4_rpg1_u4_xldg_rshfl_bt1", "hgemv_bf16_tpr128_pw8_wpb4_rpg2_u2_xldg_rshfl_bt1",
               "hgemv_bf16_tpr256_pw8_wpb8_rpg2_u2_xldg_rsmem_bt1"]
    # Each seed, then each seed's tail=peeled twin.
    assert [FAMILY.kernel_name("bfloat16", c) for c in wide] == checked + [k + "_tailpeeled" for k in checked]
    tall = FAMILY.seed_configs(FAMILY.problem("float16", m=11008, n=4096))
    assert [FAMILY.kernel_name("float16", c) for c in tall[1:3]] == [
        "hgemv_f16_tpr128_pw8_wpb4_rpg2_u2_xldg_rshfl_bt1", "hgemv_f16_tpr256_pw8_wpb8_rpg2_u2_xldg_rshfl_bt1_lsstep"]
    assert all(c["tail"] == "peeled" for c in tall[3:]) and len(tall) == 6
    assert len(FAMILY.seed_configs(FAMILY.problem("float16", m=4096, n=512))) == 2  # the default and its twin
    # a batch: the tensor-core default, and (256 blocks of 16 rows) its split over 2 blocks
    assert [c["split_k"] for c in FAMILY.seed_configs(FAMILY.problem("float16", m=4096, n=11008, batch=4))] == [1, 2]


def test_an_output_below_fp16s_smallest_normal_passes_when_correctly_rounded():
    # 1 x 1: y = 1.5 a x of two small inputs lands among fp16's subnormals, stored with a fixed
    # spacing of 2^-24. Rounded correctly it was still off by more than the tolerance of itself
    # (1.26e-3 > 1e-3: docs/families/hgemv.md, Validation); the magnitude's floor (the smallest normal) admits it.
    problem = FAMILY.problem("float16", m=1, n=1, batch=1)
    case = FAMILY.validation_cases(problem)[0]
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(0), case)
    candidates = [(np.float16(a), np.float16(b)) for a in np.linspace(0.002, 0.006, 41) for b in np.linspace(0.002, 0.006, 41)]
    exact = [case["alpha"] * float(a) * float(b) for a, b in candidates]
    off = [abs(float(np.float16(e)) - e) / e for e in exact]
    worst = int(np.argmax(off))
    assert off[worst] > TOLERANCES["float16"]  # the old metric rejected this correct result
    inputs["A"][...] = candidates[worst][0]
    inputs["x"][...] = candidates[worst][1]
    expected = FAMILY.reference(problem, inputs)
    inputs["y"] = np.array([expected[0]], dtype=np.float16)
    error, reason = FAMILY.compare(problem, inputs, expected, FAMILY.reference_magnitude(problem, inputs))
    assert reason == "" and error <= TOLERANCES["float16"] / 2
    inputs["y"] = np.array([2 * expected[0]], dtype=np.float16)  # a doubled result is still caught
    error, _ = FAMILY.compare(problem, inputs, expected, FAMILY.reference_magnitude(problem, inputs))
    assert error > TOLERANCES["float16"]


# -- rows off the 16-byte boundary (row_align=peeled) ----------------------------------------------


def peeled_rows(m, n, c):
    """Every row each block of the launch computes, as the template's row mapping gives them."""
    rows_per_block = FAMILY.rows_per_block(c)
    pack = 8 if c["x_path"] == "mma" else c["pack_width"]
    by_class = n % pack != 0
    blocks = FAMILY.launch(FAMILY.problem(m=m, n=n), c).grid[0]
    for b in range(blocks):
        start = (b // pack) * pack * rows_per_block + b % pack if by_class else b * rows_per_block
        yield b, [start + k * (pack if by_class else 1) for k in range(rows_per_block)]


@pytest.mark.parametrize("m, n", [(1, 4099), (130, 4099), (3000, 4097), (300, 1003), (129, 4096)])
def test_peeled_rows_cover_every_row_once_and_share_a_head_per_block(m, n):
    for c in (config(x_path="mma", row_align="peeled", threads_per_row=256, warps_per_block=8, rows_per_group=2),
              config(x_path="smem", row_align="peeled", threads_per_row=32, rows_per_group=2, pack_width=4)):
        pack = 8 if c["x_path"] == "mma" else c["pack_width"]
        seen = []
        for _, rows in peeled_rows(m, n, c):
            live = [r for r in rows if r < m]
            seen += live
            # all of a block's rows start the same number of elements before a pack boundary
            assert len({(-r * n) % pack for r in live}) <= 1
        assert sorted(seen) == list(range(m))


def test_peeled_rows_render_the_same_mapping_and_host_grid():
    c = config(x_path="mma", row_align="peeled", threads_per_row=256, warps_per_block=8)
    source = render(FAMILY, "float16", c, host_launcher=True)
    assert "_rapeeled" in FAMILY.kernel_name("float16", c)
    for fragment in ("const bool by_class = (n % 8) != 0;",
                     "? (long long)(blockIdx.x / 8) * (8 * GROUPS * 16 * RPG) + blockIdx.x % 8",
                     "const long long row = block_row0 + (tile0 + 16 * r + 8 * h + g) * row_stride;",
                     "for (long long c0 = 0; c0 < n - head; c0 += CHUNK)",
                     "const int period = (n % 8) != 0 ? 8 : 1;",
                     "const dim3 grid((unsigned int)(((m - 1) / (16 * period) + 1) * period));"):
        assert fragment in source, fragment
    assert FAMILY.launch(FAMILY.problem(m=3000, n=4099), c).grid == (192, 1, 1)  # 24 windows of 8 blocks
    assert FAMILY.launch(FAMILY.problem(m=3000, n=4096), c).grid == (188, 1, 1)
    with pytest.raises(InvalidConfigError, match="row_align=peeled with x_path=ldg takes whole warps a row"):
        config(row_align="peeled", threads_per_row=16)
    with pytest.raises(InvalidConfigError, match="computes up to 4 vectors"):
        config(row_align="peeled", batch_tile=8)


def test_rows_in_flight_render_their_own_body():
    # row_align=peeled through x_path=ldg: whole warps a row, one row a group on consecutive rows
    # (no windows of blocks), each warp's share of the packs and their x requested before the math
    c = config(x_path="ldg", row_align="peeled", threads_per_row=128, warps_per_block=8, unroll=4)
    source = render(FAMILY, "float16", c, host_launcher=True)
    for fragment in ("constexpr int WPR = 4;", "constexpr int GROUPS = 2;", "constexpr int RPG = 1;",
                     "constexpr int BT = 1;", "ld.global.L1::evict_first.v4.u32",
                     "__shared__ float warp_sum[RPG][BT][8];", "const dim3 grid((unsigned int)((m - 1) / 2 + 1));"):
        assert fragment in source, fragment
    # one rendering of the passes per offset of x from a unit boundary: 8 at one vector, 2 at four
    assert source.count("asm volatile(\"ld.global.v4.u32") == 8 * 2 - 1  # units p and, shifted, p + 1
    four = render(FAMILY, "float16", config(x_path="ldg", row_align="peeled", threads_per_row=128, warps_per_block=8,
                                            unroll=2, batch_tile=4))
    assert "switch ((head * BT) % PW)" in four and "case 0:" in four and "default:" in four and "case 4" not in four
    for absent in ("by_class", "x_tile", "griddepcontrol"):
        assert absent not in source, absent
    assert "griddepcontrol.wait" in render(FAMILY, "float16", c, pdl=True)
    assert FAMILY.launch(FAMILY.problem(m=1000, n=4103), c).grid == (500, 1, 1)
    # one warp a row: no shared memory, no barrier
    one = render(FAMILY, "bfloat16", config(x_path="ldg", row_align="peeled", threads_per_row=32, pack_width=4))
    assert "__syncthreads" not in one and "ld.global.L1::evict_first.v2.u32" in one
    # two rows a group, 8 apart: windows of 8 blocks of 2 groups, in the host launcher as in autogen
    pair = config(x_path="ldg", row_align="peeled", threads_per_row=128, warps_per_block=8, unroll=2, rows_per_group=2)
    assert "const dim3 grid((unsigned int)(((m - 1) / (32) + 1) * 8));" in render(FAMILY, "float16", pair,
                                                                                  host_launcher=True)
    assert FAMILY.launch(FAMILY.problem(m=1000, n=4103), pair).grid == (256, 1, 1)  # 32 windows of 8 blocks


@pytest.mark.parametrize("m", [1, 7, 8, 9, 31, 33, 1000, 3001])
@pytest.mark.parametrize("tpr, wpb, rpg, pw", [(128, 8, 2, 8), (32, 8, 4, 8), (64, 2, 2, 4), (256, 8, 4, 2),
                                               (32, 4, 1, 8)])
def test_rows_in_flight_groups_cover_every_row_once(m, tpr, wpb, rpg, pw):
    # the template's map from (block, group in block) to its rows, over the grid autogen launches:
    # each row 0..m-1 exactly once, and a group's rows pack_width apart (the same offset from a
    # pack boundary, so the same x)
    c = config(x_path="ldg", row_align="peeled", threads_per_row=tpr, warps_per_block=wpb, rows_per_group=rpg,
               pack_width=pw, unroll=1)
    source = render(FAMILY, "float16", c)
    assert "const long long first_row = (group / PW) * (PW * RPG) + group % PW;" in source
    assert "row[i] = first_row + (long long)PW * i;" in source
    groups_per_block = 32 * wpb // tpr
    blocks = FAMILY.launch(FAMILY.problem(m=m, n=4099), c).grid[0]
    rows = [(g // pw) * (pw * rpg) + g % pw + pw * i for g in range(blocks * groups_per_block) for i in range(rpg)]
    live = [r for r in rows if r < m]
    assert sorted(live) == list(range(m))
    # the exported host launcher's grid (C integer arithmetic) is the same
    host = render(FAMILY, "float16", c, host_launcher=True)
    windowed = re.search(r"const dim3 grid\(\(unsigned int\)\(\(\(m - 1\) / \((\d+)\) \+ 1\) \* (\d+)\)\);", host)
    consecutive = re.search(r"const dim3 grid\(\(unsigned int\)\(\(m - 1\) / (\d+) \+ 1\)\);", host)
    if windowed:
        rows_per_window, period = map(int, windowed.groups())
        assert ((m - 1) // rows_per_window + 1) * period == blocks
    else:
        assert rpg == 1 and ((m - 1) // int(consecutive.group(1)) + 1) == blocks


def test_old_points_render_without_row_align():
    # added with default scalar: a stored point lacking it completes to scalar and keeps its name
    stored = {k: v for k, v in config(x_path="mma", threads_per_row=256, warps_per_block=8).as_dict().items()
              if k != "row_align"}
    completed = FAMILY.space.check(FAMILY.space.complete(stored))
    assert completed["row_align"] == "scalar" and "ra" not in FAMILY.kernel_name("float16", completed)
    assert "row_align" not in render(FAMILY, "float16", completed)


def test_rows_off_the_boundary_default_to_rows_in_flight_then_tensor_cores_with_peeled_rows():
    # one to four vectors: rows in flight (x_path=ldg, row_align=peeled) in row groups; more: the tensor cores
    for batch, group, unroll in ((1, 2, 2), (2, 2, 2), (3, 2, 1), (4, 4, 1)):
        c = FAMILY.default_config(FAMILY.problem(m=3000, n=4099, batch=batch))
        assert (c["x_path"], c["row_align"], c["threads_per_row"], c["warps_per_block"], c["batch_tile"]) == (
            "ldg", "peeled", 128, 4, batch)
        assert (c["rows_per_group"], c["unroll"]) == (group, unroll)
        # the tensor-core form the default was before is seeded beside it, with its own tile
        seeds = FAMILY.seed_configs(FAMILY.problem(m=3000, n=4099, batch=batch))
        assert any(s["x_path"] == "mma" and s["row_align"] == "peeled" and s["threads_per_row"] == 256
                   and s["batch_tile"] == batch_tile_for(batch) and s["split_k"] == 1 for s in seeds)
    c = FAMILY.default_config(FAMILY.problem(m=3000, n=4099, batch=8))
    assert c["x_path"] == "mma" and c["row_align"] == "peeled" and c["batch_tile"] == 8
    seeds = FAMILY.seed_configs(FAMILY.problem(m=3000, n=4099, batch=1))
    assert any(s["row_align"] == "peeled" and s["x_path"] == "smem" for s in seeds)
    assert {(s["threads_per_row"], s["warps_per_block"], s["rows_per_group"], s["unroll"]) for s in seeds
            if s["x_path"] == "ldg" and s["row_align"] == "peeled"} == {(128, 4, 2, 2), (128, 4, 1, 4), (64, 4, 1, 4)}
    # short odd rows and aligned rows keep theirs
    assert FAMILY.default_config(FAMILY.problem(m=3000, n=1003, batch=1))["row_align"] == "scalar"
    assert FAMILY.default_config(FAMILY.problem(m=3000, n=4096, batch=1))["row_align"] == "scalar"
    assert FAMILY.default_config(FAMILY.problem(m=3000, n=4096, batch=4))["row_align"] == "scalar"


# -- the column split (split_k) ---------------------------------------------------------------------

SPLIT = config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=2, batch_tile=4, row_align="peeled",
               split_k=4)


def test_split_launches_a_cluster_per_block_of_row_tiles():
    # 3000 x 4099: 24 windows of 8 row blocks (row_align=peeled), each block a cluster of 4
    problem = FAMILY.problem(m=3000, n=4099, batch=3)
    assert FAMILY.launch(problem, SPLIT).grid == (192 * 4, 1, 1)
    assert FAMILY.launch(FAMILY.problem(m=3000, n=4096, batch=3), SPLIT).grid == (188 * 4, 1, 1)
    assert "_sk4" in FAMILY.kernel_name("float16", SPLIT)
    source = render(FAMILY, "float16", SPLIT, host_launcher=True)
    for fragment in ("__cluster_dims__(4, 1, 1)",
                     "const unsigned int tile_block = blockIdx.x / 4;",
                     "const unsigned int split = blockIdx.x % 4;",
                     "? (long long)(tile_block / 8) * (8 * GROUPS * 16 * RPG) + tile_block % 8",
                     "const long long c_first = (long long)split * CHUNK;",
                     "for (long long c0 = c_first; c0 < n - head; c0 += SPLIT * CHUNK)",
                     "if (kw == 0 && split == 0) {\n        for (int c = 0; c < head; ++c)",
                     "acc[r][i] += cluster_load(&split_sum[group][r * 4 + i][wl], s);",
                     "const dim3 grid((unsigned int)(((m - 1) / (16 * period) + 1) * period * 4));"):
        assert fragment in source, fragment
    # the combine runs after the block's own cross-warp sum, and only rank 0 stores y
    body = source[source.index('extern "C" __global__'):]
    # (the first `return` is sm_80's: blocks past the first of a cluster take no columns there)
    combined = body.rindex("if (split != 0) return;")
    assert body.index("partial[warp + w]") < body.index("cluster_barrier();") < combined < body.index("*out = from_float(")


@pytest.mark.parametrize("n, chunk, split", [(4099, 512, 4), (4103, 1024, 8), (5121, 256, 2)])
def test_split_blocks_take_every_chunk_once(n, chunk, split):
    # the loop each block of the cluster runs: c0 = split * CHUNK, step SPLIT * CHUNK, below n
    taken = sorted(c0 for s in range(split) for c0 in range(s * chunk, n, split * chunk))
    assert taken == list(range(0, n, chunk))


def test_split_is_for_few_row_blocks_and_enough_chunks(monkeypatch):
    import autogen.families._hgemv_constraints as constraints
    monkeypatch.setattr(constraints, "sm_count", lambda: 132)
    assert FAMILY.reject_reason(FAMILY.problem(m=3000, n=4099, batch=3), SPLIT) is None
    # 688 blocks of 16 rows fill the GPU (4 per SM) without a split
    assert "fill the GPU" in FAMILY.reject_reason(FAMILY.problem(m=11008, n=4097, batch=3), SPLIT)
    # 1000 columns are 2 chunks of 512: a split of 4 leaves blocks idle
    assert "without one" in FAMILY.reject_reason(FAMILY.problem(m=3000, n=1000, batch=3), SPLIT)
    with pytest.raises(InvalidConfigError, match="split_k > 1 needs x_path=mma"):
        config(x_path="smem", split_k=2)
    with pytest.raises(InvalidConfigError, match="one row group per block"):
        config(x_path="mma", threads_per_row=128, warps_per_block=8, split_k=2)


def test_old_points_render_without_split():
    stored = {k: v for k, v in config(x_path="mma", threads_per_row=256, warps_per_block=8).as_dict().items()
              if k != "split_k"}
    completed = FAMILY.space.check(FAMILY.space.complete(stored))
    assert completed["split_k"] == 1 and "sk" not in FAMILY.kernel_name("float16", completed)
    source = render(FAMILY, "float16", completed, host_launcher=True)
    assert "split_k" not in source and "cluster" not in source and "c_first" not in source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_split_host_launcher_builds_and_clusters_only_on_sm90(tmp_path, arch):
    source = tmp_path / "split.cu"
    source.write_text(render(FAMILY, "bfloat16", SPLIT, host_launcher=True))
    ptx = tmp_path / "split.ptx"
    subprocess.run([nvcc_or_skip(), f"-arch={arch}", "-ptx", "-o", str(ptx), str(source)], check=True)
    text = ptx.read_text()
    assert (".reqnctapercluster 4, 1, 1" in text) == (arch == "sm_90")
    assert ("mapa.shared::cluster" in text) == (arch == "sm_90")
    subprocess.run([nvcc_or_skip(), f"-arch={arch}", "-c", "-o", str(tmp_path / "split.o"), str(source)], check=True)


def test_few_row_blocks_seed_the_tensor_core_default_split_in_two(monkeypatch):
    import autogen.families._hgemv_constraints as constraints
    monkeypatch.setattr(constraints, "sm_count", lambda: 132)
    for batch in (1, 2, 3, 8):
        seeds = FAMILY.seed_configs(FAMILY.problem(m=1000, n=4103, batch=batch))
        tensor_cores = next(s for s in seeds if s["x_path"] == "mma")  # the default from batch 3 on
        assert FAMILY.space.check({**tensor_cores.as_dict(), "split_k": 2}) in seeds
    # 688 blocks of 16 rows already fill the GPU: no split seeded
    assert all(s["split_k"] == 1 for s in FAMILY.seed_configs(FAMILY.problem(m=11008, n=4097, batch=4)))


# -- A double-buffered in registers (a_buffers) and the register bound (min_blocks) ------------------

PREFETCH = config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=4, batch_tile=4, row_align="peeled",
                  a_buffers=2)


def test_double_buffered_a_requests_the_next_chunk_before_this_chunks_mma():
    assert FAMILY.kernel_name("float16", PREFETCH).endswith("_rapeeled_ab2")
    source = render(FAMILY, "float16", PREFETCH, host_launcher=True)
    body = source[source.index('extern "C" __global__'):]
    for fragment in ("unsigned int an[RPG][2][UNROLL][4];",
                     "for (long long c0 = 0; c0 < n - head; c0 += 2 * CHUNK) {",
                     "if (c0 + CHUNK < n - head) {",
                     "if (c0 + CHUNK >= n - head) break;",
                     "if (c0 + 2 * CHUNK < n - head) {"):
        assert fragment in body, fragment
    # the first chunk's A before x is staged; in the loop, an's loads before the mma on aw, and
    # aw's (two chunks on) before the mma on an: neither set is copied
    first_a, first_x = body.index("aw[r][h][u]);"), body.index("x_words(x, head + 2 * p")
    loop = body[body.index("c0 += 2 * CHUNK"):]
    assert first_a < first_x
    assert loop.index("an[r][h][u]);") < loop.index("acc[r], aw[r][0]") < loop.index("aw[r][h][u]);") \
        < loop.index("acc[r], an[r][0]")
    assert "aw[r][h][u][w] = an" not in body and "= an[" not in body


@pytest.mark.parametrize("n, chunk, split", [(4099, 1024, 1), (5121, 1024, 1), (300, 128, 1), (4103, 512, 2),
                                             (4099, 1024, 4), (1003, 256, 8), (100, 256, 1)])
def test_double_buffered_loop_multiplies_every_chunk_once_after_loading_it(n, chunk, split):
    # the loop as rendered, per block s of a cluster of `split`: A of chunk `first` before it, then
    # two chunks per iteration, each requesting the next one's A (guarded by the end) before its mma
    multiplied = []
    for s in range(split):
        step, loaded = split * chunk, {s * chunk} if s * chunk < n else set()
        c0 = s * chunk
        while c0 < n:
            if c0 + step < n:
                loaded.add(c0 + step)
            assert c0 in loaded
            multiplied.append(c0)
            if c0 + step >= n:
                break
            if c0 + 2 * step < n:
                loaded.add(c0 + 2 * step)
            assert c0 + step in loaded
            multiplied.append(c0 + step)
            c0 += 2 * step
        assert loaded <= set(multiplied)  # nothing requested past the block's last chunk
    assert sorted(multiplied) == list(range(0, n, chunk))


def test_min_blocks_bounds_the_registers_of_the_launch():
    bounded = config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=2, batch_tile=4, min_blocks=3)
    assert FAMILY.kernel_name("float16", bounded).endswith("_bt4_mb3")
    assert 'extern "C" __global__ void __launch_bounds__(256, 3)' in render(FAMILY, "float16", bounded)
    split = config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=2, split_k=2, min_blocks=2)
    assert "__launch_bounds__(256, 2) hgemv_" in render(FAMILY, "float16", split)
    assert 'void __launch_bounds__(256)\n' in render(FAMILY, "float16", config(x_path="mma", threads_per_row=256,
                                                                                  warps_per_block=8))
    with pytest.raises(InvalidConfigError, match="x_path=mma only"):
        config(x_path="smem", a_buffers=2)
    with pytest.raises(InvalidConfigError, match="x_path=mma only"):
        config(min_blocks=2)
    with pytest.raises(InvalidConfigError, match="no bound"):
        config(x_path="mma", threads_per_row=128, warps_per_block=4, min_blocks=3)
    with pytest.raises(InvalidConfigError, match="min_blocks=3 spills"):
        config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=4, min_blocks=3)
    with pytest.raises(InvalidConfigError, match="min_blocks=3 spills"):
        config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=2, a_buffers=2, min_blocks=3)


ROWS_IN_FLIGHT = dict(row_align="peeled", x_path="ldg", warps_per_block=8, pack_width=4)


def test_rows_in_flight_bounded_to_64_registers_at_three_and_four_vectors():
    # The four-vector winner at 3000 x 4099 on the H100 (docs/families/hgemv.md, "Rows in flight
    # bounded to 64 registers"), and the forms ptxas spills at 64 registers kept out.
    winner = config(**ROWS_IN_FLIGHT, threads_per_row=128, rows_per_group=4, unroll=1, batch_tile=4, min_blocks=4)
    assert FAMILY.kernel_name("float16", winner).endswith("_bt4_rapeeled_mb4")
    assert 'extern "C" __global__ void __launch_bounds__(256, 4)' in render(FAMILY, "float16", winner)
    assert config(**ROWS_IN_FLIGHT, threads_per_row=64, rows_per_group=2, unroll=2, batch_tile=3, min_blocks=4)
    for params, reason in (({"warps_per_block": 4, "threads_per_row": 128}, "256-thread blocks"),
                           ({"batch_tile": 2}, "three or four vectors"), ({"min_blocks": 3}, "min_blocks=4"),
                           ({"rows_per_group": 2, "unroll": 2}, "spill"), ({"pack_width": 8, "rows_per_group": 2}, "spill"),
                           ({"pack_width": 2, "rows_per_group": 4, "unroll": 2}, "spill")):
        base = {**ROWS_IN_FLIGHT, "threads_per_row": 128, "rows_per_group": 4, "unroll": 1, "batch_tile": 4,
                "min_blocks": 4, **params}
        with pytest.raises(InvalidConfigError, match=reason):
            config(**base)
    with pytest.raises(InvalidConfigError, match="rows in flight"):
        config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=1, batch_tile=4, min_blocks=4)


def test_four_vectors_on_rows_off_the_boundary_seed_the_bounded_rows_in_flight():
    def bounded_seeds(m, n, batch):
        return [c for c in FAMILY.seed_configs(FAMILY.problem(m=m, n=n, batch=batch))
                if c["min_blocks"] == 4 and c["x_path"] == "ldg"]
    seeds = bounded_seeds(3000, 4099, 4)
    assert len(seeds) == 1 and FAMILY.kernel_name("float16", seeds[0]) == \
        "hgemv_f16_tpr128_pw4_wpb8_rpg4_u1_xldg_rshfl_bt4_rapeeled_mb4"
    assert not bounded_seeds(3000, 4099, 3) and not bounded_seeds(3000, 4096, 4) and not bounded_seeds(3000, 4099, 1)


def test_rows_in_flight_bounded_to_64_registers_compile_without_spills_on_sm90(tmp_path):
    # One variant of each of the 21 bounded combinations (geometry and dtype taking turns): ptxas
    # must fit each in 64 registers with no local memory (the rule in rows_in_flight_registers).
    from nvcc_tools import nvcc_compile
    bounded = [c for c in all_configs() if c["min_blocks"] == 4]
    combos = {}
    for c in bounded:
        combos.setdefault((c["pack_width"], c["rows_per_group"], c["unroll"], c["batch_tile"]), []).append(c)
    assert len(combos) == 21
    sources = [render(FAMILY, DTYPES[i % 2], forms[i % len(forms)]) for i, forms in enumerate(combos.values())]
    report = nvcc_compile(sources, "sm_90", tmp_path)
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert len(registers) == 21 and max(registers) <= 64
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", report))
    assert all(f == "0" for f in re.findall(r"(\d+) bytes stack frame", report))


def test_old_points_render_without_a_buffers_or_min_blocks():
    plain = config(x_path="mma", threads_per_row=256, warps_per_block=8, row_align="peeled")
    stored = {k: v for k, v in plain.as_dict().items() if k not in ("a_buffers", "min_blocks")}
    completed = FAMILY.space.check(FAMILY.space.complete(stored))
    assert completed == plain and FAMILY.kernel_name("float16", completed).endswith("_rapeeled")
    source = render(FAMILY, "float16", completed, host_launcher=True)
    assert "a_buffers" not in source and "min_blocks" not in source and "an[" not in source


NEW_FORMS = [PREFETCH,
             config(x_path="mma", threads_per_row=256, warps_per_block=8, rows_per_group=2, unroll=2, batch_tile=8,
                    row_align="peeled", a_buffers=2, min_blocks=2),
             config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=2, batch_tile=4, row_align="peeled",
                    min_blocks=3),
             config(x_path="mma", threads_per_row=256, warps_per_block=8, unroll=4, batch_tile=8, min_blocks=2),
             config(x_path="mma", threads_per_row=128, warps_per_block=4, rows_per_group=2, unroll=2, batch_tile=2,
                    a_buffers=2, split_k=4),
             config(x_path="mma", threads_per_row=64, warps_per_block=2, unroll=1, row_align="peeled", a_buffers=2)]


def test_double_buffered_and_bounded_forms_compile_for_sm90_without_spills(tmp_path):
    from nvcc_tools import nvcc_compile
    sources = [render(FAMILY, "float16", c) for c in NEW_FORMS]
    sources.append(render(FAMILY, "bfloat16", NEW_FORMS[0], pdl=True, host_launcher=True))
    report = nvcc_compile(sources, "sm_90", tmp_path)
    assert len(re.findall(r"Used \d+ registers", report)) == len(sources)
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", report))
    assert all(f == "0" for f in re.findall(r"(\d+) bytes stack frame", report))
    bounded = [int(r) for r in re.findall(r"Used (\d+) registers", report.split("_mb3'")[1])[:1]]
    assert bounded and bounded[0] <= 80  # 3 blocks of 256 threads per SM


def test_one_vector_on_rows_off_the_boundary_seeds_the_early_warp_a_row_form():
    # It won 4096 x 11007 and 11008 x 4097 at one vector on the H100 (docs/families/hgemv.md).
    seed = dict(x_path="smem", load_schedule="early", row_align="peeled", threads_per_row=32, unroll=4)
    def seeded(m, n, batch):
        return any(all(c[k] == v for k, v in seed.items()) for c in FAMILY.seed_configs(FAMILY.problem(m=m, n=n, batch=batch)))
    assert seeded(4096, 11007, 1) and seeded(1000, 4103, 1)
    assert not seeded(4096, 11008, 1) and not seeded(4096, 11007, 4)


def test_rows_off_the_boundary_also_seed_the_register_bounded_forms():
    # min_blocks won 5120 x 5121 at every batch on the H100 (docs/families/hgemv.md): its twins are
    # seeded on rows off the 16-byte boundary, never on aligned rows.
    odd = FAMILY.seed_configs(FAMILY.problem("float16", m=5120, n=5121, batch=3))
    assert any(c["min_blocks"] > 1 for c in odd)
    assert all(c["min_blocks"] == 1 for c in FAMILY.seed_configs(FAMILY.problem("float16", m=5120, n=5120, batch=3)))
