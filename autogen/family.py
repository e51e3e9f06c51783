"""The public face for family authors: everything a kernel family of your own needs, at the
import path user families have always used (`from autogen.family import Family, register, ...`).

The definitions live in autogen.core (family: the contract; registry: finding families;
operands: helpers for a family's Python call); this module only names them.
"""

from autogen.core.family import Family, Launch, MAX_DIM, Peer, Step, Trait
from autogen.core.operands import (call_stream_ptr, device_array, dtype_name, kernel_scalar, new_output,
                                   random_uniform, stream_capturing, stream_workspace)
from autogen.core.registry import all_families, family_for_api, get_family, register
from autogen.core.signature import OpSignature, Output, Scalar, Tensor

__all__ = ["MAX_DIM", "Family", "Launch", "Peer", "Step", "Trait", "all_families", "call_stream_ptr",
           "device_array", "dtype_name", "family_for_api", "get_family", "kernel_scalar", "new_output",
           "OpSignature", "Output", "Scalar", "Tensor",
           "random_uniform", "register", "stream_capturing", "stream_workspace"]
