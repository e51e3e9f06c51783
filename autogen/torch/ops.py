"""torch.library ops for autogen's families: torch.ops.autogen.<op> and torch.ops.autogen.<op>_out.

Importing this module registers an op pair for every family that states its call (op_signature;
autogen.core.signature): the built-ins, installed plug-ins, and every family registered later
in this process (autogen.register tells this module). Each op has a CUDA kernel, which calls
autogen's dispatcher on the tensors (CuPy views through __cuda_array_interface__ or DLPack, on
torch's current stream: inside torch.cuda.graph, on the capturing stream), and a fake kernel
(shape and dtype inference for FakeTensorMode, torch.compile and the meta device). The _out op
declares its outputs mutated (Tensor(a!)), so torch.compile functionalizes it; the functional
op returns new tensors. Neither has an autograd formula: they serve inference.
"""

from __future__ import annotations

import threading

import torch

from autogen.core.dtypes import DTYPES
from autogen.core.registry import all_families, get_family, on_register
from autogen.core.signature import (bind_arguments, check_signature, defaults_of, functional_schema, op_name,
                                    out_schema, Tensor, TensorList)
from autogen.errors import describe_family, FamilyError

NAMESPACE = "autogen"
_library = torch.library.Library(NAMESPACE, "FRAGMENT")
_registered: dict[str, str] = {}  # op name -> the family name it serves
_lock = threading.Lock()


def register_family(family) -> bool:
    """Register the op pair of `family` (a Family or its name); False when the family states no
    op_signature. Registering the same family again does nothing; another family under the same
    op name is refused (FamilyError)."""
    family = get_family(family) if isinstance(family, str) else family
    if getattr(family, "op_signature", None) is None:
        return False
    signature = check_signature(family, describe_family(family))
    name = op_name(family)
    with _lock:
        known = _registered.get(name)
        if known == family.name:
            return True
        if known is not None or name.endswith("_out") and name[:-4] in _registered:
            raise FamilyError(f"{describe_family(family)}: the op {NAMESPACE}::{name} is taken by {known}")
        _define(family.name, name, signature)
        _registered[name] = family.name
    return True


def register_all() -> list[str]:
    """Every registered family's ops (built-ins and plug-ins); their op names."""
    for family in all_families().values():
        register_family(family)
    return sorted(_registered)


def op(family_name: str):
    """torch.ops.autogen.<op> of a family (by its name, e.g. "hgemv" or "mykernels.axpy")."""
    family = get_family(family_name)
    if not register_family(family):
        raise FamilyError(f"{describe_family(family)} states no op_signature: it has no torch op "
                          "(see autogen.core.signature)")
    return getattr(getattr(torch.ops, NAMESPACE), op_name(family))


def registered() -> dict[str, str]:
    """op name -> family name, of the ops registered in this process."""
    return dict(_registered)


def _define(family_name: str, name: str, signature) -> None:
    defaults = defaults_of(signature)
    functional_names, out_names = signature.functional_names(), signature.out_names()
    first = signature.operands[0].name
    tensors = {p.name for p in signature.operands if isinstance(p, Tensor)}
    lists = {p.name for p in signature.operands if isinstance(p, TensorList)}
    call = _dispatched_call(family_name)

    def functional(*args, **kwargs):
        values = bind_arguments(functional_names, defaults, args, kwargs)
        for key in tensors:  # the families take C-contiguous operands; no autograd (weights are parameters)
            values[key] = values[key].detach().contiguous()
        for key in lists:
            values[key] = [t.detach().contiguous() for t in values[key]]
        for output in signature.read_outputs:  # a fresh copy: the functional op writes no input
            if values[output.name] is not None:
                values[output.name] = values[output.name].clone(memory_format=torch.contiguous_format)
        result = call()(values.pop(first), **values)
        return tuple(result) if isinstance(result, (tuple, list)) else result

    def into(*args, **kwargs):
        values = bind_arguments(out_names, defaults, args, kwargs)
        values = {k: v.detach() if isinstance(v, torch.Tensor) else [t.detach() for t in v] if k in lists else v
                  for k, v in values.items()}
        call()(values.pop(first), **values)

    def fake_functional(*args, **kwargs):
        values = bind_arguments(functional_names, defaults, args, kwargs)
        device = (values[first][0] if first in lists else values[first]).device
        outputs = tuple(_empty_like_output(o, values, device) for o in signature.outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def fake_into(*args, **kwargs):
        return None

    _library.define(name + functional_schema(signature))
    _library.define(f"{name}_out" + out_schema(signature))
    _library.impl(name, functional, "CUDA")
    _library.impl(f"{name}_out", into, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake_functional, lib=_library)
    torch.library.register_fake(f"{NAMESPACE}::{name}_out", fake_into, lib=_library)


def _dispatched_call(family_name: str):
    """The dispatcher's call for the family (autogen.runtime.dispatch.make_call), made on first use:
    defining the op needs no GPU and no CuPy."""
    made = []

    def call():
        if not made:
            from autogen.runtime.dispatch import make_call
            made.append(make_call(family_name))
        return made[0]

    return call


def _empty_like_output(output, values: dict, device):
    name = output.dtype_of(values)
    like = values.get(name)
    like = like[0] if isinstance(like, (list, tuple)) else like  # a Tensor[] input: its first
    dtype = like.dtype if like is not None else getattr(torch, DTYPES[name].torch_name)
    return torch.empty(output.shape_of(values), dtype=dtype, device=device)


register_all()
on_register(register_family)  # and every family registered after this module was imported
