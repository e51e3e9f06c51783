"""reduce and softmax on a real GPU: every variant of each space validates on awkward shapes for
both dtypes; the peers run correctly inside graph capture; a short tune stores a winner."""

from __future__ import annotations

import secrets

import pytest

from autogen.core.registry import get_family
from autogen.core.compare import rounding_error
from autogen.core.render import render
from variant_cubins import compile_spaces

pytestmark = pytest.mark.gpu

REDUCE_SIZES = [1, 3, 1000, 4097, 2**20 + 3]
SOFTMAX_SHAPES = [(1, 1), (3, 5), (7, 33), (1000, 37), (64, 1024), (2, 4099)]
DTYPES = ["float32", "float16"]


@pytest.fixture(scope="module")
def all_cubins():
    """{(family, dtype): {kernel name: (config, cubin or CompileError)}}, compiled in one pool."""
    return compile_spaces(("reduce", "softmax"), DTYPES)


def _rng():
    import cupy
    return cupy.random.default_rng(secrets.randbits(63))


def test_every_variant_compiles_with_nvrtc(all_cubins):
    for (family_name, dtype), variants in all_cubins.items():
        failures = {name: str(cubin)[:300] for name, (_, cubin) in variants.items() if not isinstance(cubin, bytes)}
        assert not failures, f"{family_name} {dtype}: {len(failures)} failed, e.g. {next(iter(failures.items()))}"
        assert len(variants) == get_family(family_name).space.size()


def _validate_all(all_cubins, family_name, dtype, dims):
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family(family_name)
    evaluator = Evaluator(WorkSpec(family_name, dtype, tuple(dims.items())))
    failures, worst = [], 0.0
    for name, (config, cubin) in all_cubins[(family_name, dtype)].items():
        check = evaluator.check(name, cubin, config.as_dict())
        if not check.ok:
            failures.append(f"{name}: {check.reason}")
        else:
            worst = max(worst, check.error)
    assert not failures, f"{len(failures)} {family_name} {dtype} variants failed on {dims}:\n" + "\n".join(failures[:20])
    return family, evaluator.problem, worst


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", REDUCE_SIZES)
def test_every_reduce_variant_validates(all_cubins, dtype, n):
    family, problem, worst = _validate_all(all_cubins, "reduce", dtype, {"n": n})
    assert worst <= family.tolerance


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", SOFTMAX_SHAPES)
def test_every_softmax_variant_validates(all_cubins, dtype, rows, cols):
    family, problem, worst = _validate_all(all_cubins, "softmax", dtype, {"rows": rows, "cols": cols})
    assert worst <= family.tolerance_for(problem)


def _plan_launcher(family, problem, name, cubin, config):
    """Every step of a variant on the current stream, as the worker runs it."""
    import cupy

    module = cupy.cuda.function.Module()
    module.load(cubin)
    steps = [(module.get_function(name + step.suffix), step) for step in family.plan(problem, config)]

    def launch(inputs):
        for function, step in steps:
            function(step.launch.grid, step.launch.block, step.args(inputs), shared_mem=step.launch.shared_bytes)

    launch.module = module  # keeps the module loaded while the launcher lives
    return launch


@pytest.mark.parametrize("dtype", DTYPES)
def test_last_block_variants_leave_the_counter_ready_for_the_next_launch(all_cubins, dtype):
    # Validation runs each variant once on fresh inputs; a CUDA graph launches it again and
    # again on the same inputs, which only works if the last block resets its ticket counter.
    import cupy

    from autogen.core.compare import relative_error

    family = get_family("reduce")
    problem = family.problem(dtype, n=2**20 + 3)
    inputs = family.make_inputs(problem, cupy, _rng(), {"values": "uniform"})
    expected = family.reference(problem, inputs, cupy)
    variants = [(n, c, b) for n, (c, b) in all_cubins[("reduce", dtype)].items() if c["cross_block"] == "last_block"]
    for name, config, cubin in variants[::17]:
        launch = _plan_launcher(family, problem, name, cubin, config)
        for _ in range(3):
            inputs["out"][...] = cupy.nan
            launch(inputs)
            error, reason = relative_error(cupy, inputs["out"], expected)
            assert not reason and error <= family.tolerance, name
            assert int(inputs["counter"][0]) == 0, name


def test_validation_catches_a_dropped_tail_element_at_large_n():
    # At n = 2^20 + 3 one missing element of uniform [0, 1) data is a 1e-6 error, under the
    # tolerance; the heavy-edges case must still catch it.
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family("reduce")
    config = family.space.check({**family.default_params, "vector_width": 4})
    name = family.kernel_name("float32", config)
    source = render(family, "float32", config)
    broken = source.replace("(STEP > 1 && tail < n)", "(STEP > 1 && tail < n - 1)")
    assert broken != source
    evaluator = Evaluator(WorkSpec("reduce", "float32", (("n", 2**20 + 3),)))
    arch = device_identity().arch
    assert evaluator.check(name, compile_cubin(source, arch), config.as_dict()).ok
    check = evaluator.check(name, compile_cubin(broken, arch), config.as_dict())
    assert not check.ok and "heavy_edges" in check.reason


