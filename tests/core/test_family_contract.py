"""What every registered family promises, checked the same way for each (on the CPU)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autogen.core.family import Family
from autogen.gpu.measure import judge
from autogen.core.render import render
from family_checks import built_in_families

FAMILIES = built_in_families()
CASES = [(family, dtype) for family in sorted(FAMILIES) for dtype in FAMILIES[family].dtypes]


# The kernels a source defines, found once per source rather than searched for by name per step.
# The name is the last word before "(": attributes (__launch_bounds__(...), a cluster macro) come first.
KERNEL_DEFINITION = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s*)?(?:\w+\s+)*(\w+)\(')


def small_problem(family, dtype):
    return family.problem(dtype, **{d: 37 for d in family.dims})


@pytest.mark.parametrize("name, dtype", CASES)
def test_every_point_renders_and_defines_every_step_symbol(name, dtype):
    family = FAMILIES[name]
    problem = small_problem(family, dtype)
    names = set()
    for config in family.space.enumerate():
        kernel = family.kernel_name(dtype, config, problem.traits)  # traits that change the code (Trait.code)
        source = render(family, dtype, config, traits=problem.traits)
        assert "{{" not in source and "{%" not in source
        assert "#include" not in source  # NVRTC gets no include path
        defined = set(KERNEL_DEFINITION.findall(source))
        for step in family.plan(problem, config):
            assert kernel + step.suffix in defined, f"{kernel + step.suffix} is not defined"
        assert f"{kernel}_launch(" not in source  # host launchers only for nvcc exports
        names.add(kernel)
    assert len(names) == family.space.size()  # the name identifies the variant


@pytest.mark.parametrize("name, dtype", CASES)
def test_default_config_is_valid_and_launches_something(name, dtype):
    family = FAMILIES[name]
    config = family.default_config()
    problem = small_problem(family, dtype)
    for step in family.plan(problem, config):
        assert all(v >= 1 for v in step.launch.grid + step.launch.block)
    host = render(family, dtype, config, host_launcher=True, traits=problem.traits)
    assert f"{family.kernel_name(dtype, config, problem.traits)}_launch({family.c_params_for(dtype)}, cudaStream_t stream)" in host


@pytest.mark.parametrize("name, dtype", CASES)
def test_inputs_reference_and_byte_count_agree(name, dtype):
    family = FAMILIES[name]
    problem = small_problem(family, dtype)
    rng = np.random.default_rng(0)
    poisoned = 0
    for case in family.validation_cases(problem):
        inputs = family.make_inputs(problem, np, rng, case)
        reference = family.reference(problem, inputs, np)
        # One array, or a dict keyed by output name (families with several outputs).
        references = reference if isinstance(reference, dict) else {family.outputs[0]: reference}
        for name in family.outputs:
            assert references[name].dtype == np.float64 and references[name].shape == inputs[name].shape, name
        # Poisoned (NaN, or an integer sentinel): the unlaunched outputs must fail the family's
        # own comparison, except where the output is also an input (sgemv's y with beta != 0).
        magnitude = family.reference_magnitude(problem, inputs, np)
        poisoned += bool(judge(family, problem, inputs, reference, magnitude, np)[1])
    assert poisoned >= 1, "no validation case poisons the output before the launch"
    assert family.bytes_moved(problem, family.timing_case(problem)) > 0
    # 0 only where the family's own comparison is exact (a copy): a relative error needs a bound.
    assert family.tolerance_for(problem) > 0 or type(family).compare is not Family.compare


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_example_problem_is_small_enough_to_share_a_gpu(name):
    # The GPU tests make every family's example call side by side in several processes: an
    # example of gigabytes (1000 along each of four dimensions) starved the others of memory.
    family = FAMILIES[name]
    problem = family.example_problem()
    assert family.bytes_moved(problem) <= 64 << 20, f"{name}'s example problem {problem} moves over 64 MiB"
