"""The dispatcher's hot path and its guards on the CPU, with stand-ins for CuPy: kernel scalars
converted once, first use inside CUDA graph capture refused, CuPy-pool allocation inside capture
refused, stale winners validated before they are served, example_call hooks."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from autogen.core import operands as family_module
from autogen.catalog import pretuned
from autogen.runtime.dispatch import Dispatcher, TunedKernel
from autogen.runtime.streams import capturing
from autogen.errors import CaptureError
from autogen.core.registry import all_families, get_family
from autogen.core.operands import kernel_scalar, new_output
from dbfixtures import H100, store_winner
from tuning_db import TuningDB

pytestmark = pytest.mark.usefixtures("fresh_scalar_cache")  # they count conversions

SGEMV = get_family("sgemv")


def fake_cupy(capturing_status: int = 0):
    stream = types.SimpleNamespace(ptr=1234)
    runtime = types.SimpleNamespace(getDevice=lambda: 0, streamIsCapturing=lambda ptr: capturing_status)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime, get_current_stream=lambda: stream),
                                 empty=lambda shape, dtype: np.empty(shape, dtype))


def test_kernel_scalars_are_converted_once():
    one = kernel_scalar(1.5)
    assert kernel_scalar(1.5) is one
    assert float(getattr(one, "held", one)) == 1.5 and getattr(one, "held", one).dtype == np.float32
    m = kernel_scalar(4096, np.int32)
    assert getattr(m, "held", m).dtype == np.int32
    nan = kernel_scalar(float("nan"))
    assert np.isnan(getattr(nan, "held", nan)) and kernel_scalar(float("nan")) is not nan


def test_sgemv_args_reuse_converted_scalars():
    problem = SGEMV.problem(m=64, n=16)
    (step,) = SGEMV.plan(problem, SGEMV.default_config())
    first = step.args({"A": "A", "x": "x", "y": "y", "alpha": 1.0, "beta": 0.0})
    again = step.args({"A": "A", "x": "x", "y": "y", "alpha": 1, "beta": 0})
    assert first[3:] == again[3:] and all(a is b for a, b in zip(first[3:], again[3:]))
    values = [float(getattr(v, "held", v)) for v in step.args({"A": 0, "x": 0, "y": 0, "alpha": -2.0, "beta": 0.5})[3:]]
    assert values == [64, 16, -2.0, 0.5]


def test_capture_is_detected(monkeypatch):
    assert not capturing(fake_cupy(0))
    assert capturing(fake_cupy(1))

    def broken(ptr):
        raise RuntimeError("cudaErrorStreamCaptureInvalidated")

    cupy = fake_cupy()
    cupy.cuda.runtime.streamIsCapturing = broken
    assert capturing(cupy)


def test_cupy_without_a_driver_captures_nothing():
    # CuPy imported on a machine without a GPU: asking for the current stream raises (as
    # cudaErrorInsufficientDriver does); nothing can capture, and the GPU check names the problem.
    def no_driver():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    cupy = fake_cupy(1)
    cupy.cuda.get_current_stream = no_driver
    assert not capturing(cupy)


def test_first_use_inside_capture_asks_for_a_warm_up(db_url, monkeypatch, no_catalog):
    import autogen.runtime.dispatch as dispatch

    monkeypatch.setattr(dispatch, "_CUPY", fake_cupy(capturing_status=1))
    dispatcher = Dispatcher(db_url)
    monkeypatch.setattr(dispatcher, "_build", lambda *a: pytest.fail("compiled inside capture"))
    with pytest.raises(CaptureError, match="warm up: call it once"):
        dispatcher.lookup(SGEMV.problem(m=64, n=16), device=0)
    pretuned.pretuned_db.cache_clear()


def test_cupy_pool_allocation_inside_capture_is_refused():
    with pytest.raises(CaptureError, match="pass y="):
        new_output(fake_cupy(capturing_status=1), object(), (4,), "float32", "y")
    assert new_output(fake_cupy(0), object(), (4,), "float32").shape == (4,)


def test_a_stale_exact_winner_is_validated_before_it_is_served(db_url, monkeypatch, no_catalog):
    # no_catalog also clears the cached catalog after the test: a cached "none" left behind made
    # later tests of the same worker find nothing shipped (tests/gpu/test_resources.py, CI).
    import autogen.gpu.device

    store_winner(TuningDB(db_url), H100, 4096, 16)
    newer = dataclasses.replace(H100, driver_version=13010)
    dispatcher = Dispatcher(db_url)
    validations = []

    def compile_(family, problem, config, served_by, winner, device):
        return TunedKernel(problem, family.kernel_name(problem.dtype, config), config.as_dict(), served_by,
                           {"source_hash": "h", "plain_source_hash": winner.trial.source_hash if winner else ""})

    monkeypatch.setattr(dispatcher, "_compile", compile_)
    monkeypatch.setattr(dispatcher, "_validated", lambda *args: validations.append(args[5:]) or True)
    monkeypatch.setattr(autogen.runtime.dispatch, "device_identity", lambda: H100)
    fresh = dispatcher._build(SGEMV.problem(m=4096, n=16), False)
    assert fresh.served_by == "exact" and fresh.stale == () and validations == []
    monkeypatch.setattr(autogen.runtime.dispatch, "device_identity", lambda: newer)
    stale = dispatcher._build(SGEMV.problem(m=4096, n=16), False)
    assert stale.served_by == "exact" and stale.stale == ("driver 13.0 -> 13.1",)
    assert validations == [(True,)]  # validated here, whatever the database remembers
    pretuned.pretuned_db.cache_clear()


def test_builtin_families_give_an_example_call():
    class FakeRandom:
        def random(self, shape, dtype=None):
            return np.zeros(shape, dtype=dtype)

    cupy = types.SimpleNamespace(random=types.SimpleNamespace(default_rng=lambda seed: FakeRandom()),
                                 float32=np.float32, empty=lambda shape, dtype: np.empty(shape, dtype),
                                 empty_like=np.empty_like)
    for name in ("sgemv", "reduce", "softmax"):
        family = all_families()[name]
        problem = family.problem(None, **{d: 8 for d in family.dims})
        args, kwargs = family.example_call(problem, cupy)
        assert args and kwargs, name  # outputs passed in: safe inside CuPy capture


def test_call_stream_is_seen_by_binds():
    cupy = fake_cupy()
    assert family_module.call_stream_ptr(cupy, object()) == 1234
    with family_module.call_stream(types.SimpleNamespace(ptr=99)):
        assert family_module.call_stream_ptr(cupy, object()) == 99
    assert family_module.call_stream_ptr(cupy, object()) == 1234
