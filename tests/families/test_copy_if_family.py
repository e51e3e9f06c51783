"""copy_if on the CPU: the selectivity classes, traits and keys, space and pruning, the plan of
every mode (workspace, init, and the refusal of unordered variants on ordered problems), inputs
and thresholds, the exact ordered and multiset comparisons with poison, and the export self-test
hook compiled with nvcc and run on the CPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autogen.core.problem import shape_distance
from autogen.errors import InvalidConfigError, UsageError
from autogen.families.copy_if import (FRACTIONS, INT_POISON, ORDERED_MODES, copy_if_values, exact_selection,
                                      selectivity_class)
from autogen.core.registry import get_family
from family_checks import held
from test_histogram_family import build_harness, export_with_defaults

FAMILY = get_family("copy_if")


def config(**changes):
    return FAMILY.space.check({**FAMILY.default_params, **changes})


@pytest.mark.parametrize("text, cls", [("p01", "p01"), ("p50", "p50"), ("p99", "p99"), ("0.5", "p50"), ("0.01", "p01"),
                                       ("0", "p01"), ("0.0999", "p01"), ("0.1", "p50"), ("0.9", "p50"),
                                       ("0.9001", "p99"), ("1", "p99"), ("50%", "p50"), ("99%", "p99"), ("5%", "p01")])
def test_selectivity_classes(text, cls):
    assert selectivity_class(text) == cls
    assert FAMILY.problem(n=10, selectivity=text)["selectivity"] == cls


@pytest.mark.parametrize("bad", ["1.5", "-0.1", "p10", "half", "nan%"])
def test_bad_selectivity_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="selectivity"):
        FAMILY.problem(n=10, selectivity=bad)


def test_problem_keys_and_defaults():
    assert FAMILY.problem(n=2**28, selectivity="0.5").shape_key == "n=268435456,selectivity=p50,order=ordered"
    assert FAMILY.problem("float32", n=7, order="unordered").shape_key == "n=7,selectivity=p01,order=unordered"
    with pytest.raises(UsageError, match="order"):
        FAMILY.problem(n=7, order="sorted")
    a, b = FAMILY.problem(n=2**24, selectivity="p50"), FAMILY.problem(n=2**24, selectivity="p99")
    assert math.isinf(shape_distance(a, b))
    assert FAMILY.c_params_for("float32") == "const float* x, float* values, int* count, int n, float threshold"
    assert FAMILY.c_params_for("int32") == FAMILY.c_params


def test_space_and_constraints():
    assert FAMILY.space.size() == 1158
    modes = {c["mode"] for c in FAMILY.space.enumerate()}
    assert modes == {"lookback", "two_pass", "block", "warp", "thread"}
    for point in FAMILY.space.enumerate():
        assert point["block_size"] * point["blocks_per_sm"] <= 2048
        limit = {1024: 8, 512: 16}.get(point["block_size"], 32)
        assert point["items_per_thread"] <= limit
        if point["blocks_per_sm"] and point["mode"] in ("lookback", "block"):
            assert 2 * point["items_per_thread"] <= limit  # pipelined: two tiles of words
        if point["scatter"] == "shared":
            assert point["mode"] not in ("warp", "thread")
            assert 4 * point["block_size"] * point["items_per_thread"] <= 32 * 1024
        assert point["mode"] != "two_pass" or point["blocks_per_sm"] >= 1
    assert FAMILY.default_params["mode"] in ORDERED_MODES  # the default serves both orders


def test_defaults_are_the_single_pass_kernels():
    ordered = FAMILY.problem(n=2**24, order="ordered")
    unordered = FAMILY.problem(n=2**24, order="unordered")
    first = FAMILY.default_config(ordered)
    assert first["mode"] == "lookback" and first["blocks_per_sm"] == 0 and first["scatter"] == "shared"
    assert first["vector_width"] == 4
    assert FAMILY.default_config(unordered).as_dict() == {**first.as_dict(), "mode": "block"}
    assert FAMILY.default_config().as_dict() == first.as_dict()
    # An ordered search also measures the default's 8192-element tiles first.
    seeds = FAMILY.seed_configs(ordered)
    assert seeds[0] == first and seeds[1].as_dict() == {**first.as_dict(), "items_per_thread": 32}
    assert FAMILY.seed_configs(unordered) == [FAMILY.default_config(unordered)]
    for problem in (ordered, unordered):
        assert FAMILY.reject_reason(problem, FAMILY.default_config(problem)) is None
    for param in ("mode", "blocks_per_sm", "scatter"):  # the state of the art is each one's first choice
        assert FAMILY.space.param(param).choices[0] == first[param]


def test_reject_reasons():
    big = FAMILY.problem(n=2**24, order="unordered")
    # Same-address atomics: thread mode on all but small n, warp mode at 4 items.
    assert "atomics" in FAMILY.reject_reason(big, config(mode="thread", scatter="direct"))
    assert "atomics" in FAMILY.reject_reason(big, config(mode="warp", scatter="direct", items_per_thread=4))
    assert FAMILY.reject_reason(big, config(mode="warp", scatter="direct", items_per_thread=8)) is None
    assert FAMILY.reject_reason(big, config(mode="block", items_per_thread=4, block_size=128)) is None
    small = FAMILY.problem(n=20_000, order="unordered")
    assert FAMILY.reject_reason(small, config(mode="thread", scatter="direct", items_per_thread=8)) is None
    # A persistent grid that holds every tile at once is the one-block-per-tile launch again.
    mid = FAMILY.problem(n=2**20, order="ordered")  # 256 tiles of 4096
    assert "same launch" in FAMILY.reject_reason(mid, config(blocks_per_sm=2))
    assert FAMILY.reject_reason(mid, config(blocks_per_sm=2, mode="two_pass")) is None
    assert FAMILY.reject_reason(FAMILY.problem(n=2**24), config(blocks_per_sm=2)) is None
    # Constraints of the space.
    assert "duplicate" in FAMILY.space.violations({**FAMILY.default_params, "mode": "warp"})[0]
    assert "blocks_per_sm >= 1" in FAMILY.space.violations({**FAMILY.default_params, "mode": "two_pass"})[0]
    assert "pipelined" in FAMILY.space.violations({**FAMILY.default_params, "block_size": 512,
                                                   "blocks_per_sm": 2, "scatter": "direct"})[0]


def test_unordered_modes_are_pruned_and_refused_on_ordered_problems():
    ordered = FAMILY.problem(n=100_000, order="ordered")
    unordered = FAMILY.problem(n=100_000, order="unordered")
    for mode in ("block", "warp", "thread"):
        scatter = "shared" if mode == "block" else "direct"
        assert "order" in FAMILY.reject_reason(ordered, config(mode=mode, scatter=scatter))
        assert FAMILY.reject_reason(unordered, config(mode=mode, scatter=scatter, items_per_thread=32,
                                                      block_size=128)) is None
        # A warm-start seed skips pruning: the launch itself refuses.
        steps = FAMILY.plan(ordered, config(mode=mode, scatter=scatter))
        with pytest.raises(InvalidConfigError, match="unordered"):
            steps[-1].args({})
    for mode in ORDERED_MODES:
        bps = 0 if mode == "lookback" else 1
        assert FAMILY.reject_reason(ordered, config(mode=mode, blocks_per_sm=bps)) is None
        assert FAMILY.reject_reason(unordered, config(mode=mode, blocks_per_sm=bps)) is None


def test_plans_of_each_mode():
    problem = FAMILY.problem(n=2**24 + 5, order="unordered")
    rng = np.random.default_rng(0)
    inputs = FAMILY.make_inputs(problem, np, rng, {"select": "p01"})
    status_words, block_words = FAMILY.workspace_sizes(problem)
    assert status_words == -(-(2**24 + 5) // 512) and block_words == 132 * 8
    c = config(mode="lookback", block_size=256, items_per_thread=16, blocks_per_sm=4)
    tiles = -(-(2**24 + 5) // 4096)
    steps = FAMILY.plan(problem, c)
    assert [s.suffix for s in steps] == ["_init", ""]
    assert steps[1].launch.grid == (132 * 4, 1, 1)
    assert FAMILY.plan(problem, config(mode="lookback"))[1].launch.grid == (tiles, 1, 1)  # one block per tile
    init_args = held(steps[0].args(inputs))
    assert init_args[1] == tiles and init_args[4] == 0  # status words reset; count is written, not zeroed
    main_args = held(steps[1].args(inputs))
    assert main_args[4].dtype == np.int32 and len(main_args) == 7
    steps = FAMILY.plan(problem, config(mode="two_pass", blocks_per_sm=2))
    assert [s.suffix for s in steps] == ["", "_scan", "_scatter"]
    assert steps[1].launch.grid == (1, 1, 1) and held(steps[1].args(inputs))[1] == 132 * 2
    steps = FAMILY.plan(problem, config(mode="warp", scatter="direct"))
    assert [s.suffix for s in steps] == ["_init", ""] and held(steps[0].args(inputs))[4] == 1  # count zeroed
    # Never past the workspace.
    small = dict(inputs, status=inputs["status"][:10])
    with pytest.raises(ValueError, match="status"):
        FAMILY.plan(problem, c)[1].args(small)


def test_grid_never_exceeds_tiles():
    problem = FAMILY.problem(n=1000)
    assert FAMILY.launch(problem, config(block_size=128, items_per_thread=4)).grid == (2, 1, 1)
    assert FAMILY.launch(problem, config(block_size=128, items_per_thread=4, blocks_per_sm=8)).grid == (2, 1, 1)
    assert "spans" in FAMILY.reject_reason(problem, config(block_size=1024, items_per_thread=8, blocks_per_sm=0))


@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("select", ["p01", "p50", "p99"])
def test_inputs_select_the_class_fraction(dtype, select):
    rng = np.random.default_rng(5)
    n = 400_000
    x, threshold = copy_if_values(np, rng, n, dtype, select, clean=True)
    assert x.dtype == np.dtype(dtype) and x.size == n
    share = float((x > x.dtype.type(threshold)).mean())
    assert abs(share - FRACTIONS[select]) < 0.005
    assert np.isfinite(x.astype(np.float64)).all()


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_none_all_and_specials(dtype):
    rng = np.random.default_rng(6)
    x, t = copy_if_values(np, rng, 1000, dtype, "none")
    assert not (x > x.dtype.type(t)).any()
    x, t = copy_if_values(np, rng, 1000, dtype, "all")
    assert (x > x.dtype.type(t)).all()
    if dtype == "float32":
        x, t = copy_if_values(np, rng, 1000, dtype, "p50")
        assert np.isnan(x).sum() >= 4 and np.isposinf(x).sum() >= 2 and np.isneginf(x).sum() >= 2
        assert np.isnan(x[0]) and np.isposinf(x[1]) and np.isposinf(x[-4])


@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("order", ["ordered", "unordered"])
def test_reference_and_exact_comparison(dtype, order):
    problem = FAMILY.problem(dtype, n=5000, selectivity="p50", order=order)
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(7), FAMILY.validation_cases(problem)[0])
    poison_ok = np.isnan(inputs["values"]).all() if dtype == "float32" else (inputs["values"] == INT_POISON).all()
    assert poison_ok and inputs["count"][0] == -1
    ref = FAMILY.reference(problem, inputs, np)
    x, t = inputs["x"], inputs["x"].dtype.type(inputs["threshold"])
    chosen = x[x > t]
    assert ref["count"].tolist() == [float(chosen.size)] and 2000 < chosen.size < 3000
    assert np.array_equal(ref["values"][:chosen.size], chosen.astype(np.float64))
    assert np.isnan(ref["values"][chosen.size:]).all()
    # Left poisoned: fails on the count first.
    error, reason = FAMILY.compare(problem, inputs, ref, None, np)
    assert error == math.inf and "count is -1" in reason
    inputs["count"][0] = chosen.size
    error, reason = FAMILY.compare(problem, inputs, ref, None, np)
    assert error == math.inf and ("unwritten" in reason or "differ" in reason)
    # Right, in order, with garbage past count: passes.
    inputs["values"][:chosen.size] = chosen
    assert FAMILY.compare(problem, inputs, ref, None, np) == (0.0, "")
    # Permuted: passes only unordered.
    inputs["values"][:chosen.size] = chosen[::-1]
    error, reason = FAMILY.compare(problem, inputs, ref, None, np)
    assert (error == 0.0) == (order == "unordered"), reason
    # One value replaced by a value that is not selected (the int poison): fails either way.
    inputs["values"][0] = INT_POISON if dtype == "int32" else -1.0
    assert FAMILY.compare(problem, inputs, ref, None, np)[0] == math.inf
    # One value short: count mismatch.
    inputs["count"][0] = chosen.size - 1
    assert "count" in FAMILY.compare(problem, inputs, ref, None, np)[1]


def test_exact_selection_counts_zero():
    expected = {"values": np.full(3, np.nan), "count": np.zeros(1)}
    assert exact_selection(np, np.full(3, np.nan, dtype=np.float32), np.zeros(1, dtype=np.int32), expected, True) == (0.0, "")


def test_bytes_moved_counts_the_selected_writes():
    assert FAMILY.bytes_moved(FAMILY.problem(n=1000, selectivity="p50")) == 4000 + 2000 + 4
    assert FAMILY.bytes_moved(FAMILY.problem(n=1000, selectivity="p99")) == 4000 + 3960 + 4


# -- the export self-test hook --------------------------------------------------------------------

HARNESS = r"""
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
#include "autogen_copy_if_selftest.cu"
#undef main

