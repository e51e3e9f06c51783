"""The reduce family on the CPU: rendering, naming, geometry, plan, reference and inputs."""


import numpy as np
import pytest

from conftest import nvrtc_usable
from family_checks import held

from autogen.gpu.compile import compile_cubin
from autogen.errors import GpuUnavailableError, UsageError
from autogen.core.registry import get_family
from autogen.families.reduce import HEAVY_EDGE
from autogen.gpu.device import resident_capacity
from autogen.gpu.peers import ReplayArena
from autogen.core.render import render

FAMILY = get_family("reduce")
CONFIGS = list(FAMILY.space.enumerate())


def _config(**overrides):
    return FAMILY.space.check({**FAMILY.default_params, **overrides})


def test_space_is_the_documented_size_and_holds_every_strategy():
    # (3 block sizes x 15 (vector_width, unroll) pairs with at most 32 elements in flight + 1024
    # threads x 13 pairs with at most 16) x 3 grid sizings x 2 block reductions x 3 cross-block steps.
    assert len(CONFIGS) == (3 * 15 + 13) * 3 * 2 * 3 == 1044
    assert {c["cross_block"] for c in CONFIGS} == {"two_kernel", "atomic", "last_block"}
    assert {c["block_reduce"] for c in CONFIGS} == {"shfl", "smem"}
    assert all(c["vector_width"] * c["unroll"] <= (16 if c["block_size"] == 1024 else 32) for c in CONFIGS)


def test_procedural_name_spells_every_parameter():
    assert (FAMILY.kernel_name("float16", FAMILY.default_config())
            == "reduce_f16_bs256_vw4_u4_ept32_rshfl_xlast_block")


def test_grid_size_is_part_of_the_source():
    # The tuner skips a config whose code equals one already measured: configs that differ only
    # in grid size must not render the same code.
    a = render(FAMILY, "float32", _config(elements_per_thread=8))
    b = render(FAMILY, "float32", _config(elements_per_thread=128))
    strip = lambda s, c: s.replace(FAMILY.kernel_name("float32", c), "K")
    assert strip(a, _config(elements_per_thread=8)) != strip(b, _config(elements_per_thread=128))


@pytest.mark.parametrize("n", [1, 3, 1000, 4097, 2**20 + 3, 2**28, 2**31 - 1])
def test_grid_is_at_most_one_wave_and_no_larger_than_the_work(n):
    sm_count, threads_per_sm = resident_capacity()
    problem = FAMILY.problem(n=n)
    for bs in (128, 256, 512, 1024):
        for ept in (8, 32, 128):
            blocks = FAMILY.grid_blocks(problem, bs, ept)
            assert 1 <= blocks <= sm_count * (threads_per_sm // bs)
            # Fewer blocks than wanted only when the wave cap binds; never an idle extra block.
            assert (blocks - 1) * bs * ept < n
            if blocks < sm_count * (threads_per_sm // bs):
                assert blocks * bs * ept >= n


def test_capacity_falls_back_to_the_h100_without_a_gpu():
    from autogen.gpu.device import require_cupy
    try:
        require_cupy()
    except GpuUnavailableError:
        assert resident_capacity() == (132, 2048)
    else:
        pytest.skip("a GPU is visible: the capacity is the device's own")


@pytest.mark.parametrize("n", [1, 1000, 2**20 + 3])
def test_plan_steps_and_arguments_per_cross_block_mode(n):
    problem = FAMILY.problem(n=n)
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(0), {"values": "uniform"})
    for mode in ("two_kernel", "atomic", "last_block"):
        config = _config(cross_block=mode)
        steps = FAMILY.plan(problem, config)
        main = next(s for s in steps if s.suffix == "")
        blocks = main.launch.grid[0]
        assert main.launch.block == (256, 1, 1)
        assert blocks <= inputs["partials"].size  # the workspace holds every partial
        if mode == "atomic":
            # The init step must zero the (NaN-poisoned) output before the blocks add into it.
            assert [s.suffix for s in steps] == ["_init", ""]
            assert steps[0].args(inputs) == (inputs["out"],)
            assert steps[0].launch.grid == (1, 1, 1)
        elif mode == "two_kernel":
            assert [s.suffix for s in steps] == ["", "_final"]
            final = steps[1]
            assert final.launch.grid == (1, 1, 1)
            partials, out, count = held(final.args(inputs))
            assert partials is inputs["partials"] and out is inputs["out"] and int(count) == blocks
        else:
            assert [s.suffix for s in steps] == [""]
            x, partials, counter, out, count = held(main.args(inputs))
            assert counter is inputs["counter"] and int(count) == n


def test_plan_refuses_a_workspace_smaller_than_the_grid():
    problem = FAMILY.problem(n=2**24)
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(0), {"values": "uniform"})
    inputs["partials"] = inputs["partials"][:1]
    step = FAMILY.plan(problem, _config(cross_block="two_kernel", elements_per_thread=8))[0]
    with pytest.raises(ValueError, match="partials holds 1 floats"):
        step.args(inputs)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n", [1, 7, 4097])
