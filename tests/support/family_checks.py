"""Checks several family test modules share."""

from __future__ import annotations


def checked_seeds(family, problem, large: bool) -> list:
    """Family.seed_configs(problem), checked: at least one, at most the elementwise cap, no
    repeats, every one valid, and (for `large` problems) none pruned for the shape."""
    from autogen.families import _elementwise as ew

    seeds = family.seed_configs(problem)
    assert 1 <= len(seeds) <= ew.SEEDS and len(set(seeds)) == len(seeds)
    for seed in seeds:
        assert not family.space.violations(seed.as_dict())
        if large:
            assert family.reject_reason(problem, seed) is None
    return seeds


def judged_with_output(family, problem, inputs: dict, output):
    """autogen.gpu.measure.judge of `inputs` with the family's (one) output set to the float64 values
    `output`, stored as the output's type: (error, why it fails or "")."""
    import numpy as np

    from autogen.core.dtypes import to_storage
    from autogen.gpu.measure import judge

    expected = family.reference(problem, inputs, np)
    magnitude = family.reference_magnitude(problem, inputs, np)
    name = family.outputs[0]
    inputs[name][...] = to_storage(np, output, problem.dtype)
    return judge(family, problem, inputs, expected, magnitude, np)


def held(args) -> tuple:
    """A step's kernel arguments as the values they hold. autogen.core.operands.kernel_scalar gives a
    holder of CuPy's where CuPy has been imported (by any earlier test, or the GPU check at
    collection) and a NumPy scalar otherwise: a test of the plan must pass either way."""
    return tuple(getattr(arg, "held", arg) for arg in args)


def built_in_families() -> dict:
    """The families autogen ships, by name: the same set whichever test modules were collected
    first (some register a user's family, or Kernel Tuner's examples, as they are imported)."""
    from autogen.core.registry import all_families

    return {name: family for name, family in all_families(include_plugins=False).items()
            if family.module.startswith("autogen.families.")}
