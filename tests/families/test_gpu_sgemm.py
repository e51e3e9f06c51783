"""sgemm on a real GPU: a sample of the space holding every choice of every parameter (plus the
variants nearest their register cap) validates on tail shapes and on misaligned operands; the
dispatcher serves autogen.sgemm for CuPy and PyTorch operands; cuBLAS runs inside graph capture;
a short tune stores a winner; the exported self-test builds and passes."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

from autogen.gpu.compile import compile_many
from autogen.core.registry import get_family
from autogen.core.render import render

pytestmark = pytest.mark.gpu

FAMILY = get_family("sgemm")
# (m, n, k): tails on every edge, k under one tile, k over many split ranges, odd everything;
# 300 x 260 x 256 has interior and edge blocks side by side (pipeline=regsedge takes both paths).
SHAPES = [(1, 1, 1), (37, 41, 43), (130, 67, 300), (64, 64, 4100), (257, 129, 65), (33, 1000, 17), (5, 3, 2000),
          (300, 260, 256)]
BENCH_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4097, 4097, 4097), (1024, 1024, 1024), (1000, 1000, 1000),
                (4096, 4096, 64), (128, 12288, 4096), (12288, 128, 4096), (64, 64, 65536)]


def sample_configs() -> dict:
    from nvcc_tools import extreme_configs
    from test_sgemm_family import tightest, tightest_capped

    everything = list(FAMILY.space.enumerate())
    # The seeds of the benchmark shapes (what every search measures first), the capped variants
    # nearest spilling (min_blocks=2), then a random sample.
    seeds = [c for shape in BENCH_SHAPES for c in FAMILY.seed_configs(FAMILY.problem(m=shape[0], n=shape[1], k=shape[2]))]
    picked = (extreme_configs(FAMILY) + tightest(16) + tightest_capped() + seeds
              + random.Random(7).sample(everything, 60))
    # Every choice of every parameter, also in a config far from the first one that holds it.
    rng = random.Random(11)
    for param in FAMILY.space.params:
        for choice in param.choices:
            picked.append(rng.choice([c for c in everything if c[param.name] == choice]))
    return {FAMILY.kernel_name("float32", c): c for c in picked}


@pytest.fixture(scope="module")
def all_cubins():
    from autogen.gpu.device import device_identity

    configs = sample_configs()
    sources = {name: render(FAMILY, "float32", c) for name, c in configs.items()}
    return configs, compile_many(sources, device_identity().arch)


def test_sampled_variants_compile_with_nvrtc(all_cubins):
    configs, cubins = all_cubins
    failures = {name: str(c)[:300] for name, c in cubins.items() if not isinstance(c, bytes)}
    assert not failures
    for param in FAMILY.space.params:
        assert {c[param.name] for c in configs.values()} == set(param.choices)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_sampled_variants_validate(all_cubins, m, n, k):
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    configs, cubins = all_cubins
    evaluator = Evaluator(WorkSpec("sgemm", "float32", (("m", m), ("n", n), ("k", k))))
    failures = []
    for name, config in configs.items():
        check = evaluator.check(name, cubins[name], config.as_dict())
        if not check.ok:
            failures.append(f"{name}: {check.reason}")
    assert not failures, f"{len(failures)} variants failed on {m}x{n}x{k}:\n" + "\n".join(failures[:20])


def _misaligned_inputs(cupy, m, n, k, beta):
    """A, B, C one float past an aligned address: every vector path must fall back."""
    rng = cupy.random.default_rng(5)

    def view(rows, cols, poison=False):
        base = cupy.empty(rows * cols + 1, dtype=cupy.float32)
        base[...] = cupy.nan if poison else rng.random(base.size, dtype=cupy.float32) - 0.5
        return base[1:].reshape(rows, cols)

    C = view(m, n, poison=beta == 0.0)
    return {"A": view(m, k), "B": view(k, n), "C": C, "alpha": 1.25, "beta": beta}


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_vector_variants_fall_back_on_misaligned_operands(all_cubins, beta):
    import cupy

    from autogen.gpu.evaluator import Evaluator, WorkSpec

    configs, cubins = all_cubins
    m, n, k = 68, 72, 76  # multiples of 4: only the pointers are misaligned
    evaluator = Evaluator(WorkSpec("sgemm", "float32", (("m", m), ("n", n), ("k", k))))
    problem = FAMILY.problem(m=m, n=n, k=k)
    failures = []
    for name, config in configs.items():
        if config["vector_width"] == 1 and config["store_width"] == 1:
            continue
        inputs = _misaligned_inputs(cupy, m, n, k, beta)
        assert inputs["A"].data.ptr % 16 == 4
        expected = FAMILY.reference(problem, inputs, cupy)
        magnitude = FAMILY.reference_magnitude(problem, inputs, cupy)
        evaluator._launcher(name, cubins[name], config.as_dict())(inputs)
        error, reason = FAMILY.compare(problem, inputs, expected, magnitude, cupy)
        if reason or not error <= FAMILY.tolerance:
            failures.append(f"{name}: {reason or error}")
    assert not failures, "\n".join(failures[:20])


def test_validation_catches_a_kernel_that_skips_the_last_row():
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    config = FAMILY.default_config()
    name = FAMILY.kernel_name("float32", config)
    source = render(FAMILY, "float32", config)
    broken = source.replace("if (gm >= m) continue;", "if (gm >= m - 1) continue;")
    assert broken != source
    cubin = compile_cubin(broken, device_identity().arch)
    evaluator = Evaluator(WorkSpec("sgemm", "float32", (("m", 130), ("n", 67), ("k", 300))))
    check = evaluator.check(name, cubin, config.as_dict())
    assert not check.ok and "NaN" in check.reason


def test_dispatch_with_cupy_operands():
    import cupy

    import autogen
    from autogen.errors import ArgumentError

    rng = cupy.random.default_rng(1)
    A = rng.random((100, 37), dtype=cupy.float32) - 0.5
    B = rng.random((37, 259), dtype=cupy.float32) - 0.5
    C = autogen.sgemm(A, B)
    assert C.shape == (100, 259) and C.dtype == cupy.float32
    want = A.astype(cupy.float64) @ B.astype(cupy.float64)
    assert float(cupy.abs(C - want).max()) < 1e-5
    C0 = rng.random((100, 259), dtype=cupy.float32) - 0.5
    out = C0.copy()
    assert autogen.sgemm(A, B, alpha=2.0, beta=-0.5, C=out) is out
    assert float(cupy.abs(out - (2.0 * want - 0.5 * C0)).max()) < 1e-5
    inputs = _misaligned_inputs(cupy, 33, 65, 17, 0.0)  # through the dispatcher too
    C = autogen.sgemm(inputs["A"], inputs["B"], alpha=1.25, C=inputs["C"])
    want = 1.25 * (inputs["A"].astype(cupy.float64) @ inputs["B"].astype(cupy.float64))
    assert float(cupy.abs(C - want).max()) < 1e-5
    with pytest.raises(ArgumentError, match="B has 36 rows"):
        autogen.sgemm(A, B[:36])
    with pytest.raises(ArgumentError, match="beta != 0 needs C"):
        autogen.sgemm(A, B, beta=1.0)


def test_dispatch_with_torch_operands():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    import autogen

    A = torch.rand(64, 129, device="cuda") - 0.5
    B = torch.rand(129, 70, device="cuda") - 0.5
    C = autogen.sgemm(A, B, alpha=0.5)
    assert isinstance(C, torch.Tensor) and C.shape == (64, 70)
    want = 0.5 * (A.double() @ B.double())
    assert float((C.double() - want).abs().max()) < 1e-5


def test_peer_is_correct_inside_graph_capture():
    import cupy

    from autogen.core.compare import relative_error
    from autogen.gpu.measure import time_enqueue

    problem = FAMILY.problem(m=64, n=64, k=65536)
    rng = cupy.random.default_rng(3)
    peer = FAMILY.peer(problem)
    assert peer is not None and "cuBLAS" in peer.name
    for case in FAMILY.validation_cases(problem):
        inputs = FAMILY.make_inputs(problem, cupy, rng, case)
        expected = FAMILY.reference(problem, inputs, cupy)
        magnitude = FAMILY.reference_magnitude(problem, inputs, cupy)
        if case["beta"] != 0.0:
            # Replays would apply beta again and again: the peer runs once, captured.
            graph_stream = cupy.cuda.Stream(non_blocking=True)
            with graph_stream:
                graph_stream.begin_capture()
                peer.run(inputs)
                graph = graph_stream.end_capture()
            graph.launch(graph_stream)
            graph_stream.synchronize()
        else:
            assert time_enqueue(cupy, lambda _i: peer.run(inputs), 1, replays=3).median_us > 0
        error, reason = relative_error(cupy, inputs["C"], expected, magnitude)
        assert not reason and error <= FAMILY.tolerance, (case, error, reason)


def test_short_tune_stores_a_winner_that_validates(db_url):
    from tuning_db import TuningDB

    from autogen.gpu.compile import compile_cubin
    from autogen.search.tuner import TuneOptions, tune
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    problem = FAMILY.problem(m=1000, n=1000, k=1000)
    result = tune(problem, TuneOptions(trials=8, db_url=db_url, workers=8))
    assert result.winner is not None and result.measured >= 1
    stored = TuningDB(db_url).winner(result.device, "sgemm", "float32", problem.shape_key)
    assert stored is not None and stored.peer_name and stored.peer_time_us > 0
    config = FAMILY.space.check(stored.trial.params)
    cubin = compile_cubin(render(FAMILY, "float32", config), result.device.arch)
    evaluator = Evaluator(WorkSpec("sgemm", "float32", problem.dims))
    assert evaluator.check(stored.trial.kernel_name, cubin, config.as_dict()).ok


def test_exported_selftest_passes(tmp_path, db_url):
    from autogen.cli.main import main
    from autogen.gpu.device import device_identity
    from tuning_db import TuningDB

    if shutil.which("nvcc") is None or shutil.which("make") is None:
        pytest.skip("needs nvcc and make on PATH")
    from test_export import store_winner

    device = device_identity()
    split = dict(FAMILY.default_params, block_m=32, block_n=32, thread_m=4, thread_n=4, split_k=16,
                 store_width=4, pipeline="async3")
    skinny = dict(FAMILY.default_params, block_m=64, block_n=64, thread_m=4, thread_n=4, pipeline="async2",
                  vector_width=1)
    with TuningDB(db_url) as db:
        store_winner(db, device, "sgemm", {"m": 1024, "n": 1024, "k": 1024}, dict(FAMILY.default_params, min_blocks=2),
                     100.0)
        store_winner(db, device, "sgemm", {"m": 64, "n": 64, "k": 8192}, split, 10.0)
        store_winner(db, device, "sgemm", {"m": 200, "n": 300, "k": 64}, skinny, 5.0)
    out = tmp_path / "export"
    assert main(["export", "sgemm", "--out", str(out), "--db", db_url, "--self-test"]) == 0
    build = subprocess.run(["make", "-C", str(out), "selftest"], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    done = subprocess.run([str(out / "autogen_sgemm_selftest")], capture_output=True, text=True, timeout=600)
    print("\n--- exported self-test output ---\n" + done.stdout + done.stderr)
    assert done.returncode == 0 and "autogen self-test: PASS" in done.stdout
