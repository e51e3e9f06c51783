"""Templates must compile: a sample holding every choice of every parameter, with nvcc, for the
architectures we target, with no warnings, no spills and no local-memory stack frames."""

import pytest

from autogen.core.render import render
from autogen.gpu.resources import parse_ptxas_report
from family_checks import built_in_families
from nvcc_tools import ARCHS, extreme_configs, nvcc_compile

FAMILIES = built_in_families()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family_name", sorted(FAMILIES))
def test_extreme_variants_compile_cleanly(family_name, arch, tmp_path):
    family = FAMILIES[family_name]
    variants = [(dtype, config) for dtype in family.dtypes for config in extreme_configs(family)]
    # Each dtype's probe problem, whose traits (the default ones) name and shape the code.
    probes = {dtype: family.problem(dtype, **{d: 4099 for d in family.dims}) for dtype in family.dtypes}
    report = nvcc_compile([render(family, dtype, config, traits=probes[dtype].traits) for dtype, config in variants],
                          arch, tmp_path)
    kernels = parse_ptxas_report(report)  # what `autogen show --resources` reads too
    entries = {k.kernel for k in kernels}
    # Every kernel of every step (a two-kernel reduction has two) was compiled.
    expected = {family.kernel_name(dtype, config, probes[dtype].traits) + step.suffix for dtype, config in variants
                for step in family.plan(probes[dtype], config)}
    assert entries == expected
    assert kernels and all(k.spill_store_bytes == 0 for k in kernels), "a variant spills registers"
    assert all(k.stack_frame_bytes == 0 for k in kernels), "a variant uses a local-memory stack frame"
