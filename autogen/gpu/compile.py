"""NVRTC compilation (through CuPy's NVRTC bindings) to cubin, with an on-disk cache.

Compiling needs no GPU and no CUDA context, so it runs in a pool of worker processes while the
GPU times earlier variants. The cache key holds everything that changes the binary: the source,
the options, the target architecture, the NVRTC version and this module's CACHE_VERSION.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from autogen.errors import CompileError, GpuUnavailableError
from autogen.notes import note_once
from autogen.paths import kernel_cache_dir, write_atomically

CACHE_VERSION = "1"  # bump when the way binaries are produced changes
BASE_OPTIONS = ("-std=c++17",)
# Binaries that could not be written to the disk cache, by file name: kept for this process.
_IN_MEMORY: dict[str, bytes] = {}
_IN_MEMORY_LOCK = threading.Lock()


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as exc:  # ImportError, or the NVRTC library missing
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GpuUnavailableError(f"NVRTC is not available through CuPy ({reason}); install autogen with the "
                                  "extra of your driver's CUDA major, e.g. pip install 'autogen-cuda[cuda13]', "
                                  "which brings NVRTC and cuBLAS as wheels") from None
    return nvrtc


def nvrtc_version() -> str:
    major, minor = _nvrtc().getVersion()
    return f"{major}.{minor}"


def compile_options(arch: str, family_options: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The exact options a variant is compiled with for `arch` (e.g. "sm_90"): autogen's, then
    its family's own (Family.compiler_options, checked at registration); a family's -std
    replaces autogen's."""
    base = tuple(o for o in BASE_OPTIONS if not (o.startswith("-std=") and any(
        f.startswith("--std=") for f in family_options)))
    return base + (f"--gpu-architecture={arch}",) + tuple(family_options)


def cache_key(source: str, options: tuple[str, ...], nvrtc: str) -> str:
    digest = hashlib.sha256(f"autogen-cubin-{CACHE_VERSION}\0nvrtc-{nvrtc}\0".encode())
    digest.update("\0".join(options).encode() + b"\0" + source.encode())
    return digest.hexdigest()


def compile_cubin(source: str, arch: str, cache_dir: str | None = None,
                  family_options: tuple[str, ...] = ()) -> bytes:
    """Compile one kernel source to a cubin for `arch` with its family's own options besides
    autogen's; raise CompileError with NVRTC's log."""
    nvrtc = _nvrtc()
    options = compile_options(arch, family_options)
    folder = Path(cache_dir) if cache_dir else kernel_cache_dir()
    path = folder / (cache_key(source, options, nvrtc_version()) + ".cubin")
    try:
        if path.is_file():
            return path.read_bytes()
    except OSError:
        pass  # an unreadable cache entry is compiled again
    with _IN_MEMORY_LOCK:
        kept = _IN_MEMORY.get(path.name)
    if kept is not None:
        return kept
    cubin = _nvrtc_compile(nvrtc, source, options)
    try:
        write_atomically(path, cubin)
    except OSError as exc:  # the cache is best-effort: a read-only folder must not stop a kernel
        with _IN_MEMORY_LOCK:
            _IN_MEMORY[path.name] = cubin
        note_once(("kernel-cache", str(folder)), f"cannot write the kernel cache {folder} "
                  f"({exc.strerror or exc}); compiled kernels are kept in memory for this process")
    return cubin


def _nvrtc_compile(nvrtc, source: str, options: tuple[str, ...]) -> bytes:
    program = nvrtc.createProgram(source, "autogen_kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(program)
            raise CompileError(f"NVRTC failed ({exc}): {log.strip()}") from None
        return nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)


def compile_many(sources: dict[str, str], arch: str, workers: int | None = None,
                 family_options: tuple[str, ...] = ()) -> dict[str, bytes | CompileError]:
    """Compile {name: source} in a process pool; a failure is returned in place of its cubin."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers or os.cpu_count(), mp_context=context) as pool:
        futures = {name: pool.submit(compile_cubin, source, arch, None, family_options) for name, source in sources.items()}
        results: dict[str, bytes | CompileError] = {}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except CompileError as exc:
                results[name] = exc
        return results
