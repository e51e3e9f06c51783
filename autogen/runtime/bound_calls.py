"""Repeated dispatched calls with the same operands, launched without binding them again.

A dispatched call binds its operands (the family's checks of dtype, rank, shape, layout and
device) and builds its kernels' argument tuples. In Python that costs about as much as the launch
(docs/benchmarks.md, "Dispatcher host cost"), while
decode loops and CUDA-graph warm-ups call the same kernel on the same arrays again and again. So
a call made twice with the same objects is remembered under its key: the current device and
stream, the keyword names and the id of every argument. The key stays unambiguous because the
remembered call holds every argument that is not a CuPy array (plain immutable values: numbers,
strings, None), so no other object can take its id, and a weak reference to every CuPy array,
dead once the array is gone. A later call with the same key checks guards instead of binding:
  - each array is still alive (so it is the same object: ids are unique among live objects);
  - with the same shape (CuPy lets `a.shape = ...` reshape an array in place).
Nothing else a bind checks can change for the same CuPy array: its dtype, strides, memory and
device cannot be set (CuPy 14 raises AttributeError for each). The kernels are then launched
through CuPy's binding of cuLaunchKernel with argument blocks packed once, instead of through
CuPy's RawKernel call, which converts every argument again. Where the C hit path is built
(autogen/_hitpath.c, see autogen.runtime.dispatch.make_call) it serves these calls instead: the same key,
the same guards, the launches read from BoundCall.packed; a call it cannot serve comes here.

Only calls that return their own arrays (or None) are remembered: a call that allocates its
output (out=None) binds every time, and so does a call whose arrays are new each time (a call
is remembered on its second sighting). A family opts in with Family.reuse_bound_calls; its bind
must only check and arrange its operands, with no other effect (no GPU work, no scratch memory
made per call).
"""

from __future__ import annotations

import ctypes
import struct
import weakref

import numpy as np

from autogen.gpu.launch import dims3, LaunchError, libcuda, parameter_block

MAX_REMEMBERED = 256  # bound calls (and first sightings) kept per family and dispatcher
# The arguments besides CuPy arrays that a remembered call may hold: immutable and small.
PLAIN_TYPES = (int, float, bool, str, type(None), np.generic)
CUDA_ERROR_INVALID_CONTEXT = 201
MISSED = object()  # BoundCall.serve: a guard failed
# One launch as the C hit path reads it (PackedLaunch in autogen/_hitpath.c): the CUfunction,
# grid, block, shared bytes, 4 unused bytes, and the address of the kernel parameters' void *[].
PACKED_LAUNCH = struct.Struct("=Q3I3IIIQ")


class Sighting:
    """A call seen once, held until it is seen again: weak references to its CuPy arrays, and
    its other arguments themselves (so that their ids stay theirs)."""

    __slots__ = ("arrays", "held")

    def __init__(self, flat: tuple, ndarray):
        self.arrays = tuple((weakref.ref(value), value.shape) for value in flat if type(value) is ndarray)
        self.held = tuple(value for value in flat if type(value) is not ndarray)

    def holds(self) -> bool:
        """The guards: every array still alive, with the shape it had."""
        for ref, shape in self.arrays:
            array = ref()
            if array is None or array.shape != shape:
                return False
        return True


class BoundCall(Sighting):
    """A call bound once: its guards, its packed launches and how to give its result again."""

    __slots__ = ("first", "rest", "packed", "result", "keep", "launch_kernel", "make_context_current")

    def serve(self, stream_ptr: int):
        """The call again on `stream_ptr` where the guards hold: its kernels launched, its
        result returned; MISSED where they do not (the caller binds the call anew). One method
        for the whole hit: each Python call on this path is a measurable share of it (the
        breakdown: docs/history/sessions.md, eighth session)."""
        for ref, shape in self.arrays:  # holds(), inline: this is the hot path
            array = ref()
            if array is None or array.shape != shape:
                return MISSED
        launch_kernel = self.launch_kernel
        function, gx, gy, gz, bx, by, bz, shared_bytes, parameters = self.first
        try:
            launch_kernel(function, gx, gy, gz, bx, by, bz, shared_bytes, stream_ptr, parameters, 0)
        except Exception as exc:
            # A thread on which no CUDA context was ever made current: the device's is made
            # current, then the kernel launched.
            if getattr(exc, "status", None) != CUDA_ERROR_INVALID_CONTEXT:
                raise
            self.make_context_current()
            launch_kernel(function, gx, gy, gz, bx, by, bz, shared_bytes, stream_ptr, parameters, 0)
        for function, gx, gy, gz, bx, by, bz, shared_bytes, parameters in self.rest:
            launch_kernel(function, gx, gy, gz, bx, by, bz, shared_bytes, stream_ptr, parameters, 0)
        return self.result()


