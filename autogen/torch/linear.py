"""Serve a model's nn.Linear layers with autogen's GEMV kernels: autogen.torch.patch(model).

A patched layer computes y = x W^T (+ b) with torch.ops.autogen.hgemv (fp16 and bf16 weights) or
torch.ops.autogen.sgemv (fp32 weights, one token) when the call's token count (the product of x's
leading dimensions) is one of the served batches (1-8 by default: hgemv's batch tiles, what
`autogen tune-model` tunes), x has the weight's dtype and device (CUDA), and no gradient is
wanted; every other call goes to F.linear. The choice is made from shapes, dtypes and devices,
which torch.compile guards on, so a compiled model holds the autogen op or F.linear, never a
graph break. The weight W (out x in, row-major) is hgemv's A as it is: nothing is copied. The
tokens enter as the n x batch matrix hgemv reads (x transposed: a copy for more than one token,
which Inductor folds into the kernel that produces x) and the result comes back transposed to
x's layout; the bias is added by torch (Inductor fuses the add into its neighbours).

unpatch(model) restores every layer patch changed: its class, nothing else was touched.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autogen.torch import ops  # noqa: F401  (registers torch.ops.autogen.*)

SERVED_BATCHES = frozenset(range(1, 9))  # hgemv's batch tiles: 1..8 vectors from one read of the weights
_HALF = (torch.float16, torch.bfloat16)


class AutogenLinear(nn.Linear):
    """nn.Linear whose forward goes through autogen where autogen serves the call. Only ever
    made by patch(), from an nn.Linear (its class swapped in place: same parameters, hooks and
    state_dict), and turned back by unpatch()."""

    _autogen_batches: frozenset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _served(x, self.weight, self._autogen_batches):
            return _autogen_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def _served(x: torch.Tensor, weight: torch.Tensor, batches: frozenset) -> bool:
    if x.dim() < 1 or x.shape[-1] != weight.shape[1] or x.dtype != weight.dtype:
        return False
    if not (x.is_cuda and weight.is_cuda and x.device == weight.device and weight.is_contiguous()):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False  # the ops have no autograd formula: training goes to F.linear
    tokens = math.prod(x.shape[:-1])
    if weight.dtype in _HALF:
        return tokens in batches
    return weight.dtype == torch.float32 and tokens == 1  # sgemv: one vector


def _autogen_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    tokens = math.prod(x.shape[:-1])
    out_features = weight.shape[0]
    if tokens == 1:
        vector = x.reshape(weight.shape[1])
        product = (torch.ops.autogen.hgemv if weight.dtype in _HALF else torch.ops.autogen.sgemv)(weight, vector)
        y = product.reshape(*x.shape[:-1], out_features)
    else:
        columns = x.reshape(tokens, weight.shape[1]).t().contiguous()  # n x batch, as hgemv reads x
        y = torch.ops.autogen.hgemv(weight, columns).t().contiguous().reshape(*x.shape[:-1], out_features)
    return y if bias is None else y + bias


def patch(model: nn.Module, batches=SERVED_BATCHES) -> nn.Module:
    """Serve every nn.Linear of `model` (itself included) through autogen where it can (see the
    module's docstring); `batches`: the token counts served (default 1-8). Returns the model."""
    served = frozenset(int(b) for b in batches)
    if not served or min(served) < 1:
        raise ValueError(f"batches must be token counts >= 1, got {sorted(served)}")
    for module in model.modules():
        if type(module) is nn.Linear or type(module) is AutogenLinear:
            module.__class__ = AutogenLinear
            module._autogen_batches = served
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Turn every layer patch() changed back into an nn.Linear. Returns the model."""
    for module in model.modules():
        if type(module) is AutogenLinear:
            module.__class__ = nn.Linear
            del module._autogen_batches
    return model


def patched_modules(model: nn.Module) -> list[str]:
    """The qualified names of the layers patch() serves."""
    return [name for name, module in model.named_modules() if type(module) is AutogenLinear]
