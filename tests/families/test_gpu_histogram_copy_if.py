"""histogram and copy_if on a real GPU: a sample of variants holding every parameter choice
validates exactly on tail shapes and both data shapes; misaligned inputs; repeated launches
(graph replays) reuse the workspace; the Python calls with CuPy and torch operands; the peers
inside graph capture (CUB through the benchmark's nvcc build); a short tune; the export
self-test builds and passes."""

from __future__ import annotations

import math
import os
import random
import secrets
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autogen.gpu.compile import compile_many
from autogen.core.registry import get_family
from autogen.core.render import render
from nvcc_tools import extreme_configs

pytestmark = pytest.mark.gpu

HISTOGRAM_SHAPES = [(1, 1, "uniform"), (37, 5, "skewed"), (4097, 256, "uniform"), (100_003, 4096, "skewed"),
                    (70_001, 20_000, "uniform"), (2**20 + 3, 256, "skewed")]
COPY_IF_SHAPES = [(1, "p50"), (33, "p99"), (4097, "p01"), (65_537, "p50"), (2**20 + 3, "p99")]
SAMPLE = 12  # random variants per family and dtype, on top of one holding each parameter choice
ROOT = Path(__file__).resolve().parent.parent.parent


def _sample(family) -> list:
    configs = extreme_configs(family)
    rest = [c for c in family.space.enumerate() if c not in configs]
    return configs + random.Random(4).sample(rest, SAMPLE)


@pytest.fixture(scope="module")
def cubins():
    """{(family, dtype): [(config, kernel name, cubin)]}, compiled in one pool."""
    from autogen.gpu.device import device_identity

    chosen, sources = {}, {}
    for name in ("histogram", "copy_if"):
        family = get_family(name)
        for dtype in family.dtypes:
            for config in _sample(family):
                kernel = family.kernel_name(dtype, config)
                chosen.setdefault((name, dtype), []).append((config, kernel))
                sources[kernel] = render(family, dtype, config)
    built = compile_many(sources, device_identity().arch)
    failed = {k: str(v)[:300] for k, v in built.items() if not isinstance(v, bytes)}
    assert not failed, failed
    return {key: [(c, k, built[k]) for c, k in items] for key, items in chosen.items()}


def _rng():
    import cupy
    return cupy.random.default_rng(secrets.randbits(63))


def _check_all(cubins, name, dtype, dims, keep=lambda config: True):
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    evaluator = Evaluator(WorkSpec(name, dtype, tuple(dims.items())))
    failures = []
    for config, kernel, cubin in cubins[(name, dtype)]:
        if keep(config):
            check = evaluator.check(kernel, cubin, config.as_dict())
            if not check.ok:
                failures.append(f"{kernel}: {check.reason}")
    assert not failures, f"{len(failures)} {name} {dtype} variants failed on {dims}:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("n, bins, distribution", HISTOGRAM_SHAPES)
def test_every_sampled_histogram_variant_counts_exactly(cubins, n, bins, distribution):
    _check_all(cubins, "histogram", "int32", {"n": n, "bins": bins, "distribution": distribution})


@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("order", ["ordered", "unordered"])
@pytest.mark.parametrize("n, selectivity", COPY_IF_SHAPES)
def test_every_sampled_copy_if_variant_selects_exactly(cubins, dtype, order, n, selectivity):
    from autogen.families.copy_if import ORDERED_MODES

    keep = (lambda c: c["mode"] in ORDERED_MODES) if order == "ordered" else (lambda c: True)
    _check_all(cubins, "copy_if", dtype, {"n": n, "selectivity": selectivity, "order": order}, keep)


def _launcher(family, problem, config, kernel, cubin):
    import cupy

    module = cupy.cuda.function.Module()
    module.load(cubin)
    steps = [(module.get_function(kernel + s.suffix), s) for s in family.plan(problem, config)]

    def launch(inputs):
        for function, step in steps:
            function(step.launch.grid, step.launch.block, step.args(inputs), shared_mem=step.launch.shared_bytes)

    launch.module = module
    return launch


def _misaligned(cupy, array):
    """The same values one element past a 16-byte boundary."""
    base = cupy.empty(array.size + 1, dtype=array.dtype)
    view = base[1:]
    view[...] = array
    return view


