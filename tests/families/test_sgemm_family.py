"""sgemm on the CPU: the space and its constraints, shape pruning, the plan (split-K is two
steps), the float64 reference, the kernel's index arithmetic re-derived in Python (every element
of C, of the A and B tiles and of k computed exactly once), the tightest variants through nvcc
with no spills, and the export self-test hook's host side against NumPy."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from autogen.errors import UsageError
from autogen.families import _gemm as sgemm_module
from autogen.families._gemm import SPACE, geometry, launch_bounds_cap
from autogen.gpu.device import sm_count
from autogen.core.registry import get_family
from autogen.core.render import render
from family_checks import held
from nvcc_tools import float_bits as floats, harness_error, harness_output as harness

FAMILY = get_family("sgemm")


def config(**changes):
    return FAMILY.space.check({**FAMILY.default_params, **changes})


def problem(m, n, k):
    return FAMILY.problem(m=m, n=n, k=k)


# -- space and constraints ------------------------------------------------------------------------


def test_space_is_thousands_of_points_and_the_default_is_valid():
    assert 5_000 <= FAMILY.space.size() <= 35_000  # the contract test renders every one
    assert FAMILY.default_config()["split_k"] == 1
    assert FAMILY.roofline == "compute" and FAMILY.dims == ("m", "n", "k")


@pytest.mark.parametrize("changes, reason", [
    ({"block_m": 16, "thread_m": 8}, "whole number of"),              # 16 rows, warp tile 32 rows
    ({"block_n": 16, "warp_layout": "4x8"}, "whole number of"),        # warp tile 32 columns
    ({"block_m": 256, "block_n": 256, "thread_m": 4, "thread_n": 8}, "threads per block"),  # 2048 / 32
    ({"block_m": 256, "block_n": 128, "block_k": 32, "pipeline": "async3"}, "shared memory"),  # 150 KiB
    ({"block_m": 256, "block_n": 128}, "registers"),  # 512 threads x 8 x 8 outputs: over 128 registers
    ({"split_k": 4, "store_width": 1}, "store_width must be 4"),
    ({"pipeline": "sync", "block_k": 32}, "spills"),
    ({"thread_n": 4, "block_n": 64, "fma_order": "ji"}, "8x8 thread tiles"),
])
def test_constraints_reject_what_cannot_compile_or_fit(changes, reason):
    params = {**FAMILY.default_params, **changes}
    problems = SPACE.violations(params)
    assert problems and any(reason in p for p in problems), problems


def test_every_valid_point_fits_the_limits():
    for c in FAMILY.space.enumerate():
        g = geometry(c)
        assert 32 <= g["threads"] <= 512 and g["threads"] % 32 == 0
        assert g["shared_bytes"] <= 48 * 1024
        assert g["registers"] <= g["register_cap"] <= 208
        assert c["block_m"] == g["warps_m"] * int(c["warp_layout"].split("x")[0]) * c["thread_m"]


# -- min_blocks: __launch_bounds__(threads, min_blocks) ---------------------------------------------


def test_launch_bounds_cap_is_the_register_file_over_the_resident_threads():
    assert launch_bounds_cap(256, 1) == 255 and launch_bounds_cap(256, 2) == 128
    assert launch_bounds_cap(512, 1) == 128 and launch_bounds_cap(512, 2) == 64
    assert launch_bounds_cap(128, 2) == 255  # 256 allowed: nothing capped
    assert launch_bounds_cap(256, 3) == 80  # 85, in units of 8
    assert launch_bounds_cap(96, 3) == 224  # 227 rounded down to a multiple of 8


def test_min_blocks_renders_into_launch_bounds_and_the_name():
    two = config(min_blocks=2)
    source = render(FAMILY, "float32", two)
    name = FAMILY.kernel_name("float32", two)
    assert name.endswith("_mb2_foij")
    assert f"__launch_bounds__(256, 2)\n{name}(" in source
    one = render(FAMILY, "float32", config())
    assert "__launch_bounds__(256)\n" + FAMILY.kernel_name("float32", config()) + "(" in one
    # The split-K init kernel keeps its own bounds.
    split = render(FAMILY, "float32", config(min_blocks=2, split_k=2, store_width=4))
    assert "__launch_bounds__(256)\n" in split and "__launch_bounds__(256, 2)\n" in split


@pytest.mark.parametrize("changes, reason", [
    # 128 threads x 2 blocks leave 256 registers: no cap, the min_blocks=1 kernel renamed.
    ({"block_m": 64, "block_n": 128, "min_blocks": 2}, "caps nothing"),
    # 4 x 4 tiles at 256 threads need under 128 registers anyway.
    ({"thread_m": 4, "thread_n": 4, "block_m": 64, "block_n": 64, "min_blocks": 2}, "caps nothing"),
    # 512 threads x 2 blocks: 64 registers, spills (sm_80) even with 4 x 4 tiles.
    ({"block_m": 128, "block_n": 256, "thread_m": 4, "thread_n": 8, "block_k": 8, "pipeline": "async2",
      "min_blocks": 2}, "it spills (ptxas)"),
    # Deep tiles staged in registers: far over the cap.
    ({"block_m": 64, "block_n": 256, "block_k": 16, "pipeline": "sync", "min_blocks": 2}, "it spills"),
    # cp.async with 16-deep 128 x 128 tiles: 146 estimated, spills on sm_90.
    ({"block_k": 16, "pipeline": "async2", "min_blocks": 2}, "pipeline=async2: it spills"),
    # Scalar loads staged in registers (141 estimated: within the slack, but spills on sm_80 and sm_90).
    ({"block_m": 32, "block_n": 256, "block_k": 16, "thread_m": 4, "vector_width": 1, "pipeline": "sync",
      "store_width": 1, "min_blocks": 2}, "vector_width=1"),
])
def test_min_blocks_constraint_rejects_what_caps_nothing_or_spills(changes, reason):
    problems = SPACE.violations({**FAMILY.default_params, **changes})
    assert problems and any(reason in p for p in problems), problems


def test_min_blocks_constraint_checks_threads_and_shared_memory_per_sm():
    params = {**FAMILY.default_params, "min_blocks": 2}
    assert sgemm_module._occupancy_fits(params) is None  # 16.9 KB x 2 of 164 KB
    small_sm = sgemm_module._occupancy_fits(params, sm_shared=2 * 16 * 1024)
    assert small_sm and "bytes of an SM" in small_sm
    big = {**params, "block_m": 256, "block_n": 256, "thread_m": 8, "thread_n": 8}  # 1024 threads
    assert "threads per SM" in (sgemm_module._occupancy_fits({**big, "min_blocks": 3}) or "")


def test_min_blocks_two_only_where_it_caps_256_thread_blocks():
    capped = [c for c in FAMILY.space.enumerate() if c["min_blocks"] == 2]
    assert 300 <= len(capped) <= 2000
    for c in capped:
        g = geometry(c)
        assert g["threads"] == 256 and g["launch_bounds_cap"] == 128 < g["registers"]
        slack = 13 if c["pipeline"].startswith("async") else 22
        assert g["registers"] <= 128 + slack
        assert c["vector_width"] == 4 or c["pipeline"].startswith("async")
    assert FAMILY.space.check({**FAMILY.default_params, "min_blocks": 2})  # the 4096^3 winner, capped


# -- seeds ---------------------------------------------------------------------------------------------


def names(configs):
    return [FAMILY.kernel_name("float32", c).removeprefix("sgemm_f32_") for c in configs]


def test_seeds_for_large_squares_start_with_the_capped_128x128_winner():
    for shape in [(4096, 4096, 4096), (8192, 8192, 8192), (4097, 4097, 4097)]:
        p = problem(*shape)
        seeds = FAMILY.seed_configs(p)
        assert 4 <= len(seeds) <= sgemm_module.SEEDS and len(set(seeds)) == len(seeds)
        assert names(seeds)[:3] == ["bm128_bn128_bk8_tm8_tn8_wl4x8_vw4_sw4_pad4_plregsedge_sk1_mb2_foji",
                                    "bm128_bn128_bk8_tm8_tn8_wl4x8_vw4_sw4_pad4_plregs_sk1_mb2_foij",
                                    "bm128_bn128_bk8_tm8_tn8_wl4x8_vw4_sw4_pad4_plregs_sk1_mb2_foji"]
        assert FAMILY.default_config(p) == seeds[0]
        assert sum(c["min_blocks"] == 2 for c in seeds) >= 3 and all(c["split_k"] == 1 for c in seeds)
        assert any(c["pipeline"].startswith("async") for c in seeds)
        assert all(FAMILY.reject_reason(p, c) is None and not SPACE.violations(c.as_dict()) for c in seeds)


def test_seeds_split_k_where_128x128_tiles_leave_the_gpu_under_one_wave():
    tall = problem(128, 12288, 4096)  # 96 tiles of 128 x 128
    seeds = FAMILY.seed_configs(tall)
    assert seeds[0]["split_k"] == 2 and seeds[0]["store_width"] == 4 and seeds[0]["min_blocks"] == 2
    assert all(FAMILY.tiles(tall, c) * c["split_k"] >= sm_count() for c in seeds)
    assert names(FAMILY.seed_configs(problem(12288, 128, 4096)))[0] == names(seeds)[0]
    # The same tiles split deeper (4 blocks per SM: split 8 won this shape, docs/benchmarks.md), second.
    assert seeds[1]["split_k"] == 8 and {**seeds[1].as_dict(), "split_k": 2} == seeds[0].as_dict()
    assert any(c["fma_order"] == "ji" for c in seeds)
    cube = problem(1024, 1024, 1024)  # 64 tiles: split 4 fills 256 blocks
    assert FAMILY.seed_configs(cube)[0]["split_k"] == 4
    skinny = problem(64, 64, 65536)  # 128-wide tiles pruned: 32 x 32 tiles split 64 ways
    seeds = FAMILY.seed_configs(skinny)
    assert seeds and all(c["block_m"] <= 64 and c["block_n"] <= 64 and c["split_k"] > 1 for c in seeds)
    assert seeds[0]["split_k"] * FAMILY.tiles(skinny, seeds[0]) >= sm_count()
    assert all(FAMILY.reject_reason(skinny, c) is None for c in seeds)


def test_default_config_without_a_problem_is_default_params_and_tiny_shapes_get_small_tiles():
    assert FAMILY.default_config().as_dict() == dict(FAMILY.default_params)
    tiny = FAMILY.default_config(problem(1, 1, 1))
    assert tiny["block_m"] == tiny["block_n"] == 32 and tiny["split_k"] == 1
    assert FAMILY.seed_configs(problem(7, 5, 9)) == [FAMILY.default_config(problem(7, 5, 9))]


def test_searches_start_from_the_family_seeds_after_the_nearest_winners(monkeypatch):
    import importlib.util
    from pathlib import Path

    from autogen.search import warmstart

    p = problem(4096, 4096, 4096)
    assert warmstart.seeds(None, None, FAMILY, p, False) == [c.as_dict() for c in FAMILY.seed_configs(p)]
    assert len(FAMILY.seed_configs(p)) > 1
    scripts = Path(__file__).resolve().parent.parent.parent / "scripts"
    monkeypatch.syspath_prepend(str(scripts))  # the script imports benchlib from its folder
    spec = importlib.util.spec_from_file_location("bench_sgemm", scripts / "bench_sgemm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # Shape budgets: every later shape keeps its minimum.
    import time
    assert bench.shape_limit(70, time.monotonic() + 1000, 8) == 70
    assert bench.shape_limit(70, time.monotonic() + 100, 8) == bench.MIN_SHAPE_S
    assert {shape for shape, *_ in bench.PLAN} == {
        (4096, 4096, 4096), (8192, 8192, 8192), (4097, 4097, 4097), (1024, 1024, 1024), (1000, 1000, 1000),
        (4096, 4096, 64), (128, 12288, 4096), (12288, 128, 4096), (64, 64, 65536)}
    assert sum(limit + bench.OVERHEAD_S for _, _, limit, _ in bench.PLAN) <= 410  # of the 420 s budget
    assert bench.PLAN[0][0] == (4096, 4096, 4096) and bench.PLAN[1][0] == (8192, 8192, 8192)  # seeded from it


def test_kernel_names_are_procedural():
    assert FAMILY.kernel_name("float32", FAMILY.default_config()) == \
        "sgemm_f32_bm128_bn128_bk8_tm8_tn8_wl4x8_vw4_sw4_pad4_plregs_sk1_mb1_foij"


# -- problems, pruning, plan ------------------------------------------------------------------------


def test_problem_validation():
    assert problem(4097, 1, 3).shape == {"m": 4097, "n": 1, "k": 3}
    with pytest.raises(UsageError, match="k must be between 1"):
        problem(4, 4, 0)
    with pytest.raises(UsageError, match="missing k"):
        FAMILY.problem(m=4, n=4)
    with pytest.raises(UsageError, match="too many tiles"):
        problem(2**31 - 1, 2**31 - 1, 1)


def test_reject_reasons():
    big = problem(4096, 4096, 4096)
    assert FAMILY.reject_reason(big, FAMILY.default_config()) is None
    assert "fill the GPU" in FAMILY.reject_reason(big, config(split_k=2, store_width=4))
    assert "small for" in FAMILY.reject_reason(big, config(block_m=32, block_n=32, thread_m=4, thread_n=4))
    skinny = problem(64, 64, 65536)
    assert "at least twice m" in FAMILY.reject_reason(skinny, FAMILY.default_config())
    split = config(block_m=32, block_n=32, thread_m=4, thread_n=4, split_k=32, store_width=4)
    assert FAMILY.reject_reason(skinny, split) is None
    assert "fewer than 2 k tiles" in FAMILY.reject_reason(problem(64, 64, 256), split)
    assert "block_k=32" in FAMILY.reject_reason(problem(64, 64, 8),
                                                config(block_m=32, block_n=32, thread_n=4, block_k=32))
    # Split-K only where the tiles leave the GPU under 2 waves.
    assert sm_count() == 132  # the H100 figure off-GPU
    tall = problem(128, 12288, 4096)
    assert FAMILY.reject_reason(tall, config(split_k=2, store_width=4)) is None  # 96 tiles


def test_plan_one_step_or_init_then_split():
    p = problem(1000, 37, 4100)
    steps = FAMILY.plan(p, FAMILY.default_config())
    assert [s.suffix for s in steps] == [""]
    assert steps[0].launch.grid == (8 * 1, 1, 1) and steps[0].launch.block == (256, 1, 1)
    split = config(split_k=8, store_width=4)
    steps = FAMILY.plan(p, split)
    assert [s.suffix for s in steps] == ["_init", ""]
    assert steps[1].launch.grid == (8, 8, 1)
    assert steps[0].launch.grid == (math.ceil(1000 * 37 / 256), 1, 1) and steps[0].launch.block == (256, 1, 1)
    inputs = {"A": "A", "B": "B", "C": "C", "alpha": 2.0, "beta": 0.5}
    assert held(steps[0].args(inputs))[0] == "C" and held(steps[0].args(inputs))[-1] == np.float32(0.5)
    assert held(steps[1].args(inputs))[:6] == ("A", "B", "C", 1000, 37, 4100)
    assert FAMILY.plan(problem(10**5, 10**5, 1), split)[0].launch.grid == (4096, 1, 1)  # capped, grid-stride


# -- data and reference -------------------------------------------------------------------------------


def test_inputs_poisoned_and_reference_matches_an_independent_formula():
    p = problem(7, 5, 9)
    rng = np.random.default_rng(0)
    zero = FAMILY.make_inputs(p, np, rng, {"alpha": 1.5, "beta": 0.0})
    assert np.isnan(zero["C"]).all() and zero["A"].shape == (7, 9) and zero["B"].shape == (9, 5)
    assert zero["A"].dtype == zero["B"].dtype == np.float32
    assert (np.abs(zero["A"]) <= 0.5).all() and (zero["A"] != 0).all()
    ref = FAMILY.reference(p, zero, np)
    loops = np.array([[1.5 * math.fsum(float(zero["A"][i, q]) * float(zero["B"][q, j]) for q in range(9))
                       for j in range(5)] for i in range(7)])
    assert ref.dtype == np.float64 and np.allclose(ref, loops, rtol=1e-13, atol=1e-15)
    both = FAMILY.make_inputs(p, np, rng, {"alpha": -0.75, "beta": 1.25})
    assert np.isfinite(both["C"]).all()
    want = -0.75 * np.einsum("ik,kj->ij", both["A"].astype(np.float64), both["B"].astype(np.float64)) \
        + 1.25 * both["C"].astype(np.float64)
    assert np.allclose(FAMILY.reference(p, both, np), want, rtol=1e-13, atol=1e-15)
    magnitude = FAMILY.reference_magnitude(p, both, np)
    assert (magnitude >= np.abs(FAMILY.reference(p, both, np)) - 1e-12).all()
    # A wrong result (one term of k dropped everywhere) fails the tolerance; fp32 rounding passes.
    fp32 = FAMILY.reference(p, both, np).astype(np.float32)
    assert FAMILY.compare(p, {**both, "C": fp32}, FAMILY.reference(p, both, np), magnitude, np)[0] < 1e-7
    dropped = FAMILY.reference(p, both, np) - (-0.75) * np.outer(both["A"][:, 0], both["B"][0]).astype(np.float64)
    bad = FAMILY.compare(p, {**both, "C": dropped.astype(np.float32)}, FAMILY.reference(p, both, np), magnitude, np)
    assert bad[0] > FAMILY.tolerance


def test_bytes_and_flops():
    p = problem(4096, 4096, 4096)
    assert FAMILY.flops(p) == 2 * 4096**3
    assert FAMILY.bytes_moved(p, FAMILY.timing_case(p)) == 4 * 3 * 4096**2
    assert FAMILY.bytes_moved(p, {"alpha": 1.0, "beta": 1.0}) == 4 * 4 * 4096**2


# -- the kernel's index arithmetic, as the template writes it -----------------------------------------


def tile_of(tile, tiles_m, tiles_n, group_m=8):
    per_group = group_m * tiles_n
    group = tile // per_group
    first = group * group_m
    rows = min(tiles_m - first, group_m)
    in_group = tile - group * per_group
    return first + in_group % rows, in_group // rows


@pytest.mark.parametrize("tiles_m, tiles_n", [(1, 1), (1, 7), (7, 1), (8, 8), (9, 5), (33, 17), (64, 64)])
def test_raster_visits_every_tile_once(tiles_m, tiles_n):
    seen = [tile_of(t, tiles_m, tiles_n) for t in range(tiles_m * tiles_n)]
    assert sorted(seen) == [(i, j) for i in range(tiles_m) for j in range(tiles_n)]


@pytest.mark.parametrize("k", [1, 7, 8, 9, 100, 4100, 65536])
@pytest.mark.parametrize("bk, split", [(8, 2), (16, 8), (32, 64), (8, 64)])
def test_split_ranges_partition_k(k, bk, split):
    k_tiles_all = -(-k // bk)
    per_split = -(-k_tiles_all // split)
    covered = []
    for y in range(split):
        begin = min(y * per_split * bk, k)
        end = min(begin + per_split * bk, k)
        assert begin % bk == 0 or begin == k  # vector loads stay aligned inside a split
        covered += range(begin, end)
    assert covered == list(range(k))


SAMPLE = [FAMILY.default_config()] + [c for i, c in enumerate(FAMILY.space.enumerate()) if i % 997 == 0]


@pytest.mark.parametrize("c", SAMPLE, ids=lambda c: FAMILY.kernel_name("float32", c))
def test_threads_cover_the_tile_and_loads_cover_the_k_tile(c):
    g = geometry(c)
    wr, wc = map(int, c["warp_layout"].split("x"))
    bm, bn, bk, tm, tn = c["block_m"], c["block_n"], c["block_k"], c["thread_m"], c["thread_n"]
    wm, wn, threads = wr * tm, wc * tn, g["threads"]
    source = render(FAMILY, "float32", c)
    assert "const int row_base = (warp / WARPS_N) * WM + (lane / WC) * 4;" in source
    assert "const int gm = m0 + row_base + (i / 4) * WR * 4 + (i % 4);" in source
    counts = np.zeros((bm, bn), dtype=int)
    for tid in range(threads):
        warp, lane = divmod(tid, 32)
        row_base = (warp // g["warps_n"]) * wm + (lane // wc) * 4
        col_base = (warp % g["warps_n"]) * wn + (lane % wc) * 4
        for i in range(tm):
            for j in range(tn):
                counts[row_base + (i // 4) * wr * 4 + i % 4, col_base + (j // 4) * wc * 4 + j % 4] += 1
    assert (counts == 1).all()
    # Loads: A vectors along k (1 float in the async pipelines), B vectors along n.
    a_vw = 1 if c["pipeline"].startswith("async") else c["vector_width"]
    vw = c["vector_width"]
    a_seen = np.zeros((bm, bk), dtype=int)
    b_seen = np.zeros((bk, bn), dtype=int)
    for tid in range(threads):
        for i in range(g["a_loads"]):
            v = tid + i * threads
            if v < bm * bk // a_vw:
                row, kk = v // (bk // a_vw), (v % (bk // a_vw)) * a_vw
                a_seen[row, kk:kk + a_vw] += 1
        for i in range(g["b_loads"]):
            v = tid + i * threads
            if v < bk * bn // vw:
                kk, nn = v // (bn // vw), (v % (bn // vw)) * vw
                b_seen[kk, nn:nn + vw] += 1
    assert (a_seen == 1).all() and (b_seen == 1).all()


def test_fragment_reads_are_free_of_bank_conflicts():
    # A warp's float4 reads of one k row: the distinct addresses are consecutive 16-byte words
    # (WR of them for A, WC for B), so they never share a bank beyond a broadcast.
    for wr, wc in ((4, 8), (8, 4)):
        for lanes, stride in ((wr, lambda lane: lane // wc), (wc, lambda lane: lane % wc)):
            words = {stride(lane) * 4 for lane in range(32)}
            assert sorted(words) == [4 * i for i in range(lanes)]


# -- the tightest variants through nvcc ---------------------------------------------------------------


def tightest(count: int) -> list:
    """The valid points whose register estimate is closest to their cap, per block size, with
    every pipeline: what would spill first."""
    picked = []
    by_key: dict = {}
    for c in FAMILY.space.enumerate():
        if c["split_k"] > 2 or c["smem_pad"] != 4:
            continue
        g = geometry(c)
        key = (g["register_cap"], c["pipeline"], c["vector_width"])
        slack = g["register_cap"] - g["registers"]
        if key not in by_key or slack < by_key[key][0]:
            by_key[key] = (slack, c)
    picked = [c for _, c in sorted(by_key.values(), key=lambda item: item[0])]
    return picked[:count]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tightest_variants_compile_without_spills(arch, tmp_path):
    from nvcc_tools import nvcc_compile

    configs = tightest(12) + [FAMILY.default_config()]
    report = nvcc_compile([render(FAMILY, "float32", c) for c in configs], arch, tmp_path)
    compiled = set(re.findall(r"Compiling entry function '(\w+)'", report))
    assert {FAMILY.kernel_name("float32", c) for c in configs} <= compiled
    spills = re.findall(r"(\d+) bytes spill stores", report)
    assert spills and all(s == "0" for s in spills), "a variant spills registers"
    assert all(f == "0" for f in re.findall(r"(\d+) bytes stack frame", report))
    used = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert max(used) <= 255


def tightest_capped() -> list:
    """min_blocks=2 points whose register estimate is furthest over the cap of 128, per pipeline,
    load width and thread tile, plus the capped 4096^3 winner: what would spill first."""
    by_key: dict = {}
    for c in FAMILY.space.enumerate():
        if c["min_blocks"] != 2 or c["split_k"] > 2:
            continue
        key = (c["pipeline"], c["vector_width"], c["thread_m"] * c["thread_n"], c["store_width"])
        over = geometry(c)["registers"]
        if key not in by_key or over > by_key[key][0]:
            by_key[key] = (over, c)
    return [c for _, c in by_key.values()] + [config(min_blocks=2)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_capped_variants_compile_within_128_registers_without_spills(arch, tmp_path):
    from nvcc_tools import nvcc_compile

    configs = tightest_capped()
    assert len(configs) >= 8
    report = nvcc_compile([render(FAMILY, "float32", c) for c in configs], arch, tmp_path)
    blocks = re.split(r"Compiling entry function '(\w+)'", report)[1:]
    found = dict(zip(blocks[::2], blocks[1::2]))
    for c in configs:
        text = found[FAMILY.kernel_name("float32", c)]
        assert int(re.search(r"Used (\d+) registers", text).group(1)) <= 128
        assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", text), text


def test_fma_order_changes_only_the_order_of_the_outer_product():
    ij = render(FAMILY, "float32", config(min_blocks=2))
    ji = render(FAMILY, "float32", config(min_blocks=2, fma_order="ji"))
    loop = "acc[i][j] = fmaf(a[i], b[j], acc[i][j]);"
    assert ij.count(loop) == ji.count(loop) == 1
    assert "for (int j = 0; j < TN; ++j)\n#pragma unroll\n                for (int i = 0; i < TM; ++i) " + loop in ji
    assert "for (int i = 0; i < TM; ++i)\n#pragma unroll\n                for (int j = 0; j < TN; ++j) " + loop in ij
    assert FAMILY.kernel_name("float32", config(fma_order="ji")).endswith("_mb1_foji")
    assert sum(c["fma_order"] == "ji" for c in FAMILY.space.enumerate()) >= 2000


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_fma_order_ji_variants_compile_without_spills(arch, tmp_path):
    from nvcc_tools import nvcc_compile

    # Every pipeline at the 128-register cap, the 4096^3 seed's 8x4 warp layout, deep tiles, split-K.
    configs = [config(min_blocks=2, fma_order="ji", pipeline=pl) for pl in ("sync", "regs", "async2", "async3")]
    configs += [config(min_blocks=2, fma_order="ji", warp_layout="8x4"), config(fma_order="ji", block_k=16),
                config(min_blocks=2, fma_order="ji", split_k=8, store_width=4)]
    report = nvcc_compile([render(FAMILY, "float32", c) for c in configs], arch, tmp_path)
    blocks = re.split(r"Compiling entry function '(\w+)'", report)[1:]
    found = dict(zip(blocks[::2], blocks[1::2]))
    for c in configs:
        text = found[FAMILY.kernel_name("float32", c)]
        assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", text), text
        if c["min_blocks"] == 2:
            assert int(re.search(r"Used (\d+) registers", text).group(1)) <= 128


# -- the export self-test hook, on the CPU ----------------------------------------------------------

HOOK_HARNESS = r"""
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#define main autogen_selftest_main
#include "autogen_sgemm_selftest.cu"
#undef main

