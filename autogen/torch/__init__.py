"""autogen inside PyTorch: an op per family (torch.library), nn.Linear served by autogen, a
model's decode shapes tuned in one command.

    import autogen.torch.ops                  # registers torch.ops.autogen.<op> for every family
    model = autogen.torch.patch(model)        # nn.Linear -> hgemv / sgemv where autogen serves it
    model = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    autogen.torch.unpatch(model)

Importing this package imports no torch (the families state their call in autogen.core.signature); torch is
imported by autogen.torch.ops and autogen.torch.linear, or on the first use of patch, unpatch or op
here. The model configurations and the problems they need (autogen.torch.models) need no torch.
"""

from __future__ import annotations

import importlib

_LAZY = {"patch": "linear", "unpatch": "linear", "patched_modules": "linear", "op": "ops", "register_family": "ops"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autogen.torch' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