def test_reference_matches_a_plain_loop(dtype, n):
    problem = FAMILY.problem(dtype, n=n)
    rng = np.random.default_rng(3)
    for case in FAMILY.validation_cases(problem):
        inputs = FAMILY.make_inputs(problem, np, rng, case)
        expected = 0.0
        for value in inputs["x"]:
            expected += float(value)
        result = FAMILY.reference(problem, inputs)
        assert result.shape == (1,) and result.dtype == np.float64
        np.testing.assert_allclose(result, [expected], rtol=1e-12)


def test_inputs_are_positive_fresh_and_the_outputs_poisoned():
    problem = FAMILY.problem("float16", n=5000)
    rng = np.random.default_rng(4)
    first = FAMILY.make_inputs(problem, np, rng, {"values": "uniform"})
    second = FAMILY.make_inputs(problem, np, rng, {"values": "uniform"})
    assert first["x"].dtype == np.float16 and first["x"].shape == (5000,)
    assert first["x"].min() >= 0 and first["x"].max() <= 1  # sum never near zero
    assert np.isnan(first["out"]).all() and first["out"].dtype == np.float32
    assert np.isnan(first["partials"]).all()  # a partial read before it is written shows
    assert first["partials"].size == FAMILY.workspace_blocks(problem)
    assert first["counter"].tolist() == [0] and first["counter"].dtype == np.uint32
    assert not np.array_equal(first["x"], second["x"])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_heavy_edges_make_every_edge_element_count(dtype):
    n = 2**20 + 3
    problem = FAMILY.problem(dtype, n=n)
    inputs = FAMILY.make_inputs(problem, np, np.random.default_rng(5), {"values": "heavy_edges"})
    x = inputs["x"].astype(np.float64)
    total = x.sum()
    edges = np.concatenate([x[:HEAVY_EDGE], x[-HEAVY_EDGE:]])
    assert 0.3 < edges.sum() / total < 0.7  # the edges hold about half of the sum
    # Dropping any single edge element moves the sum by more than the tolerance.
    assert edges.min() / total > 10 * FAMILY.tolerance
    assert np.isfinite(x).all()


def test_bytes_moved_reads_x_once_and_writes_one_float():
    assert FAMILY.bytes_moved(FAMILY.problem("float32", n=2**28)) == 4 * 2**28 + 4
    assert FAMILY.bytes_moved(FAMILY.problem("float16", n=2**28)) == 2 * 2**28 + 4


@pytest.mark.parametrize("dims, fragment", [
    ({"n": 0}, "n must be between 1"),
    ({"n": -5}, "n must be between 1"),
    ({}, "missing n"),
    ({"n": 4, "m": 2}, "unknown m"),
    ({"n": 2**31}, "n must be between 1"),
])
def test_bad_shapes_are_usage_errors(dims, fragment):
    with pytest.raises(UsageError) as info:
        FAMILY.problem(**dims)
    assert fragment in str(info.value)


