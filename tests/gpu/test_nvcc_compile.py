"""Templates must compile: a sample holding every choice of every parameter, with nvcc, for the
architectures we target, with no warnings, no spills and no local-memory stack frames."""

import pytest

from autogen.core.registry import all_families

FAMILIES = all_families()
from autogen.core.render import render
from autogen.gpu.resources import parse_ptxas_report
from nvcc_tools import ARCHS, extreme_configs, nvcc_compile


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family_name", sorted(FAMILIES))
def test_extreme_variants_compile_cleanly(family_name, arch, tmp_path):
    family = FAMILIES[family_name]
    variants = [(dtype, config) for dtype in family.dtypes for config in extreme_configs(family)]
    report = nvcc_compile([render(family, dtype, config) for dtype, config in variants], arch, tmp_path)
    kernels = parse_ptxas_report(report)  # what `autogen show --resources` reads too
    entries = {k.kernel for k in kernels}
    # Every kernel of every step (a two-kernel reduction has two) was compiled.
    probe = family.problem(**{d: 4099 for d in family.dims})
    expected = {family.kernel_name(dtype, config) + step.suffix for dtype, config in variants
                for step in family.plan(family.problem(dtype, **probe.shape), config)}
    assert entries == expected
    assert kernels and all(k.spill_store_bytes == 0 for k in kernels), "a variant spills registers"
    assert all(k.stack_frame_bytes == 0 for k in kernels), "a variant uses a local-memory stack frame"
