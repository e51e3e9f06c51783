"""The CUDA runtime and NVRTC versions CuPy reported, remembered with what decided them.

`autogen tune` answered from the database names the software stack (autogen.catalog.environment's stale
check) but runs no kernel. Asking CuPy for the two versions means importing CuPy and letting it
search the disk for NVRTC: most of a warm command (docs/history/sessions.md, tenth session). This record
lets that command ask the driver alone (through ctypes) and take the two versions from here.

A record is trusted only while nothing that could make CuPy load other libraries has changed:
  * the interpreter, its sys.path and the environment variables CUDA, CuPy, conda and the dynamic
    linker read (the record's file name is a hash of them);
  * every folder those name, sys.path's folders and the loaded libraries' folders: installing or
    removing a package or a library changes its folder's modification time;
  * the dynamic linker's cache (/etc/ld.so.cache) and CuPy's own package file;
  * each library CuPy loaded for the runtime and NVRTC, by the path it was loaded from (symlinks
    followed again, so a re-pointed /usr/local/cuda shows) and the file's inode, size and time.
Anything else, or any doubt, answers None and the caller asks CuPy, which rewrites the record.
The record is written only where dl_iterate_phdr names the loaded libraries (Linux, glibc).

Where no record holds (a fresh HOME, a changed install), record_in_background() asks CuPy in a child
process of the same interpreter, sys.path and environment, so the same libraries are found, while
this process goes on with its own imports: importing CuPy on a thread of this process held the GIL
the database layer's imports needed (docs/benchmarks.md, "Answered from the database").
recall_when_recorded() waits for that child (never longer than RECORDING_TIMEOUT_S) before it
recalls.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from autogen.paths import cache_root, file_state, installed_file, write_atomically

RECORD_VERSION = 1
# Shared libraries whose versions the record stands for (matched on the file name).
LIBRARY_PREFIXES = ("libcudart", "libnvrtc")
# Environment variables that steer where CuPy, cuda.pathfinder and the dynamic linker look.
ENVIRONMENT_PREFIXES = ("CUDA", "CUPY", "NVIDIA", "CONDA", "LD_", "PYTHON", "VIRTUAL_ENV")
LINKER_CACHE = "/etc/ld.so.cache"
# A child that has not recorded by then (a machine just started can take seconds to import CuPy)
# is stopped, and the caller asks CuPy itself.
RECORDING_TIMEOUT_S = 30.0
# The child: this process's sys.path (argv[1]), then only where the driver reports a device, the
# two versions as autogen.gpu.device.device_identity asks CuPy for them.
_SAME_PATH = """import json, sys
sys.path[:] = json.loads(sys.argv[1])
"""
_RECORDER = _SAME_PATH + """from autogen.gpu import stack_record
from autogen.gpu.compile import nvrtc_version
from autogen.gpu.device import driver_device_count, require_cupy
if driver_device_count() > 0:
    stack_record.remember(require_cupy().cuda.runtime.runtimeGetVersion(), nvrtc_version())
"""
_recording: subprocess.Popen | None = None


def recall() -> tuple[int, str] | None:
    """(runtime version, NVRTC version) as CuPy reported them in this same setting, or None
    where there is no record or anything it depends on may have changed."""
    try:
        record = json.loads(_record_path().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None
    libraries = record.get("libraries")
    if not isinstance(libraries, dict) or not libraries:
        return None
    current = {name: file_state(name) for name in libraries}
    if current != libraries or record.get("folders") != _folder_states(libraries):
        return None
    if record.get("cupy") != file_state(installed_file("cupy")):
        return None
    runtime, nvrtc = record.get("runtime_version"), record.get("nvrtc_version")
    if not isinstance(runtime, int) or not isinstance(nvrtc, str):
        return None
    return runtime, nvrtc


def remember(runtime_version: int, nvrtc_version: str) -> None:
    """Record what CuPy, loaded in this process, reported; nothing where its libraries cannot
    be named or the cache folder cannot be written (the next command asks CuPy again)."""
    names = [name for name in _loaded_libraries() if Path(name).name.startswith(LIBRARY_PREFIXES)]
    if not any(Path(name).name.startswith("libnvrtc") for name in names):
        return
    libraries = {name: file_state(name) for name in sorted(set(names))}
    record = {"version": RECORD_VERSION, "runtime_version": int(runtime_version),
              "nvrtc_version": str(nvrtc_version), "libraries": libraries,
              "folders": _folder_states(libraries), "cupy": file_state(installed_file("cupy"))}
    try:
        write_atomically(_record_path(), json.dumps(record, indent=1))
    except OSError:
        pass


def record_in_background() -> None:
    """Start the child that records the stack (at most one per process); nothing where it
    cannot start (the caller then asks CuPy itself)."""
    global _recording
    if _recording is not None:
        return
    try:
        _recording = subprocess.Popen([sys.executable, "-c", _RECORDER, json.dumps(sys.path)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
    except OSError:
        _recording = None


def recall_when_recorded(timeout_s: float = RECORDING_TIMEOUT_S) -> tuple[int, str] | None:
    """recall(), once the child record_in_background() started has ended (stopped after
    timeout_s)."""
    global _recording
    recording, _recording = _recording, None
    if recording is not None:
        try:
            recording.wait(timeout_s)
        except subprocess.TimeoutExpired:
            recording.kill()
            recording.wait()
    return recall()


def _record_path() -> Path:
    setting = {"executable": sys.executable, "python": sys.version, "path": sys.path,
               "environment": sorted((k, v) for k, v in os.environ.items() if k.startswith(ENVIRONMENT_PREFIXES))}
    digest = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / "stack" / f"{digest}.json"


def _folder_states(libraries: dict) -> dict:
    folders = [entry for entry in sys.path if entry]
    for variable in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX"):
        for entry in os.environ.get(variable, "").split(os.pathsep):
            if entry:
                folders += [entry, os.path.join(entry, "lib"), os.path.join(entry, "lib64")]
    for name in libraries:
        folders += [os.path.dirname(name), os.path.dirname(os.path.realpath(name))]
    folders.append(LINKER_CACHE)
    return {folder: file_state(folder) for folder in sorted(set(folders))}


class _PhdrInfo(ctypes.Structure):
    # The first two members of glibc's struct dl_phdr_info: the load address and the name the
    # library was loaded under (a path; the executable's is empty).
    _fields_ = [("address", ctypes.c_void_p), ("name", ctypes.c_char_p)]


_VISIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_PhdrInfo), ctypes.c_size_t, ctypes.c_void_p)


def _loaded_libraries() -> list[str]:
    """The paths of the shared libraries loaded in this process, as they were loaded."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        iterate = ctypes.CDLL(None).dl_iterate_phdr
    except (OSError, AttributeError):
        return []
    names: list[str] = []

    def visit(info, _size, _data) -> int:
        if info.contents.name:
            names.append(os.fsdecode(info.contents.name))
        return 0

    iterate(_VISIT(visit), None)
    return names