template <class W>
int run(const std::string& mode, char** argv)
{
    typedef typename W::Elem E;
    if (mode == "inputs") {  // inputs dtype n case seed: x bits, threshold bits, reference count
        const int n = std::atoi(argv[3]), c = std::atoi(argv[4]);
        selftest::Rng rng(std::strtoull(argv[5], nullptr, 10));
        std::vector<E> x((std::size_t)n);
        const E t = W::make_inputs(c, rng, x);
        for (E v : x) { std::uint32_t b; std::memcpy(&b, &v, 4); std::printf("%u ", b); }
        std::uint32_t tb; std::memcpy(&tb, &t, 4);
        std::printf("\n%u\n%zu\n", tb, W::reference(x, t).size());
        return 0;
    }
    if (mode == "large") {  // large dtype n: the parallel select, sort and multiset compare against plain ones
        const std::size_t n = (std::size_t)std::atoll(argv[3]);
        std::vector<E> x(n);
        std::mt19937 random(7);
        for (E& v : x) v = (E)(int)(random() % 100000u) - (E)50000;  // duplicates, negatives
        const E t = (E)1000;
        std::vector<E> want;
        for (E v : x) if (v > t) want.push_back(v);
        std::vector<std::uint32_t> sorted(x.size());
        std::memcpy(sorted.data(), x.data(), n * sizeof(E));
        std::sort(sorted.begin(), sorted.end());
        selftest::HostVector<std::uint32_t> keys(n), scratch;
        std::memcpy(keys.data(), x.data(), n * sizeof(E));
        W::sort_bits(keys, scratch);
        std::vector<E> got = W::reference(x, t), shuffled = got, changed = got;
        std::shuffle(shuffled.begin(), shuffled.end(), random);
        changed[changed.size() / 2] = (E)2000000;
        std::string why, why_changed;
        std::printf("%d %d %d %g %g\n", (int)(got == want), (int)std::equal(sorted.begin(), sorted.end(), keys.begin()),
                    (int)W::kOrdered, W::compare((int)want.size(), shuffled, want, &why),
                    W::compare((int)want.size(), changed, want, &why_changed));
        std::printf("%s\n", why_changed.c_str());
        return 0;
    }
    // compare dtype k count < k got bits, k want bits
    const int k = std::atoi(argv[3]), count = std::atoi(argv[4]);
    std::vector<E> got((std::size_t)k), want((std::size_t)k);
    for (auto* v : {&got, &want})
        for (E& e : *v) { std::uint32_t b; if (std::scanf("%u", &b) != 1) return 2; std::memcpy(&e, &b, 4); }
    std::string why;
    const double error = W::compare(count, got, want, &why);
    std::printf("%g\n%s\n%d\n", error, why.c_str(), (int)W::kOrdered);
    return 0;
}

