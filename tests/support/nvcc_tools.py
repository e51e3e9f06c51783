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


WERROR = ["-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"]


def _run(command: list) -> None:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"


def build_hook_harness(exported, library_source: str, harness_source: str, arch: str = "sm_90"):
    """A binary of `harness_source` (which includes an export's self-test, its main renamed)
    linked against the export's kernels (exported/library_source), both built for arch with
    warnings as errors: it runs the self-test hook's host code (inputs, reference, error) on
    the CPU. HARNESS_BITS (print_bits, read_bits) follows the harness's `#undef main` line.
    Built beside the export folder; returns its path."""
    nvcc, root = nvcc_or_skip(), exported.parent
    assert "#undef main\n" in harness_source
    (root / "harness.cu").write_text(harness_source.replace("#undef main\n", "#undef main\n" + HARNESS_BITS, 1))
    _run([nvcc, f"-arch={arch}", "-std=c++17", *WERROR, f"-I{exported}", "-c", root / "harness.cu",
          "-o", root / "harness.o"])
    _run([nvcc, f"-arch={arch}", "-std=c++17", "-O3", *WERROR, "-c", exported / library_source, "-o", root / "kernels.o"])
    _run([nvcc, f"-arch={arch}", root / "harness.o", root / "kernels.o", "-lpthread", "-o", root / "harness"])
    return root / "harness"


def harness_output(binary, *args, stdin: str | None = None) -> list[str]:
    """The lines a hook harness prints for `args`."""
    done = subprocess.run([str(binary), *map(str, args)], input=stdin, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{binary} {args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return done.stdout.splitlines()


def float_bits(line: str):
    """float32 values from a line of their bit patterns as unsigned integers."""
    import numpy as np
    return np.array([int(b) for b in line.split()], dtype=np.uint32).view(np.float32)


# C++ for a hook harness (after its includes): float vectors to and from lines of bit patterns.
HARNESS_BITS = r"""
static void print_bits(const std::vector<float>& values)
{
    for (float x : values) {
        std::uint32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        std::printf("%u ", bits);
    }
    std::printf("\n");
}

static bool read_bits(std::vector<float>& values)
{
    for (float& x : values) {
        std::uint32_t bits = 0;
        if (std::scanf("%u", &bits) != 1) return false;
        std::memcpy(&x, &bits, sizeof x);
    }
    return true;
}
"""


def harness_error(binary, out, *args) -> tuple[float, str]:
    """(error, why) a hook harness prints for `args` with `out` (float32 values) on its stdin."""
    import numpy as np
    text = " ".join(map(str, np.asarray(out).astype(np.float32).view(np.uint32).ravel().tolist()))
    result = harness_output(binary, *args, stdin=text + "\n")
    return float(result[0]), (result[1] if len(result) > 1 else "")
