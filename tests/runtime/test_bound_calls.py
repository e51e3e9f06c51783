"""Repeated dispatched calls served from an earlier binding (autogen.runtime.bound_calls), on the CPU.

Stand-in CuPy arrays (weak-referenceable, reshapeable in place like CuPy's) and a stand-in
driver launch that records what it is given. A call is remembered on its second sighting and
served bound from the third. Each test checks a guard: the bound call is reused only for the
same live arrays with the same shapes, the same other arguments (the same objects), the same
device and stream; anything else binds again, so every check of the bind still runs where
something changed. Every test of a served call runs twice: served from Python, and from the C
hit path (autogen/_hitpath.c), whose cuLaunchKernel is then a ctypes callback into the same
stand-in driver."""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

import autogen.core.operands as family_module
from autogen.runtime import dispatch
from autogen.runtime.bound_calls import MISSED, BoundCall, Sighting, bind_once, sighting
from autogen.runtime.dispatch import Dispatcher, TunedKernel, make_call
from autogen.errors import ArgumentError
from autogen.core.registry import get_family

_next_pointer = [1 << 20]


class Memory:
    def __init__(self, nbytes):
        self.ptr, self.device_id, self.mem = _next_pointer[0], 0, self
        _next_pointer[0] += max(256, nbytes)


class Array:
    """What binds read of a CuPy array; `shape` can be set, as CuPy allows."""

    def __init__(self, shape, dtype, data=None):
        self.dtype, self._c_contiguous = np.dtype(dtype), True
        self.shape = tuple(shape)
        self.data = data or Memory(self.size * self.dtype.itemsize)

    @property
    def shape(self):
        return self._shape

    @shape.setter
    def shape(self, shape):
        self._shape = tuple(shape)
        self.ndim, self.size = len(self._shape), int(np.prod(self._shape))

    def reshape(self, *shape):
        return Array((self.size,) if shape in ((-1,), ((-1,),)) else shape, self.dtype, self.data)

    def view(self, dtype):
        return Array(self.shape, dtype, self.data)


class Function:
    """A loaded kernel: launched by CuPy's call on a binding, by its pointer afterwards."""

    def __init__(self, pointer, calls):
        self.ptr, self.calls = pointer, calls

    def __call__(self, grid, block, args, shared_bytes=0, stream=None):
        self.calls.append(("cupy", self.ptr))


class Driver:
    def __init__(self):
        self.launches: list[tuple] = []
        self.fail_first_with: int | None = None
        self.from_c = 0  # launches the C hit path made

    def c_launch_kernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, parameters, extra):
        """cuLaunchKernel as the C hit path calls it: a failure is a status (left for the Python
        path's launch to raise, as a real driver would fail it again)."""
        if self.fail_first_with is not None:
            return self.fail_first_with
        self.from_c += 1
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream or 0, parameters))
        return 0

    def launchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, parameters, extra):
        if self.fail_first_with is not None:
            status, self.fail_first_with = self.fail_first_with, None
            raise _DriverError(status)
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, parameters))


class _DriverError(Exception):
    def __init__(self, status):
        super().__init__(f"CUDA driver error {status}")
        self.status = status


def stand_in_cupy(driver):
    streams = {"current": types.SimpleNamespace(ptr=0, synchronize=lambda: None)}
    device = {"current": 0}
    cupy = types.SimpleNamespace(
        ndarray=Array, uint8=np.uint8, bool_=np.bool_, float32=np.float32,
        empty=lambda shape, dtype=None: Array(shape if isinstance(shape, tuple) else (shape,), dtype),
        zeros=lambda count, dtype=None: Array((count,), dtype),
        cuda=types.SimpleNamespace(get_current_stream=lambda: streams["current"], driver=driver,
                                   runtime=types.SimpleNamespace(getDevice=lambda: device["current"],
                                                                 streamIsCapturing=lambda _p: 0)))
    return cupy, streams, device


C_LAUNCH_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_void_p)


