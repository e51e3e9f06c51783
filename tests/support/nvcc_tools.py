"""Compile generated CUDA with the nvcc on PATH (CI has nvcc 13 but no GPU)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ARCHS = ("sm_80", "sm_90")


def nvcc_or_skip() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH in CI: generated CUDA would go unchecked")
        pytest.skip("nvcc not on PATH")
    return nvcc


def nvcc_compile(sources: list[str], arch: str, workdir, extra: list[str] | None = None) -> str:
    """Compile the concatenated sources to a cubin for arch; return ptxas' resource report."""
    nvcc = nvcc_or_skip()
    path = workdir / f"variants_{arch}.cu"
    path.write_text("\n".join(sources))
    done = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-Werror", "all-warnings",
                           "-o", str(path.with_suffix(".cubin")), str(path), *(extra or [])],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"nvcc {arch} failed:\n{done.stderr[-4000:]}"
    return done.stderr


def extreme_configs(family) -> list:
    """The default config plus, for every parameter and every choice, a valid config holding it."""
    configs = [family.default_config()]
    all_configs = list(family.space.enumerate())
    for param in family.space.params:
        for choice in param.choices:
            match = next((c for c in all_configs if c[param.name] == choice), None)
            assert match is not None, f"{param.name}={choice!r} appears in no valid config"
            if match not in configs:
                configs.append(match)
    return configs
