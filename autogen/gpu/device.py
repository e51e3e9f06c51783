"""The one place that imports CuPy and asks the driver about the GPU."""

from __future__ import annotations

import functools
import sys

from tuning_db.records import DeviceIdentity

from autogen.errors import GpuUnavailableError
from autogen.gpu import stack_record
from autogen.gpu.compile import nvrtc_version
from autogen.paths import installed_file


def require_cupy():
    """Return the cupy module with a usable GPU, or raise GpuUnavailableError in one line."""
    try:
        import cupy
    except Exception as exc:  # not installed, or its CUDA libraries missing
        raise GpuUnavailableError(
            f"CuPy is not usable ({type(exc).__name__}: {_first_line(exc)}); "
            "install autogen with the cuda12 or cuda13 extra on a machine with an NVIDIA GPU"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, or the driver finds no device
        raise GpuUnavailableError(_no_gpu_message(exc)) from None
    if count < 1:
        raise GpuUnavailableError("no NVIDIA GPU or driver found: the driver reports 0 devices")
    return cupy


def require_gpu() -> None:
    """require_cupy()'s check, without importing CuPy where the driver can answer: CuPy is
    installed (found, not imported) and the driver reports a device. Otherwise, or in any doubt,
    require_cupy() decides and names the problem in one line. `autogen tune` answered from the
    database then needs no CuPy at all (see identity_for_lookup); a search's GPU worker imports it."""
    if installed_file("cupy") is not None:
        try:
            if driver_device_count() > 0:
                return
        except (OSError, RuntimeError):
            pass
    require_cupy()


def gpu_count() -> int:
    """How many GPUs this process sees, after require_gpu()'s check: from the driver where it
    answers (no CuPy imported), else from CuPy's runtime."""
    require_gpu()
    try:
        return driver_device_count()
    except (OSError, RuntimeError):
        return require_cupy().cuda.runtime.getDeviceCount()


def _no_gpu_message(exc: BaseException) -> str:
    """Name the cause: without a GPU the CUDA runtime says "CUDA driver version is insufficient"
    (no libcuda at all) or "no CUDA-capable device", neither of which says what is missing."""
    text = _first_line(exc)
    if any(marker in text for marker in ("InsufficientDriver", "insufficient", "NoDevice", "no CUDA-capable",
                                         "libcuda", "cudaErrorInitializationError")):
        return f"no NVIDIA GPU or driver found (CUDA said: {text}); GPU commands need one"
    return f"no usable NVIDIA GPU: {text}"


@functools.lru_cache(maxsize=None)
def device_identity(device_id: int | None = None) -> DeviceIdentity:
    cupy = require_cupy()

    runtime = cupy.cuda.runtime
    device_id = runtime.getDevice() if device_id is None else device_id
    props = runtime.getDeviceProperties(device_id)
    name = props["name"]
    return DeviceIdentity(
        name=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=f"{props['major']}.{props['minor']}",
        sm_count=int(props["multiProcessorCount"]),
        l2_bytes=int(props["l2CacheSize"]),
        driver_version=int(runtime.driverGetVersion()),
        runtime_version=int(runtime.runtimeGetVersion()),
        nvrtc_version=nvrtc_version(),
    )


def identity_for_lookup() -> DeviceIdentity:
    """The current GPU's identity for a database lookup: device_identity()'s answer, from the
    driver (through ctypes) and autogen.gpu.stack_record where that record holds, so CuPy is not
    imported; from CuPy otherwise, which then records the stack for the next command. Where CuPy
    is already imported, its current device is the one meant, so CuPy answers."""
    recalled = None if "cupy" in sys.modules else stack_record.recall_when_recorded()
    if recalled is None:
        identity = device_identity()
        stack_record.remember(identity.runtime_version, identity.nvrtc_version)
        return identity
    try:
        name, compute_capability, sm_count, l2_bytes, driver_version = driver_properties(0)
    except (OSError, RuntimeError):  # no driver, no device: CuPy's path says which, in one line
        return device_identity()
    runtime_version, nvrtc = recalled
    return DeviceIdentity(name=name, compute_capability=compute_capability, sm_count=sm_count,
                          l2_bytes=l2_bytes, driver_version=driver_version, runtime_version=runtime_version,
                          nvrtc_version=nvrtc)


# cuDeviceGetAttribute's attributes (cuda.h's CUdevice_attribute).
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


def _driver():
    """libcuda (autogen.gpu.launch), initialised; RuntimeError where cuInit fails (no device)."""
    from autogen.gpu.launch import libcuda

    lib = libcuda()
    _check(lib.cuInit(0), "cuInit")
    return lib


def _check(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what} failed with CUDA error {code}")


def driver_device_count() -> int:
    import ctypes

    count = ctypes.c_int()
    _check(_driver().cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    return count.value


def driver_properties(ordinal: int) -> tuple[str, str, int, int, int]:
    """(name, compute capability, SM count, L2 bytes, driver version) of the device `ordinal`
    from the driver API alone: the values CuPy's runtime reports for them."""
    import ctypes

    lib = _driver()
    device = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
    name = ctypes.create_string_buffer(256)
    _check(lib.cuDeviceGetName(name, len(name), device), "cuDeviceGetName")

    def attribute(code: int) -> int:
        value = ctypes.c_int()
        _check(lib.cuDeviceGetAttribute(ctypes.byref(value), code, device), "cuDeviceGetAttribute")
        return value.value

    version = ctypes.c_int()
    _check(lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    return (name.value.decode(), f"{major}.{minor}", attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE), version.value)


def free_device_memory() -> int:
    cupy = require_cupy()
    free, _total = cupy.cuda.runtime.memGetInfo()
    return int(free)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# Where no GPU is visible (CPU tests, planning off-device): the H100 SXM's figures (132 SMs x 2048
# resident threads, 228 KB of shared memory per SM and 1 KB reserved per block, sm_90; the H200's
# are the same). Grids sized from these are correct anywhere (kernels stride or bound-check); on a
# GPU the current device's own figures are used.
FALLBACK_SM_COUNT = 132
FALLBACK_THREADS_PER_SM = 2048
FALLBACK_SHARED_PER_SM = 233472
FALLBACK_SHARED_RESERVED = 1024
FALLBACK_COMPUTE_CAPABILITY = (9, 0)


@functools.lru_cache(maxsize=1)
def _current_properties() -> dict | None:
    """The current device's properties (one device per process, as in the GPU worker); None where
    no GPU is visible."""
    try:
        runtime = require_cupy().cuda.runtime
    except GpuUnavailableError:
        return None
    return runtime.getDeviceProperties(runtime.getDevice())


def resident_capacity() -> tuple[int, int]:
    """(SM count, resident threads per SM); the fallback figures where no GPU is visible."""
    props = _current_properties()
    if props is None:
        return FALLBACK_SM_COUNT, FALLBACK_THREADS_PER_SM
    return int(props["multiProcessorCount"]), int(props["maxThreadsPerMultiProcessor"])


def shared_capacity() -> tuple[int, int]:
    """(shared memory per SM, reserved per block) in bytes; the fallback figures where no GPU is visible."""
    props = _current_properties() or {}
    return (int(props.get("sharedMemPerMultiprocessor", FALLBACK_SHARED_PER_SM)),
            int(props.get("reservedSharedMemPerBlock", FALLBACK_SHARED_RESERVED)))


def compute_capability() -> tuple[int, int]:
    """(major, minor); the fallback where no GPU is visible."""
    props = _current_properties()
    if props is None:
        return FALLBACK_COMPUTE_CAPABILITY
    return int(props["major"]), int(props["minor"])


def sm_count() -> int:
    return resident_capacity()[0]
