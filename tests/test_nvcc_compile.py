"""Templates must compile: a sample holding every choice of every parameter, with nvcc, for the
architectures we target, with no warnings, no spills and no local-memory stack frames."""

import re

import pytest

from autogen.families import FAMILIES
from autogen.render import render
from nvcc_tools import ARCHS, extreme_configs, nvcc_compile


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family_name", sorted(FAMILIES))
def test_extreme_variants_compile_cleanly(family_name, arch, tmp_path):
    family = FAMILIES[family_name]
    sources = [render(family, dtype, config) for dtype in family.dtypes for config in extreme_configs(family)]
    report = nvcc_compile(sources, arch, tmp_path)
    entries = re.findall(r"Compiling entry function '(\w+)'", report)
    assert len(entries) == len(sources)
    spills = re.findall(r"(\d+) bytes spill stores", report)
    assert spills and all(s == "0" for s in spills), "a variant spills registers"
    frames = re.findall(r"(\d+) bytes stack frame", report)
    assert all(f == "0" for f in frames), "a variant uses a local-memory stack frame"
