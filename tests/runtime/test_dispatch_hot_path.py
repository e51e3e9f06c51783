"""A dispatched call on a cache hit imports nothing and converts its scalars once.

Found twice: a function-level import on the hot path (flat_operand, stream_workspace) cost a
measurable share of every call, and NumPy scalars built per launch are converted again by CuPy
(docs/history/sessions.md, 2026-11-22). Here
every family's Python call runs its real bind, lookup and plan against stand-in CuPy arrays (no
GPU), with a launch that records its arguments."""

from __future__ import annotations

import builtins
import types

import numpy as np
import pytest

import autogen.core.operands as family_module
from autogen.runtime import dispatch
from autogen.runtime.dispatch import Dispatcher, TunedKernel, make_call
from autogen.core.registry import get_family

pytestmark = pytest.mark.usefixtures("fresh_scalar_cache")  # they count conversions


class _Memory:
    device_id = 0
    ptr = 4096


class StandIn:
    """What the binds read of a CuPy array: C-contiguous, on device 0."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim, self.size = len(self.shape), int(np.prod(self.shape))
        self._c_contiguous, self.data = True, _Memory()

    def reshape(self, *shape):
        return self

    def view(self, dtype):
        return StandIn(self.shape, dtype)


def stand_in_cupy():
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    return types.SimpleNamespace(
        ndarray=StandIn, uint8=np.uint8, bool_=np.bool_, float32=np.float32,
        zeros=lambda count, dtype=None: StandIn((count,), dtype),
        empty=lambda shape, dtype=None: StandIn(shape if isinstance(shape, tuple) else (shape,), dtype),
        cuda=types.SimpleNamespace(get_current_stream=lambda: stream,
                                   runtime=types.SimpleNamespace(getDevice=lambda: 0, streamIsCapturing=lambda _p: 0)))


def vector(n, dtype="float32"):
    return StandIn((n,), dtype)


CALLS = {
    "sgemv": lambda: ((StandIn((1024, 16), "float32"), vector(16)), {"y": vector(1024), "alpha": 2.0}),
    "sgemm": lambda: ((StandIn((64, 64), "float32"), StandIn((64, 64), "float32")),
                      {"C": StandIn((64, 64), "float32"), "beta": 0.5}),
    "hgemv": lambda: ((StandIn((1024, 16), "float16"), vector(16, "float16")), {"y": vector(1024, "float16")}),
    "gelu": lambda: ((vector(256),), {"approximate": "tanh", "out": vector(256)}),
    "bias_mask_scale_add": lambda: ((vector(256), vector(256), vector(256, "uint8"), 1.25, vector(256)),
                                    {"out": vector(256)}),
    "reduce": lambda: ((vector(4096),), {"out": vector(1)}),
    "softmax": lambda: ((StandIn((32, 128), "float32"),), {"out": StandIn((32, 128), "float32")}),
    "histogram": lambda: ((vector(4096, "int32"), 256), {"out": vector(256, "int32"), "distribution": "uniform"}),
    "copy_if": lambda: ((vector(256, "int32"), 0), {"ordered": True, "selectivity": "p01",
                                                    "values": vector(256, "int32"), "count": vector(1, "int32")}),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_dispatched_hit_imports_nothing_and_converts_its_scalars_once(name, monkeypatch):
    cupy = stand_in_cupy()
    monkeypatch.setattr(dispatch, "_CUPY", cupy)
    monkeypatch.setattr(dispatch, "_calls", {})
    monkeypatch.setattr(dispatch, "_default_dispatcher", Dispatcher("sqlite://"))
    monkeypatch.setattr(family_module, "_WORKSPACES", {})
    monkeypatch.setattr(family_module, "_FITTING", {})
    family = get_family(name)
    args, kwargs = CALLS[name]()
    problem, _, _ = family.bind(cupy, 0, args, kwargs)
    launched: list[tuple] = []

    def launch(grid, block, arguments, shared_bytes=0, stream=None):
        launched.append(arguments)

    steps = [(launch, step) for step in family.plan(problem, family.default_config(problem))]
    dispatch._default_dispatcher._kernels[(0, problem, False)] = TunedKernel(problem, "stand-in", {}, "test", {},
                                                                             steps)
    call = make_call(name)
    call(*args, **kwargs)  # the first call fills the caches
    first = list(launched)
    imported: list[str] = []
    real_import = builtins.__import__

    def recording_import(module, *rest, **options):
        imported.append(module)
        return real_import(module, *rest, **options)

    launched.clear()
    builtins.__import__ = recording_import  # set and reset directly: monkeypatch itself imports
    try:
        call(*args, **kwargs)
    finally:
        builtins.__import__ = real_import
    assert imported == []
    assert len(launched) == len(first) == len(steps)
    for before, now in zip(first, launched):
        scalars = [i for i, value in enumerate(before) if not isinstance(value, StandIn)]
        assert scalars, "every kernel here takes a size or a coefficient"
        assert all(now[i] is before[i] for i in scalars)  # the same converted objects, not new ones