def test_misaligned_inputs_and_repeated_launches():
    # Vector loads must fall back to scalar ones off alignment; launched again and again on the
    # same buffers (as in a replayed graph), the init steps must reset the workspace each time.
    import cupy

    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity

    arch = device_identity().arch
    hist = get_family("histogram")
    problem = hist.problem(n=2**20 + 3, bins=300, distribution="skewed")
    for params in ({"target": "shared", "aggregate": "warp", "copies": 4}, {"target": "global", "aggregate": "none"}):
        config = hist.space.check({**hist.default_params, **params})
        kernel = hist.kernel_name("int32", config)
        launch = _launcher(hist, problem, config, kernel, compile_cubin(render(hist, "int32", config), arch))
        inputs = hist.make_inputs(problem, cupy, _rng(), {"values": "skewed"})
        inputs["x"] = _misaligned(cupy, inputs["x"])
        expected = hist.reference(problem, inputs, cupy)
        for _ in range(3):
            launch(inputs)
            assert hist.compare(problem, inputs, expected, None, cupy) == (0.0, ""), kernel

    copy_if = get_family("copy_if")
    for dtype in ("int32", "float32"):
        # One block per tile, persistent pipelined blocks (several tiles each: 513 tiles), both
        # scatters, two_pass, warp.
        for mode, bps, scatter in (("lookback", 0, "shared"), ("lookback", 1, "direct"), ("lookback", 2, "shared"),
                                   ("two_pass", 4, "shared"), ("block", 0, "direct"), ("block", 1, "shared"),
                                   ("warp", 0, "direct")):
            problem = copy_if.problem(dtype, n=2**21 + 5, selectivity="p50", order="ordered" if mode in ("lookback", "two_pass") else "unordered")
            config = copy_if.space.check({**copy_if.default_params, "mode": mode, "vector_width": 4,
                                          "blocks_per_sm": bps, "scatter": scatter, "items_per_thread": 8 if bps else 16})
            kernel = copy_if.kernel_name(dtype, config)
            launch = _launcher(copy_if, problem, config, kernel, compile_cubin(render(copy_if, dtype, config), arch))
            inputs = copy_if.make_inputs(problem, cupy, _rng(), {"select": "p50"})
            inputs["x"] = _misaligned(cupy, inputs["x"])
            expected = copy_if.reference(problem, inputs, cupy)
            for _ in range(3):
                launch(inputs)
                assert copy_if.compare(problem, inputs, expected, None, cupy) == (0.0, ""), kernel
                inputs["count"][...] = -1


def test_python_calls_with_cupy_and_torch():
    import cupy

    import autogen

    x = cupy.asarray(np.random.default_rng(0).integers(-5, 300, 100_003, dtype=np.int32))
    counts = autogen.histogram(x, 256)
    want = np.bincount(cupy.asnumpy(x)[(cupy.asnumpy(x) >= 0) & (cupy.asnumpy(x) < 256)], minlength=256)
    assert counts.dtype == cupy.int32 and np.array_equal(cupy.asnumpy(counts), want)
    out = cupy.full(256, 7, dtype=cupy.uint32)
    assert autogen.histogram(x, 256, out=out, distribution="skewed") is out
    assert np.array_equal(cupy.asnumpy(out), want)

    values, count = autogen.copy_if(x, 100)
    host = cupy.asnumpy(x)
    chosen = host[host > 100]
    assert int(count[0]) == chosen.size and np.array_equal(cupy.asnumpy(values[: chosen.size]), chosen)
    values, count = autogen.copy_if(x, 100, ordered=False, selectivity=0.7)
    assert np.array_equal(np.sort(cupy.asnumpy(values[: int(count[0])])), np.sort(chosen))

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    t = torch.as_tensor(host, device="cuda")
    counts = autogen.histogram(t, 256)
    assert isinstance(counts, torch.Tensor) and counts.dtype == torch.int32
    assert torch.equal(counts.cpu(), torch.as_tensor(want, dtype=torch.int32))
    f = torch.rand(50_001, device="cuda")
    values, count = autogen.copy_if(f, 0.25)
    assert isinstance(values, torch.Tensor) and values.dtype == torch.float32 and count.dtype == torch.int32
    ref = torch.masked_select(f, f > 0.25)
    assert int(count.item()) == ref.numel() and torch.equal(values[: ref.numel()], ref)


def test_histogram_peer_inside_graph_capture():
    import cupy

    from autogen.gpu.measure import time_enqueue

    family = get_family("histogram")
    problem = family.problem(n=2**20 + 3, bins=4096)
    peer = family.peer(problem)
    assert peer is not None
    inputs = family.make_inputs(problem, cupy, _rng(), {"values": "uniform"})
    expected = family.reference(problem, inputs, cupy)
    timing = time_enqueue(cupy, lambda _i: peer.run(inputs), 1, replays=3)
    assert timing.median_us > 0
    assert family.compare(problem, inputs, expected, None, cupy) == (0.0, "")