def test_validation_catches_a_softmax_that_ignores_minus_infinity_rows():
    # A kernel that guards the all -inf row (subtracting 0 instead of -inf and dividing by 1
    # instead of 0) writes zeros there instead of NaN; validation must refuse it.
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family("softmax")
    config = family.space.check({**family.default_params, "row_cache": "global", "unroll": 4})
    name = family.kernel_name("float32", config)
    source = render(family, "float32", config)
    broken = source.replace("const float scale = 1.0f / s;", "const float scale = s > 0.0f ? 1.0f / s : 0.0f;")
    broken = broken.replace("expf(values[u][k] - m) * scale", "expf(values[u][k] - finite_or_zero(m)) * scale")
    assert broken.count("finite_or_zero(m)) * scale") == 1 and "s > 0.0f ?" in broken
    evaluator = Evaluator(WorkSpec("softmax", "float32", (("rows", 7), ("cols", 33))))
    check = evaluator.check(name, compile_cubin(broken, device_identity().arch), config.as_dict())
    assert not check.ok and "neg_inf" in check.reason


def _replayed_peer(family, problem, case):
    """Run the family's peer inside a captured CUDA graph (as the tuner times it); its output."""
    import cupy

    from autogen.core.compare import relative_error
    from autogen.gpu.measure import time_enqueue

    peer = family.peer(problem)
    if peer is None:
        return None
    inputs = family.make_inputs(problem, cupy, _rng(), case)
    expected = family.reference(problem, inputs, cupy)
    timing = time_enqueue(cupy, lambda _i: peer.run(inputs), 1, replays=3)
    assert timing.median_us > 0
    return relative_error(cupy, inputs[family.outputs[0]], expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_peer_is_correct_inside_graph_capture(dtype):
    family = get_family("reduce")
    error, reason = _replayed_peer(family, family.problem(dtype, n=2**20 + 3), {"values": "uniform"})
    assert not reason and error <= family.tolerance


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_peer_is_correct_inside_graph_capture(dtype):
    family = get_family("softmax")
    problem = family.problem(dtype, rows=64, cols=1024)
    result = _replayed_peer(family, problem, {"values": "uniform"})
    if result is None:
        pytest.skip("PyTorch with CUDA is not importable here: softmax has no peer")
    error, reason = result
    assert not reason and error <= family.tolerance_for(problem)


def _torch_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.parametrize("family_name, dtype, dims", [
    ("reduce", "float16", {"n": 2**20 + 3}),
    ("softmax", "float32", {"rows": 1000, "cols": 37}),
])
def test_short_tune_stores_a_winner_that_validates(db_url, family_name, dtype, dims):
    from tuning_db import TuningDB

    from autogen.gpu.compile import compile_cubin
    from autogen.search.tuner import TuneOptions, tune
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family(family_name)
    problem = family.problem(dtype, **dims)
    result = tune(problem, TuneOptions(trials=8, db_url=db_url, workers=4))
    assert result.winner is not None and result.measured >= 1
    stored = TuningDB(db_url).winner(result.device, family_name, dtype, problem.shape_key)
    assert stored is not None and stored.trial.kernel_name == result.winner.trial.kernel_name
    if family_name == "reduce" or _torch_available():
        assert stored.peer_name and stored.peer_time_us > 0
    config = family.space.check(stored.trial.params)
    cubin = compile_cubin(render(family, dtype, config), result.device.arch)
    evaluator = Evaluator(WorkSpec(family_name, dtype, problem.dims))
    assert evaluator.check(stored.trial.kernel_name, cubin, config.as_dict()).ok


def test_vocabulary_softmax_fp16_tunes_and_a_nearby_shape_is_served(db_url, monkeypatch):
    # Issue 33: every variant of 32 x 128256 fp16 failed "relative L2 error 0.00212 > 0.001", the
    # float64 answer correctly rounded to fp16 (probabilities near 1/128256 are fp16 subnormals),
    # and the dispatcher had nothing to serve at 3 x 100003. Half outputs are now allowed the
    # error of the rounded reference on top of the tolerance (autogen.gpu.measure.judge).
    import cupy
    from tuning_db import TuningDB

    from autogen.catalog import pretuned
    from autogen.runtime.dispatch import Dispatcher
    from autogen.search.tuner import TuneOptions, tune

    family = get_family("softmax")
    problem = family.problem("float16", rows=32, cols=128256)
    result = tune(problem, TuneOptions(trials=6, db_url=db_url, workers=4))
    assert result.winner is not None and result.measured >= 1, result.no_winner
    stored = TuningDB(db_url).winner(result.device, "softmax", "float16", problem.shape_key)
    assert stored is not None and family.tolerance_for(problem) < stored.trial.error < 3e-3

    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")  # this database's winner, not the catalog's
    pretuned.pretuned_db.cache_clear()
    try:
        nearby = family.problem("float16", rows=3, cols=100003)
        kernel = Dispatcher(db_url).lookup(nearby)
        assert kernel.served_by == "nearest" and kernel.name == stored.trial.kernel_name
        TuningDB(db_url).delete_trials(result.device, "softmax", "float16", problem.shape_key)
        default = Dispatcher(db_url).lookup(nearby)  # nothing tuned: the default config, validated here
        assert default.served_by == "default"
        scores = (cupy.random.default_rng(5).random((3, 100003), dtype=cupy.float32) - 0.5).astype(cupy.float16)
        x = scores.astype(cupy.float64)
        reference = cupy.exp(x - x.max(axis=1, keepdims=True))
        reference /= reference.sum(axis=1, keepdims=True)
        floor = rounding_error(cupy, reference, "float16")
        for served in (kernel, default):
            error = float(cupy.linalg.norm(served(scores).astype(cupy.float64) - reference) / cupy.linalg.norm(reference))
            assert error <= family.tolerance_for(nearby) + floor, (served.served_by, error, floor)
    finally:
        pretuned.pretuned_db.cache_clear()
