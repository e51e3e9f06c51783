"""A plain, non-editable install must carry the templates, migrations and the shipped catalog."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def test_wheel_holds_templates_migrations_and_catalog(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (ROOT / "templates").rglob("*.j2"):
        assert "autogen/templates/" + template.relative_to(ROOT / "templates").as_posix() in names
    assert "tuning_db/migrations/versions/0001_initial.py" in names
    assert "tuning_db/migrations/script.py.mako" in names
    assert any(n.startswith("autogen/catalog/data/pretuned_") and n.endswith(".json") for n in names)
    assert {"autogen/torch/ops.py", "autogen/torch/models.py"} <= names  # the PyTorch integration
    assert not any(n.startswith("tests/") for n in names)


def _extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _resolve(requirements: list[str]) -> subprocess.Popen:
    """pip's resolution of `requirements` for this platform, as JSON on stdout; nothing installed."""
    return subprocess.Popen([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                             "--disable-pip-version-check", "--report", "-", *requirements],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_each_cuda_extra_brings_nvrtc_and_cublas():
    """A machine with only the NVIDIA driver: `pip install '.[cuda13]'` (or cuda12) must bring the
    NVRTC that tuning compiles with and the cuBLAS of the peer, of the extra's CUDA major (CuPy's
    own wheel carries neither: they come with its `ctk` extra). Asks the package index; where it
    cannot be reached, skips (CI, which installs from it, fails instead)."""
    extras = {name: reqs for name, reqs in _extras().items() if name.startswith("cuda")}
    assert set(extras) == {"cuda12", "cuda13"}
    runs = {name: _resolve(reqs) for name, reqs in extras.items()}  # both at once: each waits on the index
    for name, run in runs.items():
        out, err = run.communicate(timeout=600)
        if run.returncode != 0:
            if os.environ.get("CI") or "No matching distribution" in err or "ResolutionImpossible" in err:
                pytest.fail(f"extra {name} does not resolve: {err.strip()[-1500:]}")
            pytest.skip(f"the package index cannot be reached: {err.strip().splitlines()[-1:]}")
        installed = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                     for item in json.loads(out)["install"]}
        major = name.removeprefix("cuda")
        assert f"cupy-cuda{major}x" in installed, (name, sorted(installed))
        for library in ("nvidia-cuda-nvrtc", "nvidia-cublas"):
            found = {n: v for n, v in installed.items() if n.startswith(library)}
            assert found, f"extra {name} brings no {library}: {sorted(installed)}"
            assert all(v.split(".")[0] == major for v in found.values()), (name, found)
