"""Each family's op signature (autogen.core.signature), without torch: every family with a Python
call states one, the schemas derived from it, and a bad one refused when its family registers."""

from __future__ import annotations

import pytest

from autogen import Family
from autogen.errors import FamilyError
from autogen.core.registry import all_families
from autogen.core.signature import OpSignature, Output, Scalar, Tensor, functional_schema, op_name, out_schema
from family_checks import built_in_families

# The built-in families (a family made from source text by tune_kernel has a Python call but no
# torch op: docs/tune_kernel.md), the same set whichever test modules registered others first.
WITH_CALLS = [f for f in built_in_families().values() if type(f).bind is not Family.bind]


def test_every_family_with_a_python_call_states_its_op():
    assert WITH_CALLS and all(f.op_signature is not None for f in WITH_CALLS)
    assert functional_schema(all_families()["hgemv"].op_signature) == \
        "(Tensor A, Tensor x, float alpha=1.0, float beta=0.0, Tensor? y=None) -> Tensor"
    assert out_schema(all_families()["hgemv"].op_signature) == \
        "(Tensor A, Tensor x, float alpha=1.0, float beta=0.0, *, Tensor(a!) y) -> ()"
    copy_if = all_families()["copy_if"].op_signature
    assert functional_schema(copy_if).endswith("str? selectivity=None) -> (Tensor, Tensor)")
    assert out_schema(copy_if).endswith("*, Tensor(a!) values, Tensor(b!) count) -> ()")
    assert op_name(all_families()["reduce"]) == "reduce_sum"


@pytest.mark.parametrize("signature, message", [
    (OpSignature((Scalar("a", "float"),), (Output("y", lambda: (1,), "float32"),)), "first operand must be a Tensor"),
    (OpSignature((Tensor("x"),), ()), "names no output"),
    (OpSignature((Tensor("x"),), (Output("x", lambda x: x.shape, "x"),)), "distinct identifiers"),
    (OpSignature((Tensor("x"), Scalar("k", "complex")), (Output("y", lambda x: x.shape, "x"),)), "has kind 'complex'"),
    (OpSignature((Tensor("x"),), (Output("y", lambda z: z.shape, "x"),)), "uses z"),
    (OpSignature((Tensor("x"),), (Output("y", lambda x: x.shape, "w"),)), "has dtype 'w'"),
    (OpSignature((Tensor("x"),), (Output("y", lambda x: x.shape, "x", read_when="beta"),)), "read when 'beta'"),
    ("(Tensor x) -> Tensor", "must be an autogen.core.signature.OpSignature"),
])
def test_a_bad_signature_is_refused_at_registration(signature, message):
    import autogen

    class Bad(all_families()["softmax"].__class__):
        name = "bad_signature_probe"
        api = None
        op_signature = signature

    with pytest.raises(FamilyError, match=message):
        autogen.register(Bad)
    assert "bad_signature_probe" not in all_families()


