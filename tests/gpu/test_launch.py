"""autogen.gpu.launch on the CPU: the ctypes structs match cuda.h, arguments convert to their C
types, and the sgemv template's PDL variant compiles (griddepcontrol on sm_90 only)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autogen.gpu import launch
from autogen.core.registry import get_family
from autogen.core.render import PDL_SUFFIX, render
from nvcc_tools import nvcc_compile

CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


def test_struct_layout_as_documented():
    # cuda.h (CUDA 12 and 13): the union pads to 64 bytes, the id to 8, the config to 56.
    assert ctypes.sizeof(launch.CUlaunchAttributeValue) == 64
    assert ctypes.sizeof(launch.CUlaunchAttribute) == 72
    assert launch.CUlaunchAttribute.value.offset == 8
    assert ctypes.sizeof(launch.CUlaunchConfig) == 56
    assert launch.CUlaunchConfig.hStream.offset == 32
    assert launch.CUlaunchConfig.attrs.offset == 40
    assert launch.CUlaunchConfig.numAttrs.offset == 48


def test_struct_layout_matches_the_installed_cuda_h(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not (CUDA_INCLUDE / "cuda.h").is_file():
        pytest.skip("needs a C compiler and cuda.h")
    program = tmp_path / "layout.c"
    program.write_text("""
#include <stdio.h>
#include <stddef.h>
#include <cuda.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %d\\n", sizeof(CUlaunchAttributeValue), sizeof(CUlaunchAttribute),
           offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream),
           offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),
           offsetof(CUlaunchConfig, sharedMemBytes), (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}
""")
    binary = tmp_path / "layout"
    subprocess.run([compiler, f"-I{CUDA_INCLUDE}", str(program), "-o", str(binary)], check=True)
    values = [int(v) for v in subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.split()]
    ours = [ctypes.sizeof(launch.CUlaunchAttributeValue), ctypes.sizeof(launch.CUlaunchAttribute),
            launch.CUlaunchAttribute.value.offset, ctypes.sizeof(launch.CUlaunchConfig),
            launch.CUlaunchConfig.hStream.offset, launch.CUlaunchConfig.attrs.offset,
            launch.CUlaunchConfig.numAttrs.offset, launch.CUlaunchConfig.sharedMemBytes.offset,
            launch.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
    assert values == ours


def test_launch_config_sets_the_attribute_only_with_pdl():
    config, attrs = launch.launch_config((7,), (128, 1), 256, 0x1234, pdl=True)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (7, 1, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (128, 1, 1)
    assert config.sharedMemBytes == 256 and config.hStream == 0x1234 and config.numAttrs == 1
    assert config.attrs[0].id == 6 and config.attrs[0].value.programmaticStreamSerializationAllowed == 1
    plain, _ = launch.launch_config((1, 2, 3), (32, 1, 1), 0, 0, pdl=False)
    assert plain.numAttrs == 0 and plain.hStream is None


class FakeArray:
    def __init__(self, ptr):
        self.data = type("Pointer", (), {"ptr": ptr})()


def test_arguments_convert_to_their_c_types():
    pointer = launch.c_argument(FakeArray(0xdead0000))
    assert isinstance(pointer, ctypes.c_void_p) and pointer.value == 0xdead0000
    assert isinstance(launch.c_argument(np.int32(5)), ctypes.c_int32)
    value = launch.c_argument(np.float32(1.5))
    assert isinstance(value, ctypes.c_float) and value.value == 1.5
    assert isinstance(launch.c_argument(np.array(3, dtype=np.uint32)), ctypes.c_uint32)
    with pytest.raises(TypeError, match="no C width"):
        launch.c_argument(5)


def test_launch_ex_passes_pointers_to_each_argument():
    seen = {}

    class FakeLib:
        def cuLaunchKernelEx(self, config, function, params, extra):
            cfg = config._obj
            seen.update(grid=cfg.gridDimX, attrs=cfg.numAttrs, function=function.value,
                        first=ctypes.cast(params[0], ctypes.POINTER(ctypes.c_void_p))[0],
                        second=ctypes.cast(params[1], ctypes.POINTER(ctypes.c_int32))[0],
                        third=ctypes.cast(params[2], ctypes.POINTER(ctypes.c_float))[0])
            return 0

    launch.launch_ex(0xF00, (3, 1, 1), (64, 1, 1), (FakeArray(0x1000), np.int32(-7), np.float32(0.25)),
                     stream_ptr=0, pdl=True, lib=FakeLib())
    assert seen == {"grid": 3, "attrs": 1, "function": 0xF00, "first": 0x1000, "second": -7, "third": 0.25}


def test_sgemv_pdl_variant_renders_only_when_asked():
    family = get_family("sgemv")
    config = family.default_config()
    plain, pdl = render(family, "float32", config), render(family, "float32", config, pdl=True)
    assert "griddepcontrol" not in plain and "pdl" not in plain
    name = family.kernel_name("float32", config)
    assert f"{name}{PDL_SUFFIX}(" in pdl and "griddepcontrol.wait" in pdl and "launch_dependents" in pdl
    # the wait comes after the weights' prefetch and before the first read of x
    assert pdl.index("asm volatile(\"prefetch") < pdl.index("asm volatile(\"griddepcontrol.wait") < pdl.index("__ldg(")
    with pytest.raises(ValueError, match="no programmatic"):
        render(get_family("softmax"), "float32", get_family("softmax").default_config(), pdl=True)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sgemv_pdl_variants_compile(tmp_path, arch):
    family = get_family("sgemv")
    configs = [family.default_config(),
               family.space.check({**family.default_params, "threads_per_row": 4, "x_path": "smem",
                                   "rows_per_group": 2}),
               family.space.check({**family.default_params, "threads_per_row": 128, "warps_per_block": 4,
                                   "reduce": "smem"})]
    nvcc_compile([render(family, "float32", c, pdl=True) for c in configs], arch, tmp_path)
    ptx = tmp_path / "pdl.ptx"
    source = tmp_path / "pdl.cu"
    source.write_text(render(family, "float32", configs[0], pdl=True))
    subprocess.run([shutil.which("nvcc"), f"-arch={arch}", "-ptx", "-o", str(ptx), str(source)], check=True)
    text = ptx.read_text()
    assert ("griddepcontrol.wait" in text) == (arch == "sm_90")