@pytest.fixture(params=["python", "c"])
def served(request, monkeypatch):
    """A dispatched call of a family, its kernel a stand-in: (call, driver, cupy calls, binds, streams),
    its remembered calls served from Python or from the C hit path."""
    driver = Driver()
    cupy, streams, device = stand_in_cupy(driver)
    if request.param == "python":
        monkeypatch.setattr(dispatch, "HitPath", None)
    else:
        if dispatch.HitPath is None:
            pytest.fail("autogen.runtime._hitpath is not built: pip install -e . builds it")
        callback = C_LAUNCH_KERNEL(driver.c_launch_kernel)
        address = ctypes.cast(callback, ctypes.c_void_p).value
        monkeypatch.setattr(dispatch, "cuda_launch_kernel_address", lambda: address)
    monkeypatch.setattr(dispatch, "_CUPY", cupy)
    monkeypatch.setattr(dispatch, "_calls", {})
    monkeypatch.setattr(dispatch, "_default_dispatcher", Dispatcher("sqlite://"))
    monkeypatch.setattr(family_module, "_WORKSPACES", {})
    monkeypatch.setattr(family_module, "_FITTING", {})
    cupy_calls: list = []
    binds: list = []

    def serve(name, args, kwargs):
        family = get_family(name)
        problem, _, _ = family.bind(cupy, 0, args, kwargs)
        steps = [(Function(0x1000 + i, cupy_calls), step)
                 for i, step in enumerate(family.plan(problem, family.default_config(problem)))]
        dispatch._default_dispatcher._kernels[(0, problem, False)] = TunedKernel(
            problem, "stand-in", {}, "test", {}, steps)
        real_bind = family.bind

        def counting_bind(*a):
            binds.append(1)
            return real_bind(*a)

        monkeypatch.setattr(family, "bind", counting_bind)
        monkeypatch.setattr(dispatch, "_calls", {})
        return make_call(name)

    return types.SimpleNamespace(serve=serve, driver=driver, cupy_calls=cupy_calls, binds=binds,
                                 streams=streams, device=device, path=request.param,
                                 keep=locals().get("callback"))


def sgemv_operands(m=1024, n=16):
    return Array((m, n), "float32"), Array((n,), "float32"), Array((m,), "float32")


def repeat(call, *args, **kwargs):
    """The first two calls: bound, then remembered; the next is served bound."""
    call(*args, **kwargs)
    return call(*args, **kwargs)


def test_a_repeated_call_launches_its_packed_kernel_without_binding_again(served):
    A, x, y = sgemv_operands()
    alpha = 2.0
    call = served.serve("sgemv", (A, x), {"y": y, "alpha": alpha})
    assert repeat(call, A, x, y=y, alpha=alpha) is y
    assert len(served.binds) == 2 and len(served.cupy_calls) == 2 and not served.driver.launches
    for _ in range(3):
        assert call(A, x, y=y, alpha=alpha) is y
    assert len(served.binds) == 2 and len(served.cupy_calls) == 2
    assert len(served.driver.launches) == 3
    assert served.driver.from_c == (3 if served.path == "c" else 0)
    function, grid, block, shared, stream, parameters = served.driver.launches[-1]
    assert function == 0x1000 and stream == 0
    # The packed block holds what the kernel takes: A, x, y, m, n, alpha, beta.
    slots = (ctypes.c_void_p * 7).from_address(parameters)
    pointers = [ctypes.c_void_p.from_address(slots[i]).value for i in range(3)]
    assert pointers == [A.data.ptr, x.data.ptr, y.data.ptr]
    assert [ctypes.c_int32.from_address(slots[i]).value for i in (3, 4)] == [1024, 16]
    assert [ctypes.c_float.from_address(slots[i]).value for i in (5, 6)] == [2.0, 0.0]