def test_bad_dtype_is_a_usage_error():
    with pytest.raises(UsageError, match="supports dtype float32, float16"):
        FAMILY.problem("float64", n=4)


def test_search_prunes_variants_far_wider_than_the_vector():
    problem = FAMILY.problem(n=100)
    wide = _config(block_size=1024, vector_width=4, unroll=4)
    assert "spans over twice n=100" in FAMILY.reject_reason(problem, wide)
    narrow = _config(block_size=128, vector_width=1, unroll=1)
    assert FAMILY.reject_reason(problem, narrow) is None
    assert FAMILY.reject_reason(FAMILY.problem(n=2**28), wide) is None
    # Every shape keeps something to tune.
    for n in (1, 3, 100):
        assert any(FAMILY.reject_reason(FAMILY.problem(n=n), c) is None for c in CONFIGS)


def test_host_launcher_allocates_the_workspace_on_the_stream():
    two = render(FAMILY, "float32", _config(cross_block="two_kernel"), host_launcher=True)
    assert "cudaMallocAsync" in two and "cudaFreeAsync" in two
    name = FAMILY.kernel_name("float32", _config(cross_block="two_kernel"))
    assert f"extern \"C\" cudaError_t {name}_launch(const void* x, float* out, int n, cudaStream_t stream)" in two
    last = render(FAMILY, "float16", _config(cross_block="last_block"), host_launcher=True)
    assert "cudaMemsetAsync(counter" in last
    atomic = render(FAMILY, "float32", _config(cross_block="atomic"), host_launcher=True)
    assert "_init<<<1, 1, 0, stream>>>(out)" in atomic and "cudaMallocAsync" not in atomic
    default_name = FAMILY.kernel_name("float32", _config())
    assert f"{default_name}_launch(" not in render(FAMILY, "float32", _config())  # NVRTC: device code only


def test_replay_arena_hands_out_the_same_addresses_on_every_call():
    class FakeBuffer:
        def __add__(self, offset):
            return ("buffer", offset)

    class FakeCupy:
        class cuda:
            @staticmethod
            def using_allocator(allocator):
                import contextlib
                FakeCupy.allocator = allocator
                return contextlib.nullcontext()

            @staticmethod
            def get_current_stream():
                class Stream:
                    def synchronize(self):
                        pass
                return Stream()

            @staticmethod
            def alloc(size):
                FakeCupy.allocated = size
                return FakeBuffer()

        @staticmethod
        def get_default_memory_pool():
            class Pool:
                def malloc(self, size):
                    return ("pool", size)
            return Pool()

    calls = []

    def call():
        calls.append((FakeCupy.allocator(100), FakeCupy.allocator(300)))

    arena = ReplayArena(FakeCupy, call)
    assert calls[0] == (("pool", 100), ("pool", 300))  # the warm-up records the sizes
    assert arena.capacity == FakeCupy.allocated == 256 + 512
    arena.run(call)
    arena.run(call)
    assert calls[1] == calls[2] == (("buffer", 0), ("buffer", 256))
    with pytest.raises(MemoryError):
        arena.run(lambda: FakeCupy.allocator(2048))


@pytest.mark.skipif(not nvrtc_usable(), reason="NVRTC not usable through CuPy here")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("mode", ["two_kernel", "atomic", "last_block"])
def test_nvrtc_compiles_each_cross_block_mode(dtype, mode, tmp_path):
    for overrides in ({"cross_block": mode}, {"cross_block": mode, "vector_width": 8, "unroll": 4,
                                              "block_reduce": "smem", "block_size": 512}):
        cubin = compile_cubin(render(FAMILY, dtype, _config(**overrides)), "sm_90", str(tmp_path))
        assert len(cubin) > 0