@pytest.fixture(scope="module")
def cub_library(tmp_path_factory):
    """The benchmark's CUB peers built with nvcc for this GPU, named in AUTOGEN_CUB_PEERS."""
    from autogen.families import cub_peers
    from autogen.gpu.device import device_identity

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    path = tmp_path_factory.mktemp("cub") / "libautogen_cub_peers.so"
    done = subprocess.run(["nvcc", "-O3", "-std=c++17", f"-arch={device_identity().arch}", "-shared", "-Xcompiler",
                           "-fPIC", "-o", str(path), str(ROOT / "scripts" / "cub_peers.cu")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = os.environ.get(cub_peers.ENV)
    os.environ[cub_peers.ENV] = str(path)
    cub_peers.cub_library.cache_clear()
    yield path
    if saved is None:
        os.environ.pop(cub_peers.ENV, None)
    else:
        os.environ[cub_peers.ENV] = saved
    cub_peers.cub_library.cache_clear()


@pytest.mark.parametrize("family_name, dtype, dims", [
    ("histogram", "int32", {"n": 2**20 + 3, "bins": 4096, "distribution": "skewed"}),
    ("copy_if", "int32", {"n": 2**20 + 3, "selectivity": "p50"}),
    ("copy_if", "float32", {"n": 2**20 + 3, "selectivity": "p01"}),
])
def test_cub_peers_inside_graph_capture(cub_library, family_name, dtype, dims):
    import cupy

    from autogen.gpu.measure import time_enqueue

    family = get_family(family_name)
    problem = family.problem(dtype, **dims)
    peer = family.peer(problem)
    assert peer is not None and peer.name.startswith("CUB")
    inputs = family.make_inputs(problem, cupy, _rng(), family.validation_cases(problem)[0])
    expected = family.reference(problem, inputs, cupy)
    timing = time_enqueue(cupy, lambda _i: peer.run(inputs), 1, replays=3)
    assert timing.median_us > 0
    assert family.compare(problem, inputs, expected, None, cupy) == (0.0, "")


@pytest.mark.parametrize("family_name, dtype, dims", [
    ("histogram", "int32", {"n": 2**20 + 3, "bins": 256, "distribution": "skewed"}),
    ("copy_if", "float32", {"n": 2**20 + 3, "selectivity": "p50", "order": "unordered"}),
])
def test_short_tune_stores_a_winner_that_validates(db_url, family_name, dtype, dims):
    from tuning_db import TuningDB

    from autogen.gpu.compile import compile_cubin
    from autogen.search.tuner import TuneOptions, tune
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family(family_name)
    problem = family.problem(dtype, **dims)
    result = tune(problem, TuneOptions(trials=6, db_url=db_url, workers=4))
    assert result.winner is not None and result.measured >= 1
    stored = TuningDB(db_url).winner(result.device, family_name, dtype, problem.shape_key)
    assert stored is not None and stored.trial.shape_key == problem.shape_key
    config = family.space.check(stored.trial.params)
    evaluator = Evaluator(WorkSpec(family_name, dtype, problem.dims))
    cubin = compile_cubin(render(family, dtype, config), result.device.arch)
    assert evaluator.check(stored.trial.kernel_name, cubin, config.as_dict()).ok


@pytest.mark.parametrize("family_name", ["histogram", "copy_if"])
def test_export_selftest_builds_and_passes(tmp_path, family_name):
    from test_histogram_family import export_with_defaults

    if shutil.which("nvcc") is None or shutil.which("make") is None:
        pytest.skip("needs nvcc and make on PATH")
    family = get_family(family_name)
    if family_name == "histogram":
        tuned = {"int32": [((4096, 256), dict(family.default_params)),
                           ((2**20, 4096), {**family.default_params, "aggregate": "warp", "copies": 2})]}
    else:
        tuned = {"int32": [((4096,), dict(family.default_params)),
                           ((2**20,), {**family.default_params, "mode": "two_pass", "blocks_per_sm": 4})],
                 "float32": [((2**20,), {**family.default_params, "mode": "block"})]}
    out = tmp_path / "export"
    export_with_defaults(family_name, out, tuned)
    from autogen.gpu.device import device_identity
    build = subprocess.run(["make", "-C", str(out), f"ARCH={device_identity().arch}", "selftest"],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    done = subprocess.run([str(out / f"autogen_{family_name}_selftest")], capture_output=True, text=True, timeout=600)
    print(done.stdout[-4000:])
    assert done.returncode == 0 and "autogen self-test: PASS" in done.stdout, done.stdout[-4000:]