def test_an_array_reshaped_in_place_is_checked_again(served):
    A, x, y = sgemv_operands()
    call = served.serve("sgemv", (A, x), {"y": y})
    repeat(call, A, x, y=y)
    call(A, x, y=y)
    assert len(served.binds) == 2
    A.shape = (2048, 8)  # CuPy allows this on a contiguous array: the bind must see it
    with pytest.raises(ArgumentError, match="x has length 16, but A has 8 columns"):
        call(A, x, y=y)
    assert len(served.binds) == 3


def test_other_arrays_another_stream_or_device_bind_again(served):
    A, x, y = sgemv_operands()
    call = served.serve("sgemv", (A, x), {"y": y})
    repeat(call, A, x, y=y)
    other_y = Array((1024,), "float32")
    assert call(A, x, y=other_y) is other_y
    assert len(served.binds) == 3
    served.streams["current"] = types.SimpleNamespace(ptr=77, synchronize=lambda: None)
    repeat(call, A, x, y=y)
    assert len(served.binds) == 5
    call(A, x, y=y)
    assert len(served.binds) == 5 and served.driver.launches[-1][4] == 77
    served.device["current"] = 1  # the arrays are on GPU 0: the bind refuses them
    with pytest.raises(ArgumentError, match="GPU 0"):
        call(A, x, y=y)


def test_scalars_of_another_type_bind_again(served):
    x, bias, mask, addend, out = (Array((256,), "float32"), Array((256,), "float32"), Array((256,), "uint8"),
                                  Array((256,), "float32"), Array((256,), "float32"))
    scale = 1.0
    call = served.serve("bias_mask_scale_add", (x, bias, mask, scale, addend), {"out": out})
    repeat(call, x, bias, mask, scale, addend, out=out)
    call(x, bias, mask, scale, addend, out=out)
    assert len(served.binds) == 2
    with pytest.raises(ArgumentError, match="scale must be a number"):
        call(x, bias, mask, True, addend, out=out)  # True == 1.0, but the bind refuses a bool
    repeat(call, x, bias, mask, 1, addend, out=out)  # an int: another object, bound again
    assert len(served.binds) == 5
    repeat(call, x, bias, mask, float(2 * scale), addend, out=out)  # an equal value made anew
    assert len(served.binds) == 7


def test_a_call_that_allocates_its_output_binds_every_time(served):
    A, x, _ = sgemv_operands()
    call = served.serve("sgemv", (A, x), {})
    results = [call(A, x) for _ in range(3)]
    assert len({id(r) for r in results}) == 3 and len(served.binds) == 3 and not served.driver.launches


def test_arrays_new_at_every_call_are_never_packed(served, monkeypatch):
    import autogen.runtime.bound_calls as module
    packed = []
    real = module.bind_once
    monkeypatch.setattr(module, "bind_once", lambda *a: packed.append(1) or real(*a))
    A, x, _ = sgemv_operands()
    call = served.serve("sgemv", (A, x), {})
    for _ in range(4):
        call(A, x, y=Array((1024,), "float32"))  # each y dies before the next call
    assert len(served.binds) == 4 and not packed


def test_a_tuple_result_of_the_callers_arrays_is_returned_from_the_bound_call(served):
    x, values, count = Array((256,), "int32"), Array((256,), "int32"), Array((1,), "int32")
    kwargs = {"ordered": True, "selectivity": "p01", "values": values, "count": count}
    call = served.serve("copy_if", (x, 0), kwargs)
    repeat(call, x, 0, **kwargs)
    result = call(x, 0, **kwargs)
    assert result[0] is values and result[1] is count and len(served.binds) == 2
    assert len(served.driver.launches) == 2  # its init and main kernels, both packed


def test_a_thread_without_a_current_context_gets_one_then_launches(served, monkeypatch):
    made_current = []
    monkeypatch.setattr(dispatch, "_make_context_current", lambda: made_current.append(1))
    A, x, y = sgemv_operands()
    call = served.serve("sgemv", (A, x), {"y": y})
    repeat(call, A, x, y=y)
    served.driver.fail_first_with = 201  # CUDA_ERROR_INVALID_CONTEXT
    call(A, x, y=y)
    assert made_current == [1] and len(served.driver.launches) == 1
    served.driver.fail_first_with = 700  # anything else is the caller's error, raised as is
    with pytest.raises(_DriverError):
        call(A, x, y=y)


