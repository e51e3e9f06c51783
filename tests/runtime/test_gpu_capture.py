"""Every dispatched call can be captured in a CUDA graph: CuPy's stream capture (global mode, so
any synchronisation or CuPy-pool allocation fails it) and torch.cuda.graph, for every family that
has Family.example_call (families added later are covered by adding the hook). A first call
inside capture raises CaptureError asking for a warm-up."""

from __future__ import annotations

import numpy as np
import pytest

from autogen.catalog import pretuned
from autogen.runtime.dispatch import Dispatcher, make_call
from autogen.errors import CaptureError
from autogen.core.family import Family
from family_checks import built_in_families

pytestmark = pytest.mark.gpu

FAMILIES = [f for f in built_in_families().values()  # whichever test modules registered others first
            if f.api and type(f).example_call is not Family.example_call]


def example(family, cupy):
    problem = family.example_problem()
    args, kwargs = family.example_call(problem, cupy)
    return problem, args, kwargs


def as_torch(torch, value, cupy):
    """A CuPy array as a torch tensor on the same memory, lists of them (concat's) too."""
    if isinstance(value, (list, tuple)):
        return type(value)(as_torch(torch, item, cupy) for item in value)
    return torch.as_tensor(value, device="cuda") if isinstance(value, cupy.ndarray) else value


@pytest.fixture
def cupy():
    import cupy
    return cupy


@pytest.fixture
def fresh_dispatcher(db_url, monkeypatch):
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    dispatcher = Dispatcher(db_url)
    monkeypatch.setattr(dispatch, "_default_dispatcher", dispatcher)
    yield dispatcher
    pretuned.pretuned_db.cache_clear()


def outputs(kwargs, cupy):
    return {k: v for k, v in kwargs.items() if isinstance(v, cupy.ndarray)}


def defined(arrays: dict) -> dict:
    """The part of each output a call defines: copy_if's values past its count are unspecified."""
    if "count" in arrays and "values" in arrays:
        count = int(arrays["count"][0])
        return {**arrays, "values": arrays["values"][:count]}
    return arrays


def as_tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def global_mode(cupy):
    return getattr(cupy.cuda.runtime, "streamCaptureModeGlobal", 0)


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_cupy_stream_capture(family, cupy, fresh_dispatcher):
    call = make_call(family.name)
    _problem, args, kwargs = example(family, cupy)
    stream = cupy.cuda.Stream(non_blocking=True)
    # first use inside capture: a clear error, and the capture is left intact
    with stream:
        stream.begin_capture(global_mode(cupy))
        try:
            with pytest.raises(CaptureError, match="warm up"):
                call(*args, **kwargs)
        finally:
            stream.end_capture()
    with stream:
        call(*args, **kwargs)  # warm-up on the stream that will capture
        # Copied on that stream and waited for: a copy on the null stream could still be reading
        # when the poisoning below (on the non-blocking stream) writes NaN over the outputs.
        eager = defined({k: v.copy() for k, v in outputs(kwargs, cupy).items()})
    stream.synchronize()
    with stream:
        stream.begin_capture(global_mode(cupy))
        try:
            call(*args, **kwargs)
        finally:
            graph = stream.end_capture()
    with stream:  # poisoned on the graph's stream: a non-blocking stream does not wait for the null stream
        for value in outputs(kwargs, cupy).values():
            value.fill(np.nan if value.dtype.kind == "f" else 0)
    graph.launch(stream)
    stream.synchronize()
    for name, value in defined(outputs(kwargs, cupy)).items():
        cupy.testing.assert_allclose(value, eager[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_cupy_capture_without_out_asks_for_it(family, cupy, fresh_dispatcher):
    _problem, args, kwargs = example(family, cupy)
    if not outputs(kwargs, cupy):
        pytest.skip("no output argument")
    call = make_call(family.name)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        call(*args, **kwargs)
        stream.begin_capture(global_mode(cupy))
        try:
            with pytest.raises(CaptureError, match="pass .*="):
                call(*args)
        finally:
            stream.end_capture()


@pytest.mark.parametrize("with_out", [True, False], ids=["out_given", "out_from_graph_pool"])
@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_torch_cuda_graph(family, cupy, fresh_dispatcher, with_out):
    torch = pytest.importorskip("torch")
    call = make_call(family.name)
    _problem, args, kwargs = example(family, cupy)
    targs = [as_torch(torch, a, cupy) for a in args]
    tkwargs = {k: as_torch(torch, v, cupy) for k, v in kwargs.items()}
    if not with_out:
        tkwargs = {k: v for k, v in tkwargs.items() if not isinstance(v, torch.Tensor)}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            expected = call(*targs, **tkwargs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    expected = [e.clone() for e in as_tuple(expected)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = as_tuple(call(*targs, **tkwargs))
    for r in result:
        assert isinstance(r, torch.Tensor)
        r.fill_(float("nan")) if r.dtype.is_floating_point else r.zero_()
    for _ in range(2):  # replayable again
        graph.replay()
        torch.cuda.synchronize()
        names = ("values", "count") if len(result) == 2 else ("out",)
        got = defined(dict(zip(names, (r.float() for r in result))))
        want = defined(dict(zip(names, (e.float() for e in expected))))
        for name in got:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_pdl_call_matches_the_plain_one(cupy, fresh_dispatcher):
    import autogen

    rng = cupy.random.default_rng(1)
    A = rng.random((4096, 512), dtype=cupy.float32) - 0.5
    x = rng.random(512, dtype=cupy.float32) - 0.5
    plain = autogen.sgemv(A, x)
    pdl = autogen.sgemv(A, x, pdl=True)
    cupy.testing.assert_allclose(pdl, plain, rtol=1e-5, atol=1e-6)
    stream = cupy.cuda.Stream(non_blocking=True)
    y = cupy.empty(4096, dtype=cupy.float32)
    with stream:
        autogen.sgemv(A, x, y=y, pdl=True)
        stream.begin_capture(global_mode(cupy))
        try:
            autogen.sgemv(A, x, y=y, pdl=True)
        finally:
            graph = stream.end_capture()
    with stream:  # poisoned on the graph's stream: a non-blocking stream does not wait for the null stream
        y.fill(np.nan)
    graph.launch(stream)
    stream.synchronize()
    cupy.testing.assert_allclose(y, plain, rtol=1e-5, atol=1e-6)
