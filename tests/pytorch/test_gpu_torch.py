"""autogen's torch ops on the GPU: torch.library.opcheck per family, torch.compile(fullgraph=True)
and mode="reduce-overhead" (CUDA graphs) with no graph break, a patched model against F.linear
within hgemv's tolerance, and unpatch."""

from __future__ import annotations

import pytest

from autogen.core.family import Family
from autogen.core.signature import op_name
from family_checks import built_in_families

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
import autogen.torch.ops  # noqa: E402,F401  registers torch.ops.autogen.*: this file must not rely on another having done it

FAMILIES = [f for f in built_in_families().values()  # whichever test modules registered others first
            if f.op_signature is not None and type(f).example_call is not Family.example_call]


def torch_example(family):
    """The family's example call (Family.example_call) as torch tensors: (args, outputs by keyword, scalars)."""
    import cupy
    problem = family.example_problem()
    args, kwargs = family.example_call(problem, cupy)

    def as_torch(value):
        if isinstance(value, (list, tuple)):  # a Tensor[] operand (concat's)
            return [as_torch(item) for item in value]
        if not isinstance(value, cupy.ndarray):
            return value
        tensor = torch.from_dlpack(value)
        return tensor.view(torch.bfloat16) if problem.dtype == "bfloat16" and tensor.dtype == torch.uint16 else tensor

    outputs = {o.name for o in family.op_signature.outputs}
    return ([as_torch(a) for a in args], {k: as_torch(v) for k, v in kwargs.items() if k in outputs},
            {k: v for k, v in kwargs.items() if k not in outputs})


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_opcheck(family):
    args, outputs, scalars = torch_example(family)
    name = op_name(family)
    getattr(torch.ops.autogen, name)(*args, **scalars)  # the first call compiles: outside opcheck's checks
    # copy_if's values past `count` are unspecified (the kernel writes the selected ones only), so
    # its outputs may differ between eager and AOT tracing there: every check but that comparison.
    utils = ("test_schema", "test_autograd_registration", "test_faketensor") if family.name == "copy_if" else \
        ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(getattr(torch.ops.autogen, name).default, tuple(args), scalars, test_utils=utils)
    torch.library.opcheck(getattr(torch.ops.autogen, f"{name}_out").default, tuple(args), {**scalars, **outputs},
                          test_utils=utils)


def graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_with_no_graph_break_matches_eager(mode):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    A = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)

    def step(A, x):
        y = torch.ops.autogen.hgemv(A, x.t().contiguous()).t()
        return torch.ops.autogen.softmax(y.float().contiguous())

    expected = step(A, x)
    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead: warm-up, record, replay
        got = compiled(A, x)
    torch.cuda.synchronize()
    assert graph_breaks() == 0
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def linear_error(got, expected) -> float:
    return float((got.float() - expected.float()).norm() / expected.float().norm())


@pytest.mark.parametrize("dtype, tolerance", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2), (torch.float32, 1e-5)])
def test_patched_model_matches_f_linear_and_unpatch_restores(dtype, tolerance):
    from autogen.torch import patch, patched_modules, unpatch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.SiLU(), torch.nn.Linear(4096, 1024, bias=False))
    model = model.to("cuda", dtype)
    with torch.inference_mode():
        for tokens in ((1, 1), (4,), (2, 4), (3, 3)):  # 1, 4 and 8 tokens are served; 9 falls back
            x = torch.randn(*tokens, 1024, device="cuda", dtype=dtype)
            expected = model(x)
            patch(model)
            assert patched_modules(model) == ["0", "2"]
            got = model(x)
            served = dtype != torch.float32 and x.numel() // 1024 <= 8 or x.numel() == 1024
            assert linear_error(got, expected) <= (tolerance if served else 0.0)
            unpatch(model)
            assert torch.equal(model(x), expected)


def test_patched_model_compiles_in_cuda_graphs_with_no_graph_break():
    from autogen.torch import patch
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    model = model.to("cuda", torch.bfloat16).eval()
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = model(x)
        patch(model)
        compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
        for _ in range(3):
            got = compiled(x)
        torch.cuda.synchronize()
    assert graph_breaks() == 0
    assert linear_error(got, expected) <= 1.6e-2
