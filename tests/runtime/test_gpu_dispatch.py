"""The dispatcher on a real GPU: every step of the chain, PyTorch interop, streams, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from dbfixtures import store_winner
from tuning_db import TuningDB
from tuning_db.records import DeviceIdentity

from autogen.catalog import pretuned
from autogen.runtime.dispatch import Dispatcher
from autogen.errors import ArgumentError, NotTunedError

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy():
    import cupy
    return cupy


@pytest.fixture
def device():
    from autogen.gpu.device import device_identity
    return device_identity()


@pytest.fixture
def dispatcher(db_url, monkeypatch):
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    yield Dispatcher(db_url)
    pretuned.pretuned_db.cache_clear()


def expected(A, x, alpha=1.0, beta=0.0, y=None):
    result = alpha * (A.get().astype(np.float64) @ x.get().astype(np.float64))
    return result + beta * y.get().astype(np.float64) if beta else result


def operands(cupy, m, n):
    rng = cupy.random.default_rng()
    return (rng.random((m, n), dtype=cupy.float32) - 0.5, rng.random(n, dtype=cupy.float32) - 0.5)


def assert_close(actual, reference):
    actual = np.asarray(actual.get() if hasattr(actual, "get") else actual.cpu().numpy(), dtype=np.float64)
    assert np.linalg.norm(actual - reference) <= 1e-5 * np.linalg.norm(reference)


def test_exact_nearest_arch_and_default(cupy, device, dispatcher, db_url):
    db = TuningDB(db_url)
    tuned = {"threads_per_row": 4, "vector_width": 4, "warps_per_block": 4, "rows_per_group": 1,
             "unroll": 1, "x_path": "ldg", "reduce": "shfl"}
    store_winner(db, device, 1000, 37, params=tuned)
    twin = DeviceIdentity("Twin of " + device.name, device.compute_capability, device.sm_count,
                          device.l2_bytes, device.driver_version, device.runtime_version, device.nvrtc_version)
    store_winner(TuningDB(db_url), twin, 64, 4096, params={**tuned, "threads_per_row": 128})
    cases = {(1000, 37): "exact", (1003, 37): "nearest"}
    for (m, n), step in cases.items():
        kernel = dispatcher.lookup(dispatcher_problem(m, n))
        assert kernel.served_by == step and kernel.params["threads_per_row"] == 4
        A, x = operands(cupy, m, n)
        assert_close(kernel(A, x), expected(A, x))
    # the nearest-shape check is remembered in the database
    source_hash = dispatcher.lookup(dispatcher_problem(1003, 37)).provenance["source_hash"]
    assert db.validation(device, "sgemv", "float32", "m=1003,n=37", source_hash).passed
    # another GPU of the same architecture only: "arch"; with nothing at all: "default"
    TuningDB(db_url).delete_trials(device, "sgemv", "float32", "m=1000,n=37")
    fresh = Dispatcher(db_url)
    assert fresh.lookup(dispatcher_problem(70, 4000)).served_by == "arch"
    TuningDB(db_url).delete_trials(twin, "sgemv", "float32", "m=64,n=4096")
    default = Dispatcher(db_url).lookup(dispatcher_problem(5, 7))
    assert default.served_by == "default"
    A, x = operands(cupy, 5, 7)
    assert_close(default(A, x), expected(A, x))
    with pytest.raises(NotTunedError):
        Dispatcher(db_url).lookup(dispatcher_problem(5, 7), strict=True)


def dispatcher_problem(m, n):
    from autogen.core.registry import get_family
    return get_family("sgemv").problem(m=m, n=n)


def test_public_api_alpha_beta_and_cache_hit(cupy, dispatcher, monkeypatch):
    import autogen
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_default_dispatcher", dispatcher)
    A, x = operands(cupy, 300, 77)
    y = cupy.random.default_rng().random(300, dtype=cupy.float32)
    expected_y = expected(A, x, 2.0, 0.5, y)
    assert autogen.sgemv(A, x, alpha=2.0, beta=0.5, y=y) is y
    assert_close(y, expected_y)
    kernel = autogen.lookup("sgemv", m=300, n=77)
    assert autogen.lookup("sgemv", m=300, n=77) is kernel  # compiled once, then a dictionary hit
    assert kernel.name.startswith("sgemv_f32_") and kernel.provenance["gpu"]


def test_pytorch_tensors_and_streams(cupy, dispatcher, monkeypatch):
    torch = pytest.importorskip("torch")
    import autogen
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_default_dispatcher", dispatcher)
    A = torch.rand(513, 129, device="cuda") - 0.5
    x = torch.rand(129, device="cuda") - 0.5
    reference = A.double() @ x.double()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # the current PyTorch stream is honoured
        y = autogen.sgemv(A, x)
    stream.synchronize()
    assert isinstance(y, torch.Tensor) and y.shape == (513,)
    assert torch.linalg.norm(y.double() - reference) <= 1e-5 * torch.linalg.norm(reference)
    side = cupy.cuda.Stream(non_blocking=True)
    A2, x2 = operands(cupy, 257, 64)
    y2 = autogen.sgemv(A2, x2, stream=side)
    side.synchronize()
    assert_close(y2, expected(A2, x2))


@pytest.mark.parametrize("make, fragment", [
    (lambda cp: (cp.ones((8, 4), dtype=cp.float64), cp.ones(4, dtype=cp.float32)), "A must have dtype float32"),
    (lambda cp: (cp.ones((8, 8), dtype=cp.float32)[:, ::2], cp.ones(4, dtype=cp.float32)), "A must be C-contiguous"),
    (lambda cp: (cp.ones((8, 4), dtype=cp.float32), cp.ones(5, dtype=cp.float32)), "x has length 5"),
    (lambda cp: (np.ones((8, 4), dtype=np.float32), cp.ones(4, dtype=cp.float32)), "A must be a CUDA array"),
    (lambda cp: (cp.ones(8, dtype=cp.float32), cp.ones(4, dtype=cp.float32)), "A must be 2-dimensional"),
])
def test_bad_operands_name_the_argument(cupy, dispatcher, monkeypatch, make, fragment):
    import autogen
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_default_dispatcher", dispatcher)
    with pytest.raises(ArgumentError, match=fragment):
        autogen.sgemv(*make(cupy))


def test_beta_without_y_and_wrong_y(cupy, dispatcher, monkeypatch):
    import autogen
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_default_dispatcher", dispatcher)
    A, x = operands(cupy, 8, 4)
    with pytest.raises(ArgumentError, match="beta != 0 needs y"):
        autogen.sgemv(A, x, beta=1.0)
    with pytest.raises(ArgumentError, match="y has length 7"):
        autogen.sgemv(A, x, y=cupy.zeros(7, dtype=cupy.float32))


def test_operand_on_another_gpu(cupy, dispatcher, monkeypatch):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU: nothing to mismatch")
    import autogen
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_default_dispatcher", dispatcher)
    with cupy.cuda.Device(1):
        A, x = operands(cupy, 8, 4)
    with pytest.raises(ArgumentError, match="A is on GPU 1"):
        autogen.sgemv(A, x)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reduce_sum_and_softmax_from_python(cupy, dispatcher, monkeypatch, dtype):
    import autogen
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_default_dispatcher", dispatcher)
    rng = cupy.random.default_rng()
    v = rng.random(100003, dtype=cupy.float32).astype(dtype)
    total = autogen.reduce_sum(v)
    assert total.shape == () and total.dtype == cupy.float32
    expected = float(v.astype(cupy.float64).sum())
    assert abs(float(total) - expected) <= 1e-5 * expected
    assert autogen.lookup("reduce", dtype=dtype, n=100003).served_by == "default"

    scores = (rng.random((37, 1001), dtype=cupy.float32) - 0.5).astype(dtype)
    probabilities = autogen.softmax(scores)
    assert probabilities.dtype == scores.dtype and probabilities.shape == scores.shape
    x = scores.astype(cupy.float64)
    reference = cupy.exp(x - x.max(axis=1, keepdims=True))
    reference /= reference.sum(axis=1, keepdims=True)
    error = float(cupy.linalg.norm(probabilities.astype(cupy.float64) - reference) / cupy.linalg.norm(reference))
    assert error <= (1e-5 if dtype == "float32" else 1e-3)
    with pytest.raises(ArgumentError, match="out has shape"):
        autogen.softmax(scores, out=cupy.empty((37, 1000), dtype=dtype))


def test_softmax_on_torch_tensors(cupy, dispatcher, monkeypatch):
    torch = pytest.importorskip("torch")
    import autogen
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_default_dispatcher", dispatcher)
    x = torch.randn(64, 300, device="cuda", dtype=torch.float16)
    y = autogen.softmax(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float16
    torch.cuda.synchronize()
    assert torch.allclose(y.float(), torch.softmax(x.float(), dim=-1), atol=2e-3)