def sighting(flat: tuple, ndarray) -> Sighting | None:
    """A call (its arguments `flat`: positional, then keyword values) as seen, where it can be
    remembered: every argument a CuPy array or a plain value (a tensor, say, must not be kept
    alive by a remembered call)."""
    if not all(type(value) is ndarray or isinstance(value, PLAIN_TYPES) for value in flat):
        return None
    return Sighting(flat, ndarray)


def bind_once(seen: Sighting, flat: tuple, result, kernel, inputs: dict, ndarray, launch_kernel,
              make_context_current) -> BoundCall | None:
    """A BoundCall for a call seen before (`seen`, its arguments `flat`), just bound and
    launched with `kernel`; None where it cannot be remembered."""
    arrays = {id(value): value for value in flat if type(value) is ndarray}
    returned = _result_of(result, arrays)
    if returned is None:
        return None
    callers_memory = {id(array.data.mem) for array in arrays.values()}
    keep: list = [kernel]  # its module holds the functions launched
    launches = []
    for function, grid, block, step_args, shared_bytes in kernel._launches:
        pointer = getattr(function, "ptr", None)
        if type(pointer) is not int:  # a launch with attributes (PDL) or a stand-in: not packed here
            return None
        values = step_args(inputs)
        try:
            c_values, parameters = parameter_block(values)
        except TypeError:  # an argument with no C type here (CuPy's launch converted it)
            return None
        # autogen's own arrays (per-stream workspace) are kept alive with the blocks that point
        # into them; the caller's are not (their weak references guard every reuse).
        keep += [value for value in values if type(value) is ndarray and id(value.data.mem) not in callers_memory]
        keep += [c_values, parameters]
        launches.append((pointer, *dims3(grid), *dims3(block), int(shared_bytes), ctypes.addressof(parameters)))
    bound = BoundCall.__new__(BoundCall)
    bound.arrays, bound.held = seen.arrays, seen.held
    bound.first, bound.rest = launches[0], tuple(launches[1:])
    bound.packed = b"".join(PACKED_LAUNCH.pack(*launch[:8], 0, launch[8]) for launch in launches)
    bound.result, bound.keep = returned, tuple(keep)
    bound.launch_kernel, bound.make_context_current = launch_kernel, make_context_current
    return bound


def _nothing():
    return None


def _result_of(result, arrays: dict):
    """A function giving the call's result again from weak references, where the result is one
    of the call's arrays, a tuple of them, or None; else None (an output the bind allocated
    cannot be given again)."""
    if result is None:
        return _nothing
    if isinstance(result, tuple):
        if not all(id(item) in arrays for item in result):
            return None
        refs = tuple(weakref.ref(item) for item in result)
        return lambda: tuple(ref() for ref in refs)
    return weakref.ref(result) if id(result) in arrays else None


__all__ = ["BoundCall", "MAX_REMEMBERED", "MISSED", "PACKED_LAUNCH", "PLAIN_TYPES", "Sighting", "bind_once", "sighting"]


class Remembered:
    """A family's remembered calls (autogen.runtime.bound_calls) where the C hit path is not built: key ->
    BoundCall, key -> Sighting, and the dispatcher whose kernels they launch. A HitPath has the
    same three attributes."""

    __slots__ = ("calls", "sightings", "dispatcher")

    def __init__(self):
        self.calls: dict = {}
        self.sightings: dict = {}
        self.dispatcher = None


def cuda_launch_kernel_address() -> int | None:
    """The address of the driver's cuLaunchKernel, which the C hit path calls; None where the
    driver library cannot be loaded (the remembered calls are then served from Python)."""
    try:
        return ctypes.cast(libcuda().cuLaunchKernel, ctypes.c_void_p).value
    except (LaunchError, AttributeError):
        return None


def remember_call(key: tuple, flat: tuple, result, kernel, inputs: dict, bound_calls: dict, sightings: dict,
                  ndarray, launch_kernel, make_context_current) -> None:
    """After a call was bound and launched: on its second sighting with the same live operands,
    keep it as a BoundCall (autogen.runtime.bound_calls); on its first, note it."""
    seen = sightings.pop(key, None)
    if seen is not None and seen.holds():
        bound = bind_once(seen, flat, result, kernel, inputs, ndarray, launch_kernel, make_context_current)
        if bound is not None:
            if len(bound_calls) >= MAX_REMEMBERED:
                bound_calls.clear()
            bound_calls[key] = bound
        return
    seen = sighting(flat, ndarray)
    if seen is not None:
        if len(sightings) >= MAX_REMEMBERED:
            sightings.clear()
        sightings[key] = seen
