"""autogen.gpu.stack_record: the runtime and NVRTC versions CuPy reported are recalled only while
nothing that decides which libraries CuPy loads has changed; autogen.gpu.device.identity_for_lookup
names the GPU from the driver and that record, or asks CuPy."""

from __future__ import annotations

import os
import sys

import pytest

from autogen.gpu import device as gpu, stack_record
from dbfixtures import H100

OLD = 1_600_000_000  # a fixed past modification time, so that any later change shows


@pytest.fixture
def setting(tmp_path, monkeypatch):
    """A cache folder of its own and an NVRTC library file that "CuPy loaded"."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "cuda" / "lib64"
    folder.mkdir(parents=True)
    library = folder / "libnvrtc.so.13"
    library.write_bytes(b"nvrtc 13.0")
    for path in (library, folder):
        os.utime(path, (OLD, OLD))
    loaded = [str(library), "/lib/x86_64-linux-gnu/libc.so.6"]
    monkeypatch.setattr(stack_record, "_loaded_libraries", lambda: loaded)
    return library


def test_a_remembered_stack_is_recalled(setting):
    assert stack_record.recall() is None
    stack_record.remember(13000, "13.0")
    assert stack_record.recall() == (13000, "13.0")


def test_a_changed_library_file_is_not_trusted(setting):
    stack_record.remember(13000, "13.0")
    setting.write_bytes(b"nvrtc 13.1, another build")
    assert stack_record.recall() is None


def test_a_library_added_beside_it_is_not_trusted(setting):
    stack_record.remember(13000, "13.0")
    (setting.parent / "libnvrtc.so.13.1").write_bytes(b"a newer one")
    assert stack_record.recall() is None


def test_a_repointed_symlink_is_not_trusted(setting, tmp_path, monkeypatch):
    other = tmp_path / "cuda-13.1" / "lib64"
    other.mkdir(parents=True)
    (other / "libnvrtc.so.13").write_bytes(b"nvrtc 13.1")
    link = tmp_path / "current"
    link.symlink_to(setting.parent)
    monkeypatch.setattr(stack_record, "_loaded_libraries", lambda: [str(link / "libnvrtc.so.13")])
    stack_record.remember(13000, "13.0")
    assert stack_record.recall() == (13000, "13.0")
    link.unlink()
    link.symlink_to(other)
    assert stack_record.recall() is None


def test_an_environment_that_steers_the_search_is_part_of_the_record(setting, monkeypatch):
    stack_record.remember(13000, "13.0")
    before = os.environ.get("CUDA_HOME")  # a GPU machine may set it
    monkeypatch.setenv("CUDA_HOME", "/opt/another-cuda")
    assert stack_record.recall() is None
    if before is None:
        monkeypatch.delenv("CUDA_HOME")
    else:
        monkeypatch.setenv("CUDA_HOME", before)
    assert stack_record.recall() == (13000, "13.0")


def test_a_changed_sys_path_folder_is_not_trusted(setting, tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    os.utime(site, (OLD, OLD))
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    stack_record.remember(13000, "13.0")
    assert stack_record.recall() == (13000, "13.0")
    (site / "nvidia_cuda_nvrtc-13.1.dist-info").mkdir()  # pip installs a package there
    assert stack_record.recall() is None


def test_without_nvrtc_among_the_loaded_libraries_nothing_is_recorded(setting, monkeypatch):
    monkeypatch.setattr(stack_record, "_loaded_libraries", lambda: ["/lib/x86_64-linux-gnu/libc.so.6"])
    stack_record.remember(13000, "13.0")
    assert not (stack_record.cache_root() / "stack").exists()
    assert stack_record.recall() is None


def test_a_damaged_record_is_not_trusted(setting):
    stack_record.remember(13000, "13.0")
    [record] = (stack_record.cache_root() / "stack").iterdir()
    record.write_text("{not json")
    assert stack_record.recall() is None
    record.write_text('{"version": 1, "libraries": {}}')
    assert stack_record.recall() is None


def test_an_unwritable_cache_records_nothing_and_raises_nothing(setting, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("where the cache folder should go\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    stack_record.remember(13000, "13.0")
    assert stack_record.recall() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="dl_iterate_phdr is glibc's")
def test_the_loaded_libraries_are_named_by_the_dynamic_linker():
    names = stack_record._loaded_libraries()
    libc = [name for name in names if os.path.basename(name).startswith("libc.so")]
    assert libc and all(os.path.isabs(name) for name in libc), names


# -- autogen.gpu.device.identity_for_lookup ---------------------------------------------------------


def _driver_says(monkeypatch):
    properties = (H100.name, H100.compute_capability, H100.sm_count, H100.l2_bytes, 13010)
    monkeypatch.setattr(gpu, "driver_properties", lambda ordinal: properties)


def _cupy_would_fail(monkeypatch):
    def fail(device_id=None):
        raise AssertionError("CuPy was asked")
    monkeypatch.setattr(gpu, "device_identity", fail)


def test_with_a_record_the_driver_and_the_record_name_the_gpu(setting, monkeypatch):
    stack_record.remember(13000, "13.0")
    _driver_says(monkeypatch)
    _cupy_would_fail(monkeypatch)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    identity = gpu.identity_for_lookup()
    assert identity == H100.__class__(**{**H100.__dict__, "driver_version": 13010})


def test_without_a_record_cupy_answers_and_the_stack_is_recorded(setting, monkeypatch):
    monkeypatch.setattr(gpu, "device_identity", lambda device_id=None: H100)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    assert gpu.identity_for_lookup() == H100
    assert stack_record.recall() == (H100.runtime_version, H100.nvrtc_version)


def test_where_cupy_is_imported_its_current_device_answers(setting, monkeypatch):
    stack_record.remember(13000, "13.0")
    monkeypatch.setitem(sys.modules, "cupy", object())
    monkeypatch.setattr(gpu, "device_identity", lambda device_id=None: H100)
    assert gpu.identity_for_lookup() == H100


def test_where_the_driver_fails_cupy_names_the_problem(setting, monkeypatch):
    stack_record.remember(13000, "13.0")
    monkeypatch.delitem(sys.modules, "cupy", raising=False)

    def no_driver(ordinal):
        raise OSError("libcuda.so.1: cannot open shared object file")

    def cupy_says(device_id=None):
        raise gpu.GpuUnavailableError("no NVIDIA GPU or driver found")

    monkeypatch.setattr(gpu, "driver_properties", no_driver)
    monkeypatch.setattr(gpu, "device_identity", cupy_says)
    with pytest.raises(gpu.GpuUnavailableError, match="no NVIDIA GPU"):
        gpu.identity_for_lookup()


# -- autogen.gpu.device.require_gpu: the driver answers where it can, CuPy names any problem ----------


@pytest.mark.parametrize("cupy_found, driver, asks_cupy", [
    (True, lambda: 1, False),
    (True, lambda: 0, True),
    (True, "raises", True),
    (False, lambda: 1, True),
])
def test_require_gpu_asks_cupy_only_in_doubt(monkeypatch, cupy_found, driver, asks_cupy):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (real_find_spec("json") if cupy_found else None) if name == "cupy"
                        else real_find_spec(name, *a))

    def no_driver():
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(gpu, "driver_device_count", no_driver if driver == "raises" else driver)
    asked = []

    def cupy_says():
        asked.append(True)
        raise gpu.GpuUnavailableError("no NVIDIA GPU or driver found")

    monkeypatch.setattr(gpu, "require_cupy", cupy_says)
    if asks_cupy:
        with pytest.raises(gpu.GpuUnavailableError, match="no NVIDIA GPU"):
            gpu.require_gpu()
    else:
        gpu.require_gpu()
    assert bool(asked) == asks_cupy


def _run_recorder(monkeypatch, code: str, timeout_s: float = 30.0):
    monkeypatch.setattr(stack_record, "_RECORDER", code)
    monkeypatch.setattr(stack_record, "_recording", None)
    stack_record.record_in_background()
    return stack_record.recall_when_recorded(timeout_s)


def test_the_recording_child_runs_with_this_process_sys_path(setting, monkeypatch, tmp_path):
    # The record's name is a hash of sys.path: the child must search, and record, as this process would.
    seen = tmp_path / "child_path.json"
    _run_recorder(monkeypatch, stack_record._SAME_PATH + f"open({str(seen)!r}, 'w').write(json.dumps(sys.path))\n")
    assert __import__("json").loads(seen.read_text()) == sys.path


def test_recall_waits_for_the_recording_child(setting, monkeypatch, tmp_path):
    marker = tmp_path / "done"
    code = f"import time, pathlib\ntime.sleep(0.3)\npathlib.Path({str(marker)!r}).write_text('x')\n"
    assert _run_recorder(monkeypatch, code) is None  # the child wrote no record
    assert marker.exists()


def test_a_recording_child_that_hangs_is_stopped(setting, monkeypatch):
    import time
    started = time.monotonic()
    assert _run_recorder(monkeypatch, "import time\ntime.sleep(60)\n", timeout_s=0.5) is None
    assert time.monotonic() - started < 30


def test_without_a_driver_the_recording_child_records_nothing(setting, monkeypatch):
    monkeypatch.setattr(stack_record, "_recording", None)
    try:
        __import__("ctypes").CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here")
    except OSError:
        pass
    stack_record.record_in_background()
    assert stack_record.recall_when_recorded() is None
    assert not list((stack_record.cache_root() / "stack").glob("*.json")) if (stack_record.cache_root() / "stack").exists() else True
