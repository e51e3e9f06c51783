"""A family's own compiler options reach NVRTC (a stand-in records the call: this machine needs no
NVRTC) and key its compile cache; nvcc gets them in nvcc's spelling, where ptxas shows the
register limit taking effect."""

from __future__ import annotations

import types

from autogen.core.compiler_options import checked
from autogen.gpu import compile as compile_module
from autogen.gpu.resources import kernel_resources
from nvcc_tools import nvcc_or_skip


class FakeNvrtc:
    """NVRTC's calls as autogen makes them, recording each program's options."""

    class NVRTCError(Exception):
        pass

    def __init__(self):
        self.calls = []

    def createProgram(self, source, name, headers, include_names):  # noqa: N802 (NVRTC's names)
        return types.SimpleNamespace(source=source)

    def compileProgram(self, program, options):  # noqa: N802
        self.calls.append(list(options))

    def getCUBIN(self, program):  # noqa: N802
        return b"CUBIN " + program.source.encode()

    def destroyProgram(self, program):  # noqa: N802
        pass


def test_the_options_reach_nvrtc_and_a_change_recompiles(monkeypatch, tmp_path):
    fake = FakeNvrtc()
    monkeypatch.setattr(compile_module, "_nvrtc", lambda: fake)
    monkeypatch.setattr(compile_module, "nvrtc_version", lambda: "13.0")
    options = checked(["-use_fast_math", "-maxrregcount=32", "--std=c++20"])
    compile_module.compile_cubin("kernel", "sm_90", str(tmp_path), family_options=options)
    assert fake.calls == [["--gpu-architecture=sm_90", "--use_fast_math", "--maxrregcount=32", "--std=c++20"]]
    compile_module.compile_cubin("kernel", "sm_90", str(tmp_path), family_options=options)
    assert len(fake.calls) == 1  # the same options: from the cache
    compile_module.compile_cubin("kernel", "sm_90", str(tmp_path), family_options=checked(["-maxrregcount=64"]))
    compile_module.compile_cubin("kernel", "sm_90", str(tmp_path))
    assert fake.calls[1:] == [["-std=c++17", "--gpu-architecture=sm_90", "--maxrregcount=64"],
                              ["-std=c++17", "--gpu-architecture=sm_90"]]
    assert len(list(tmp_path.glob("*.cubin"))) == 3


# Enough live values that ptxas uses more than 32 registers unless told otherwise.
BUSY = """extern "C" __global__ void busy(float *y, const float *x)
{
    float a[64];
    #pragma unroll
    for (int i = 0; i < 64; i++) a[i] = x[threadIdx.x + 32 * i];
    float s = 0.f;
    #pragma unroll
    for (int i = 0; i < 64; i++) s += a[i] * a[63 - i];
    y[threadIdx.x] = s;
}
"""


def test_nvcc_gets_them_and_ptxas_honours_the_register_limit():
    nvcc = nvcc_or_skip()
    free = kernel_resources(BUSY, "sm_90", nvcc)[0].registers
    limited = kernel_resources(BUSY, "sm_90", nvcc, checked(["--maxrregcount=32"]))[0].registers
    assert free > 32 >= limited