using W = autogen_sgemm_test::Workload;

// rows m n k: the rows the reference checks.
// inputs m n k beta seed: A, B, C (bits of float32), one line each.
// error m n k alpha beta seed < out: the error of out against that case's inputs, and why.
int main(int argc, char** argv)
{
    if (argc < 5) return 2;
    const std::string mode = argv[1];
    const int m = std::atoi(argv[2]), n = std::atoi(argv[3]), k = std::atoi(argv[4]);
    if (mode == "rows") {
        for (int r : W::checked_rows(m, n, k)) std::printf("%d ", r);
        std::printf("\n");
        return 0;
    }
    std::vector<float> a((std::size_t)m * k), b((std::size_t)k * n), c((std::size_t)m * n);
    const bool inputs = mode == "inputs";
    const float alpha = inputs ? 1.0f : (float)std::atof(argv[5]);
    const float beta = (float)std::atof(argv[inputs ? 5 : 6]);
    selftest::Rng rng(std::strtoull(argv[inputs ? 6 : 7], nullptr, 10));
    W::make_inputs(beta, rng, a, b, c);
    if (inputs) {
        for (const std::vector<float>* v : {&a, &b, &c}) print_bits(*v);
        return 0;
    }
    std::vector<float> out(c.size());
    if (!read_bits(out)) return 2;
    std::string why;
    const double error = W::output_error(a, b, c, out, m, n, k, alpha, beta, &why);
    std::printf("%.17g\n%s\n", error, why.c_str());
    return 0;
}
"""


@pytest.fixture(scope="module")
def hook_harness(tmp_path_factory):
    from nvcc_tools import build_hook_harness
    from test_export import H100, run_export, store_winner
    from tuning_db import TuningDB

    root = tmp_path_factory.mktemp("sgemm_export")
    url = f"sqlite:///{root / 'tuning.db'}"
    split = dict(FAMILY.default_params, block_m=32, block_n=32, thread_m=4, thread_n=4, split_k=16, store_width=4,
                 pipeline="async3")
    with TuningDB(url) as db:
        store_winner(db, H100, "sgemm", {"m": 4096, "n": 4096, "k": 4096}, dict(FAMILY.default_params), 2700.0, 2800.0)
        store_winner(db, H100, "sgemm", {"m": 64, "n": 64, "k": 65536}, split, 20.0, 40.0)
    out = root / "autogen_sgemm"
    assert run_export("sgemm", "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0
    selftest = (out / "autogen_sgemm_selftest.cu").read_text()
    assert "class Workload {" in selftest and "no self-test hook" not in selftest
    assert f"static constexpr double kTolerance = {FAMILY.tolerance};" in selftest
    # The exported kernels and the self-test build for sm_90 with warnings as errors; the
    # harness only needs the self-test's host code, linked against the library.
    return build_hook_harness(out, "autogen_sgemm.cu", HOOK_HARNESS)


def test_hook_checks_all_rows_of_small_shapes_and_a_sample_of_large_ones(hook_harness):
    assert [int(r) for r in harness(hook_harness, "rows", 37, 41, 43)[0].split()] == list(range(37))
    rows = [int(r) for r in harness(hook_harness, "rows", 8192, 8192, 8192)[0].split()]
    assert len(rows) == 4 and rows[0] == 0 and rows[-1] == 8191 and rows == sorted(set(rows))
    rows = [int(r) for r in harness(hook_harness, "rows", 4096, 4096, 64)[0].split()]
    assert len(rows) == 762 and rows[:190] == list(range(190)) and rows[-190:] == list(range(4096 - 190, 4096))


def test_hook_error_passes_fp32_results_and_catches_wrong_ones(hook_harness):
    m, n, k = 19, 23, 300
    for alpha, beta, seed in ((1.5, 0.0, 3), (-0.75, 1.25, 4)):
        lines = harness(hook_harness, "inputs", m, n, k, beta, seed)
        a, b, c = (floats(line) for line in lines[:3])
        a, b, c = a.reshape(m, k), b.reshape(k, n), c.reshape(m, n)
        assert np.isnan(c).all() == (beta == 0.0) and np.isfinite(a).all() and (np.abs(a) <= 0.5).all()
        problem_ = problem(m, n, k)
        inputs = {"A": a, "B": b, "C": c, "alpha": alpha, "beta": beta}
        ref = FAMILY.reference(problem_, inputs, np)
        magnitude = FAMILY.reference_magnitude(problem_, inputs, np)

        def error(out):
            return harness_error(hook_harness, out, "error", m, n, k, alpha, beta, seed)

        got, why = error(ref)
        want = FAMILY.compare(problem_, {**inputs, "C": ref.astype(np.float32)}, ref, magnitude, np)[0]
        assert why == "" and got == pytest.approx(want, rel=1e-6, abs=1e-12) and got < 1e-7
        got, why = error(ref * 1.001)
        assert why == "" and got > FAMILY.tolerance
        bad = ref.copy()
        bad[-1, -1] = np.nan
        got, why = error(bad)
        assert got == math.inf and "NaN/inf" in why


def test_regsedge_is_regs_with_unchecked_interior_loads():
    # Only with 16-byte loads; regs and every other pipeline render exactly as before it existed
    # (the stored winners' source hashes stay valid): the interior path is regsedge's alone.
    assert "regsedge loads 16-byte vectors" in " ".join(
        SPACE.violations({**FAMILY.default_params, "pipeline": "regsedge", "vector_width": 1}))
    edge = render(FAMILY, "float32", config(pipeline="regsedge", min_blocks=2))
    plain = render(FAMILY, "float32", config(pipeline="regs", min_blocks=2))
    assert "load_interior" in edge and "if (interior)" in edge
    assert "load_interior" not in plain and "interior" not in plain
    # The checked loop is the same code in both (edge blocks of regsedge).
    checked_loop = plain[plain.index("    load(0);"):plain.index("    // Epilogue")]
    assert "\n".join(line.strip() for line in checked_loop.splitlines()) in \
        "\n".join(line.strip() for line in edge.splitlines())
