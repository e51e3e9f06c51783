"""Every variant of some families' spaces compiled for this GPU in one pool (the GPU tests that
validate whole spaces)."""

from __future__ import annotations

from autogen.core.registry import get_family
from autogen.core.render import render


def compile_spaces(family_names: tuple[str, ...], dtypes: list[str]) -> dict:
    """{(family, dtype): {kernel name: (config, cubin or CompileError)}} for every variant of each
    family's space in each dtype, compiled in one pool for the current device."""
    from autogen.gpu.compile import compile_many
    from autogen.gpu.device import device_identity

    configs, sources = {}, {}
    for family_name in family_names:
        family = get_family(family_name)
        for dtype in dtypes:
            for config in family.space.enumerate():
                name = family.kernel_name(dtype, config)
                configs.setdefault((family_name, dtype), {})[name] = config
                sources[name] = render(family, dtype, config)
    built = compile_many(sources, device_identity().arch)
    return {key: {name: (config, built[name]) for name, config in named.items()} for key, named in configs.items()}
