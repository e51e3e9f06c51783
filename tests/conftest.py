"""Shared fixtures. Tests marked `gpu` run only where CuPy sees an NVIDIA GPU.

The tests mirror the package's layout (tests/core, tests/gpu, tests/families, ...); helpers
shared by several folders live in tests/support. Both are put on sys.path here, so a test module
imports a helper, or another test module's fixtures, by its plain name."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
for _folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in ("assets", "__pycache__")):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    from autogen.errors import GpuUnavailableError
    from autogen.gpu.device import require_cupy

    try:
        require_cupy()
    except GpuUnavailableError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=1)
def nvrtc_usable() -> bool:
    """NVRTC needs no GPU: CPU tests compile through it where CuPy's NVRTC library is present."""
    try:
        from autogen.gpu.compile import nvrtc_version
        nvrtc_version()
    except Exception:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]  # not keywords: they hold tests/gpu/'s folder name
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def db_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuning.db'}"


@pytest.fixture
def no_catalog(monkeypatch):
    """Without autogen's shipped catalog: only the test's own database is read."""
    from autogen.catalog import pretuned
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    yield
    pretuned.pretuned_db.cache_clear()


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path_factory, monkeypatch):
    # Never touch the user's database or kernel cache from a test.
    monkeypatch.setenv("AUTOGEN_DB", f"sqlite:///{tmp_path_factory.mktemp('db') / 'default.db'}")
    monkeypatch.setenv("AUTOGEN_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


def checkout_env() -> dict:
    """os.environ for a child Python process that imports this checkout's autogen first, keeping
    the PYTHONPATH already set (dependencies installed with pip --target, as on the GPU machines)."""
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}


@pytest.fixture
def fresh_scalar_cache(monkeypatch):
    """An empty cache of converted kernel scalars (autogen.core.operands.kernel_scalar). It holds at most
    MAX_SCALARS values per process: tests that count conversions must not find it filled by the
    tests that ran before them in the same worker."""
    import autogen.core.operands

    monkeypatch.setattr(autogen.core.operands, "_SCALARS", {})


# Files that run long for their number of tests (nvcc builds, tuner processes, the package index).
# pytest-xdist's --dist loadfile hands out the files with the most tests first, so these came
# last, and one of them ran on one worker long after the other had run out of files: handed out
# first, the many short files even out the end. A path no longer here is passed over.
LONG_FILES = ("tests/gpu/test_nvcc_compile.py", "tests/distributed/test_distributed.py",
              "tests/export/test_export.py", "tests/export/test_export_transpose_concat.py",
              "tests/project/test_packaging.py", "tests/families/test_scan_family.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            if not getattr(self, "_long_first", False):  # the work queue is complete by the first hand-out
                self._long_first = True
                for scope in reversed(LONG_FILES):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongFilesFirst(config, log)
