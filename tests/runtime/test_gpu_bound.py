"""On the GPU: a repeated dispatched call served from an earlier binding (autogen.runtime.bound_calls) launches
the same kernels on the same memory as a freshly bound call, for every family with
Family.example_call: new data written into the inputs in place is read, poisoned outputs are
written, and the result matches a call bound anew (fresh output arrays). Where autogen/_hitpath.c
is built the repeated call is served in C."""

from __future__ import annotations

import numpy as np
import pytest

import autogen.runtime.dispatch as dispatch
from autogen.runtime.dispatch import make_call
from test_gpu_capture import FAMILIES, as_tuple, cupy, defined, example, fresh_dispatcher, outputs  # noqa: F401

pytestmark = pytest.mark.gpu


# A family without reuse_bound_calls binds every call (concat: a list operand cannot be keyed on
# its arrays' ids, as the list can change between calls); its repeated calls are plain binds.
REUSING = [f for f in FAMILIES if f.reuse_bound_calls]


@pytest.mark.parametrize("family", REUSING, ids=[f.name for f in REUSING])
def test_a_repeated_call_reads_new_data_and_matches_a_fresh_binding(family, cupy, fresh_dispatcher, monkeypatch):
    binds = []
    real_bind = family.bind
    monkeypatch.setattr(family, "bind", lambda *a: binds.append(1) or real_bind(*a))
    monkeypatch.setattr(dispatch, "_calls", {})
    call = make_call(family.name)
    _problem, args, kwargs = example(family, cupy)
    call(*args, **kwargs)
    call(*args, **kwargs)  # seen twice: remembered
    assert binds == [1, 1]
    # New data in place: each input array rolled along its first axis (valid values of any dtype).
    for value in args:
        if isinstance(value, cupy.ndarray) and value.size > 1:
            value[...] = cupy.roll(value, 1, axis=0)
    for value in outputs(kwargs, cupy).values():
        value.fill(np.nan if value.dtype.kind == "f" else 0)
    bound = as_tuple(call(*args, **kwargs))
    assert binds == [1, 1], "the repeated call was bound again"
    if dispatch.HitPath is not None:  # built (pip install): that call was served by the C hit path
        assert call.configured, "the C hit path found no cuLaunchKernel"
    assert all(any(r is v for v in outputs(kwargs, cupy).values()) for r in bound)
    fresh_kwargs = {k: cupy.empty_like(v) if isinstance(v, cupy.ndarray) else v for k, v in kwargs.items()}
    fresh = as_tuple(call(*args, **fresh_kwargs))
    assert binds == [1, 1, 1]
    cupy.cuda.get_current_stream().synchronize()
    names = [k for k in kwargs if isinstance(kwargs[k], cupy.ndarray)]
    got = defined(dict(zip(names, bound))) if len(bound) == len(names) else dict(zip(names, bound))
    want = defined(dict(zip(names, fresh))) if len(fresh) == len(names) else dict(zip(names, fresh))
    for name in got:
        cupy.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
