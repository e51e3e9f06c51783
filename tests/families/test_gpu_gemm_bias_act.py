"""gemm_bias_act on a real GPU: a sample of the space holding every choice of every parameter
validates (NaN-poisoned C, fresh inputs, float64 reference) for every activation, at batch 1 and
above, on shapes with tails; a kernel that skips the bias fails; the dispatcher serves
autogen.gemm_bias_act for CuPy and PyTorch operands (2-D and 3-D); the torch op; cuBLAS's strided
batched peer inside graph capture."""

from __future__ import annotations

import random

import pytest

from autogen.core.registry import get_family
from autogen.core.render import render
from autogen.gpu.compile import compile_many

pytestmark = pytest.mark.gpu

FAMILY = get_family("gemm_bias_act")
ACTS = ("relu", "gelu", "none")
# (batch, m, n, k): tails on every edge, batch 1 and more, k under one tile and over many.
SHAPES = [(1, 1, 1, 1), (3, 37, 41, 43), (1, 130, 67, 300), (5, 33, 260, 17), (2, 257, 129, 65), (4, 64, 64, 1000)]
BENCH = [(8, 1024, 1024, 1024), (64, 512, 512, 512)]


def problem(shape, act):
    return FAMILY.problem(**dict(zip(FAMILY.dims, shape)), act=act)


def sample_configs(act: str) -> dict:
    from nvcc_tools import extreme_configs

    p = problem(BENCH[0], act)
    picked = [c for shape in BENCH for c in FAMILY.seed_configs(problem(shape, act))]
    if act == "relu":  # every choice of every parameter, plus a random few; the other acts the seeds
        picked += extreme_configs(FAMILY) + random.Random(7).sample(list(FAMILY.space.enumerate()), 12)
    return {FAMILY.kernel_name("float32", c, p.traits): c for c in picked}


@pytest.fixture(scope="module")
def cubins():
    from autogen.gpu.device import device_identity

    found = {}
    for act in ACTS:
        configs = sample_configs(act)
        traits = problem(BENCH[0], act).traits
        sources = {name: render(FAMILY, "float32", c, traits=traits) for name, c in configs.items()}
        found[act] = (configs, compile_many(sources, device_identity().arch))
    return found


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_sampled_variants_validate(cubins, act, shape):
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    configs, compiled = cubins[act]
    assert all(isinstance(c, bytes) for c in compiled.values())
    evaluator = Evaluator(WorkSpec("gemm_bias_act", "float32", problem(shape, act).dims))
    failures = [f"{name}: {check.reason}" for name, config in configs.items()
                if not (check := evaluator.check(name, compiled[name], config.as_dict())).ok]
    assert not failures, f"{len(failures)} variants failed on {shape} {act}:\n" + "\n".join(failures[:20])


def test_validation_catches_a_kernel_that_skips_the_bias():
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    p = problem((2, 130, 67, 300), "none")
    config = FAMILY.default_config()
    name = FAMILY.kernel_name("float32", config, p.traits)
    source = render(FAMILY, "float32", config, traits=p.traits)
    broken = source.replace("+ __ldg(bias + gn + j)", "")
    assert broken != source
    check = Evaluator(WorkSpec("gemm_bias_act", "float32", p.dims)).check(
        name, compile_cubin(broken, device_identity().arch), config.as_dict())
    assert not check.ok


def test_dispatch_with_cupy_operands():
    import cupy

    import autogen
    from autogen.errors import ArgumentError

    rng = cupy.random.default_rng(1)
    A = rng.random((3, 100, 37), dtype=cupy.float32) - 0.5
    B = rng.random((3, 37, 259), dtype=cupy.float32) - 0.5
    bias = rng.random((259,), dtype=cupy.float32) - 0.5
    want = cupy.matmul(A.astype(cupy.float64), B.astype(cupy.float64)) + bias
    C = autogen.gemm_bias_act(A, B, bias)
    assert C.shape == (3, 100, 259) and float(cupy.abs(C - cupy.maximum(want, 0)).max()) < 1e-5
    out = cupy.full((3, 100, 259), cupy.nan, dtype=cupy.float32)
    assert autogen.gemm_bias_act(A, B, bias, act="none", out=out) is out
    assert float(cupy.abs(out - want).max()) < 1e-5
    one = autogen.gemm_bias_act(A[1], B[1], bias, act="relu")  # 2-D: batch 1
    assert one.shape == (100, 259) and float(cupy.abs(one - cupy.maximum(want[1], 0)).max()) < 1e-5
    with pytest.raises(ArgumentError, match="B has shape"):
        autogen.gemm_bias_act(A, B[:2], bias)
    with pytest.raises(ArgumentError, match="bias has 258"):
        autogen.gemm_bias_act(A, B, bias[:258])
    with pytest.raises(ArgumentError, match="act must be one of"):
        autogen.gemm_bias_act(A, B, bias, act="swish")


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


@pytest.mark.parametrize("act", ACTS)
def test_dispatch_and_torch_op_match_torch(act):
    torch = _torch()
    import autogen
    import autogen.torch.ops  # noqa: F401

    A = torch.rand(4, 65, 129, device="cuda") - 0.5
    B = torch.rand(4, 129, 70, device="cuda") - 0.5
    bias = torch.rand(70, device="cuda") - 0.5
    x = torch.baddbmm(bias.double(), A.double(), B.double())
    want = {"relu": torch.relu(x), "gelu": torch.nn.functional.gelu(x), "none": x}[act]
    C = autogen.gemm_bias_act(A, B, bias, act=act)
    assert isinstance(C, torch.Tensor) and C.shape == (4, 65, 70)
    assert float((C.double() - want).abs().max()) < 1e-5
    op = torch.ops.autogen.gemm_bias_act(A, B, bias, act)
    assert float((op.double() - want).abs().max()) < 1e-5
    out = torch.empty_like(C)
    torch.ops.autogen.gemm_bias_act_out(A, B, bias, act, out=out)
    assert torch.equal(out, op)


def test_peer_is_correct_inside_graph_capture():
    import cupy

    from autogen.core.compare import relative_error
    from autogen.gpu.measure import time_enqueue

    p = problem((8, 64, 96, 130), "none")
    peer = FAMILY.peer(p)
    assert peer is not None and "strided batched" in peer.name
    inputs = FAMILY.make_inputs(p, cupy, cupy.random.default_rng(3), {})
    assert time_enqueue(cupy, lambda _i: peer.run(inputs), 1, replays=3).median_us > 0
    expected = cupy.matmul(inputs["A"].astype(cupy.float64), inputs["B"].astype(cupy.float64))
    magnitude = cupy.matmul(cupy.abs(inputs["A"].astype(cupy.float64)), cupy.abs(inputs["B"].astype(cupy.float64)))
    error, reason = relative_error(cupy, inputs["C"], expected, magnitude)
    assert not reason and error < 1e-5