int main(int argc, char** argv)
{
    if (argc == 1) return autogen_selftest_main(argc, argv);  // the self-test itself
    const std::string mode = argv[1];
    if (std::string(argv[2]) == "int32") return run<autogen_copy_if_test::Workload>(mode, argv);
    return run<autogen_copy_if_f32_test::Workload>(mode, argv);
}
"""


@pytest.fixture(scope="module")
def hook(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy_if_hook")
    tuned = {"int32": [((4096,), dict(FAMILY.default_params)),
                       ((2**20,), {**FAMILY.default_params, "mode": "two_pass", "blocks_per_sm": 4})],
             "float32": [((4096,), {**FAMILY.default_params, "mode": "warp", "scatter": "direct"})]}
    files = export_with_defaults("copy_if", root / "out", tuned)
    return build_harness(root / "out", "copy_if", HARNESS, root), files


def test_hook_entries_pick_ordered_or_multiset_checks(hook):
    _binary, files = hook
    selftest = files["autogen_copy_if_selftest.cu"]
    int_part = selftest.split("namespace autogen_copy_if_test {", 1)[1].split("}  // namespace autogen_copy_if_test")[0]
    f32_part = selftest.split("namespace autogen_copy_if_f32_test {", 1)[1]
    assert "#include <cub/device/device_radix_sort.cuh>" in selftest  # large checks select and sort on the GPU
    assert "kOrdered = true;" in int_part and "typedef int Elem;" in int_part
    assert "kOrdered = false;" in f32_part and "typedef float Elem;" in f32_part  # a warp-atomic variant is in it
    source = files["autogen_copy_if.cu"]
    assert "cudaMallocAsync" in source and "cudaFreeAsync" in source


def bits(values: np.ndarray) -> str:
    return " ".join(map(str, np.asarray(values).view(np.uint32).tolist()))


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_hook_inputs_match_the_family(hook, dtype):
    from test_export import run

    binary, _files = hook
    for case, fraction in ((0, 0.5), (1, 0.01), (2, 0.99), (3, 0.0), (4, 1.0), (5, 0.5)):
        n = 20_000
        lines = run([str(binary), "inputs", dtype, str(n), str(case), str(3 + case)]).stdout.splitlines()
        x = np.array(lines[0].split(), dtype=np.uint32).view(dtype)
        t = np.array([int(lines[1])], dtype=np.uint32).view(dtype)[0]
        count = int(lines[2])
        chosen = FAMILY.reference(FAMILY.problem(dtype, n=n), {"x": x, "threshold": t}, np)["count"][0]
        assert count == chosen
        assert abs(count / n - fraction) < 0.02, (case, count)
        if dtype == "float32" and case <= 2:
            assert np.isnan(x[0]) and np.isposinf(x[1]) and np.isposinf(x[-2])


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_hook_compare_checks_count_order_and_poison(hook, dtype):
    from test_export import run

    binary, _files = hook
    want = np.array([5, 1, 9, 3], dtype=dtype)

    def verdict(got, count=4):
        out = run([str(binary), "compare", dtype, "4", str(count)], input=bits(np.asarray(got, dtype=dtype)) + " "
                  + bits(want)).stdout.splitlines()
        return float(out[0]), out[1] if len(out) > 2 else "", out[-1] == "1"

    error, _why, ordered = verdict(want)
    assert error == 0.0
    error, why, _ = verdict(want[::-1])
    assert (error == 0.0) == (not ordered)  # int32 entry: ordered variants only; float32: a warp variant
    error, why, _ = verdict(want, count=3)
    assert error == math.inf and "count is 3" in why
    poison = np.array([np.nan if dtype == "float32" else -2**31], dtype=dtype)[0]
    error, why, _ = verdict([5, 1, poison, 3])
    assert error == math.inf and "differ" in why


# -- a NumPy model of the kernel's arithmetic ------------------------------------------------------

AGGREGATE, PREFIX = 1 << 32, 2 << 32


def _tile_places(x, threshold, tile, n, bs, vw, ipt):
    """The template's per-tile arithmetic: item j = l * vw + k of thread t is element
    tile * TILE + (l * bs + t) * vw + k; warp_ranks (ballots per item slot), the per-(row, warp)
    segments scanned exclusively (scan_segments), then store_rows' running place. Returns
    (element indices, their places in the tile, the tile's total)."""
    rows, warps, size = ipt // vw, bs // 32, bs * ipt
    base = tile * size
    t = np.arange(bs)
    idx = base + ((np.arange(rows)[:, None, None] * bs + t[None, :, None]) * vw + np.arange(vw)[None, None, :])
    flags = (idx < n) & (x[np.minimum(idx, n - 1)] > threshold)  # (rows, bs, vw)
    per_thread = flags.sum(axis=2)  # the popc of each lane's votes in a row
    lane_rank = np.zeros_like(per_thread)
    seg_count = np.zeros((rows, warps), dtype=np.int64)
    for w in range(warps):
        lanes = per_thread[:, w * 32:(w + 1) * 32]
        lane_rank[:, w * 32:(w + 1) * 32] = np.cumsum(lanes, axis=1) - lanes  # popc(votes & lanemask_lt)
        seg_count[:, w] = lanes.sum(axis=1)
    segments = seg_count.reshape(-1)  # segment l * WARPS + warp
    offset = (np.cumsum(segments) - segments).reshape(rows, warps)
    places, elements = [], []
    for l in range(rows):
        for thread in range(bs):
            at = offset[l, thread // 32] + lane_rank[l, thread]
            for k in range(vw):
                if flags[l, thread, k]:
                    places.append(at)
                    elements.append(idx[l, thread, k])
                    at += 1
    return np.array(elements, dtype=np.int64), np.array(places, dtype=np.int64), int(segments.sum())


def _look_back(status, tile, total):
    """look_back's window arithmetic, one warp of 32 lanes: lane 0 nearest; stop at the nearest
    PREFIX (__ffs of the ballot); before tile 0 reads as a PREFIX of 0. Asserts every status it
    reads is published (the kernel spins until then)."""
    if tile == 0:
        return 0
    exclusive, end = 0, tile - 1
    while True:
        words = []
        for lane in range(32):
            i = end - lane
            word = status[i] if i >= 0 else PREFIX
            assert word >> 32 != 0, "looked at an unpublished tile"
            words.append(word)
        prefixes = [w >> 32 == 2 for w in words]
        stop = prefixes.index(True) if any(prefixes) else 31
        exclusive += sum(w & 0xFFFFFFFF for w in words[:stop + 1])
        if any(prefixes):
            return exclusive
        end -= 32


def _model(x, threshold, bs, vw, ipt, rng):
    """The lookback kernel run tile by tile with the PREFIX words published late and out of order
    (the AGGREGATE before any look-back, as the kernel does): the output and the count."""
    n, size = x.size, bs * ipt
    tiles = -(-n // size)
    status = [0] * tiles
    late = []
    out = np.full(n, INT_POISON, dtype=x.dtype)
    count = None
    for tile in range(tiles):  # ticket order
        elements, places, total = _tile_places(x, threshold, tile, n, bs, vw, ipt)
        status[tile] = (AGGREGATE if tile else PREFIX) | total  # tile 0 publishes its prefix at once
        start = _look_back(status, tile, total)
        if tile:
            late.append((tile, PREFIX | (start + total)))
        rng.shuffle(late)
        for _ in range(int(rng.integers(0, len(late) + 1))):  # some inclusive prefixes become visible
            i, word = late.pop()
            status[i] = word
        assert sorted(places.tolist()) == list(range(total))  # a permutation of the tile's places
        out[start + places] = x[elements]
        if tile == tiles - 1:
            count = start + total
    return out, count


@pytest.mark.parametrize("n", [1, 31, 513, 4097, 70_001])
@pytest.mark.parametrize("bs, vw, ipt", [(128, 4, 4), (64 * 2, 2, 8), (256, 1, 4), (32 * 4, 4, 16)])
@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.5, 1.0])
def test_numpy_model_of_ranks_and_look_back(n, bs, vw, ipt, fraction):
    rng = np.random.default_rng(n + bs + vw + ipt)
    x = rng.integers(0, 1000, n).astype(np.int32)
    threshold = 999 if fraction == 0.0 else -1 if fraction == 1.0 else int(999 - round(fraction * 1000))
    if n > 5000 and (bs, vw, ipt) != (128, 4, 4):
        pytest.skip("one configuration at the largest n keeps the test short")
    out, count = _model(x, threshold, bs, vw, ipt, rng)
    want = x[x > threshold]
    assert count == want.size
    np.testing.assert_array_equal(out[:count], want)


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_hook_select_and_multiset_sort_split_over_cores_agree_with_plain_ones(hook, dtype):
    from test_export import run

    binary, _files = hook
    n = 300_007  # over 2^16 elements a part: several parts, an uneven last one
    lines = run([str(binary), "large", dtype, str(n)]).stdout.splitlines()
    same_selection, sorted_alike, ordered, shuffled, changed = lines[0].split()
    assert same_selection == "1" and sorted_alike == "1"
    assert float(shuffled) == (math.inf if ordered == "1" else 0.0)  # in order, or as a multiset
    assert float(changed) == math.inf and "values differ" in lines[1]
