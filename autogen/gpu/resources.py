"""What a kernel asks of the SM, as ptxas reports it: registers, spills, stack frame, static
shared memory, barriers.

`autogen show FAMILY ... --resources` compiles the shown kernel's source with the CUDA toolkit's
nvcc for the architecture it was tuned on. Where a kernel misses its target, these come first:
registers bound how many warps an SM holds, spills and a stack frame put local memory on the
path, static shared memory bounds blocks per SM. No GPU is needed, and nothing is written outside
a temporary folder. The served binary is NVRTC's; nvcc runs the same ptxas, so the two agree
where their CUDA versions do (the report names nvcc's).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from autogen.errors import CompileError, ToolMissingError
from autogen.core.compiler_options import language_std, nvcc_flags
from autogen.gpu.compile import BASE_OPTIONS


@dataclass(frozen=True)
class KernelResources:
    kernel: str
    arch: str
    registers: int
    shared_bytes: int  # static shared memory per block
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        spills = ("no spills" if not (self.spill_store_bytes or self.spill_load_bytes)
                  else f"spills {self.spill_store_bytes} B stored, {self.spill_load_bytes} B loaded")
        return (f"{self.registers} registers, {self.shared_bytes} B static shared memory, {spills}, "
                f"{self.stack_frame_bytes} B stack frame, {self.barriers} barriers")


def nvcc_options(family_options: tuple[str, ...] = ()) -> tuple[str, ...]:
    """compile_options in nvcc's spelling, without the architecture (nvcc takes -arch): what
    `autogen check` and `show --resources` give nvcc (an export's Makefile spells the same)."""
    base = tuple(o for o in BASE_OPTIONS if not o.startswith("-std="))
    return base + (f"-std={language_std(family_options)}",) + nvcc_flags(family_options)


def nvcc_path() -> str:
    """The nvcc on PATH, else under $CUDA_HOME or $CUDA_PATH; ToolMissingError if none."""
    found = shutil.which("nvcc")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if found is None and home and (Path(home) / "bin" / "nvcc").is_file():
            found = str(Path(home) / "bin" / "nvcc")
    if found is None:
        raise ToolMissingError("nvcc not found (PATH, $CUDA_HOME, $CUDA_PATH): the resource report "
                               "needs the CUDA toolkit's compiler")
    return found


def nvcc_version(nvcc: str) -> str:
    """"13.0" from `nvcc --version` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    text = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else "unknown"


def kernel_resources(source: str, arch: str, nvcc: str | None = None,
                     family_options: tuple[str, ...] = ()) -> list[KernelResources]:
    """Compile `source` to a cubin for `arch` (e.g. "sm_90") with `nvcc -Xptxas -v` and its
    family's own options; one entry per kernel it defines, in ptxas's order. CompileError with
    nvcc's log when it fails."""
    nvcc = nvcc or nvcc_path()
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"not an nvcc architecture: {arch!r}")
    with tempfile.TemporaryDirectory(prefix="autogen-resources-") as folder:
        path = Path(folder) / "kernel.cu"
        path.write_text(source)
        done = subprocess.run([nvcc, f"-arch={arch}", "-cubin", *nvcc_options(family_options), "-Xptxas", "-v",
                               "-o", str(path.with_suffix(".cubin")), str(path)],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise CompileError(f"nvcc {arch} failed: {done.stderr.strip()[-2000:]}")
    return parse_ptxas_report(done.stderr)


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_NUMBER_OF = {  # ptxas's phrase -> field; a phrase ptxas leaves out (no barriers, no smem) is 0
    "registers": r"Used (\d+) registers",
    "barriers": r"used (\d+) barriers",
    "shared_bytes": r"(\d+) bytes smem",
    "stack_frame_bytes": r"(\d+) bytes stack frame",
    "spill_store_bytes": r"(\d+) bytes spill stores",
    "spill_load_bytes": r"(\d+) bytes spill loads",
}


def parse_ptxas_report(text: str) -> list[KernelResources]:
    """ptxas -v's report, split per entry function: the lines from one "Compiling entry
    function" to the next hold that kernel's properties and usage."""
    starts = list(_ENTRY.finditer(text))
    kernels = []
    for i, start in enumerate(starts):
        block = text[start.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        found = {field: re.search(pattern, block) for field, pattern in _NUMBER_OF.items()}
        if found["registers"] is None:
            raise CompileError(f"ptxas reported no register count for {start.group(1)}")
        numbers = {field: int(m.group(1)) if m else 0 for field, m in found.items()}
        kernels.append(KernelResources(kernel=start.group(1), arch=start.group(2), **numbers))
    return kernels