def one_launch(*values):
    return types.SimpleNamespace(_launches=((Function(0x2000, []), (1,), (32,), lambda inputs: values, 0),))


def bound_of(flat, result, kernel):
    return bind_once(Sighting(flat, Array), flat, result, kernel, {}, Array, Driver().launchKernel, lambda: None)


def test_a_dead_array_fails_its_guard():
    A = Array((4,), "float32")
    bound = bound_of((A,), A, one_launch(np.int32(4)))  # the launch's arguments must not hold A
    assert isinstance(bound, BoundCall) and bound.holds() and bound.result() is A
    del A  # an array made later may take its id: the weak reference tells them apart
    assert not bound.holds() and bound.serve(0) is MISSED


def test_arguments_a_remembered_call_must_not_keep_are_not_remembered():
    A = Array((4,), "float32")
    assert sighting((A, object()), Array) is None  # a tensor, say
    assert sighting((A, np.float32(2)), Array) is not None
    assert bound_of((A,), Array((4,), "float32"), one_launch(A)) is None  # a new output


def test_autogens_own_arrays_are_kept_alive_and_the_callers_are_not():
    A, workspace = Array((4,), "float32"), Array((8,), "uint32")
    view = A.reshape(-1)  # a view of the caller's memory, made by the bind
    bound = bound_of((A,), A, one_launch(view, workspace))
    assert any(item is workspace for item in bound.keep)
    assert not any(item is A or item is view for item in bound.keep)


def test_calls_alternating_on_the_same_first_argument_are_each_remembered(served):
    A, x, y = sgemv_operands()
    other_y = Array((1024,), "float32")
    call = served.serve("sgemv", (A, x), {"y": y})
    for _ in range(2):
        call(A, x, y=y)
        call(A, x, y=other_y)
    assert len(served.binds) == 4
    for _ in range(3):
        assert call(A, x, y=y) is y and call(A, x, y=other_y) is other_y
    assert len(served.binds) == 4 and len(served.driver.launches) == 6
    written = [ctypes.c_void_p.from_address((ctypes.c_void_p * 3).from_address(launch[5])[2]).value
               for launch in served.driver.launches[-2:]]
    assert written == [y.data.ptr, other_y.data.ptr]  # each launch writes its own y


def test_another_dispatcher_binds_its_own_kernels(served):
    A, x, y = sgemv_operands()
    call = served.serve("sgemv", (A, x), {"y": y})
    repeat(call, A, x, y=y)
    call(A, x, y=y)
    assert len(served.binds) == 2 and len(served.driver.launches) == 1
    old = dispatch._default_dispatcher
    dispatch._default_dispatcher = Dispatcher("sqlite://")  # restored by the fixture's monkeypatch
    dispatch._default_dispatcher._kernels = old._kernels
    call(A, x, y=y)
    assert len(served.binds) == 3 and len(served.driver.launches) == 1


def test_without_the_driver_library_the_c_hit_path_leaves_every_call_to_python(served, monkeypatch):
    monkeypatch.setattr(dispatch, "cuda_launch_kernel_address", lambda: None)
    A, x, y = sgemv_operands()
    call = served.serve("sgemv", (A, x), {"y": y})
    for _ in range(4):
        assert call(A, x, y=y) is y
    assert len(served.binds) == 2 and len(served.driver.launches) == 2 and served.driver.from_c == 0
    assert getattr(call, "configured", False) is False


def test_the_packed_launch_layout_is_the_c_hit_paths():
    hit_path = pytest.importorskip("autogen.runtime._hitpath")  # not built: test_*[c] above fail instead
    from autogen.runtime.bound_calls import PACKED_LAUNCH
    assert PACKED_LAUNCH.size == hit_path.PACKED_LAUNCH_BYTES == 48
