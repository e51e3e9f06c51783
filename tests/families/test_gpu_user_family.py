"""The example user family (examples/mykernels/axpy.py) on a real GPU, exactly as a built-in one:
tuned through the CLI in a fresh process (the GPU worker re-imports the user's module), every
variant validates on tail shapes, the dispatcher serves it from Python, and its export self-test
builds and passes. The exhaustive tune is also recorded for the CPU replay tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))


def cli(*args, db_url):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "autogen", *args, "--db", db_url], capture_output=True, text=True,
                          env=env, timeout=600)


def test_tune_validate_dispatch_and_export_a_user_family(tmp_path, db_url, monkeypatch):
    import cupy

    import autogen
    from autogen.gpu.compile import compile_many
    from autogen.core.registry import get_family
    from autogen.core.render import render
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    axpy = get_family("mykernels.axpy")
    done = cli("tune", "mykernels.axpy", "--n", "1000003", "--sampler", "exhaustive", "--trials", "100", "--json",
               db_url=db_url)
    assert done.returncode == 0, done.stderr[-3000:]
    tuned = json.loads(done.stdout)
    print(f"\nmykernels.axpy n=1000003: {tuned['winner']['kernel']} {tuned['winner']['time_us']} us, "
          f"peer {tuned['winner']['peer_time_us']} us, {tuned['winner']['pct_of_floor']}% of the copy floor")
    assert tuned["trials"]["measured"] == axpy.space.size()

    # Every variant validates on tail shapes, in this process.
    configs = list(axpy.space.enumerate())
    sources = {axpy.kernel_name("float32", c): render(axpy, "float32", c) for c in configs}
    cubins = compile_many(sources, "sm_" + "".join(map(str, cupy.cuda.Device().compute_capability)))
    for n in (1, 3, 4097, 100003):
        evaluator = Evaluator(WorkSpec.of(axpy.problem(n=n)))
        for config in configs:
            name = axpy.kernel_name("float32", config)
            check = evaluator.check(name, cubins[name], config.as_dict())
            assert check.ok, f"{name} at n={n}: {check.reason}"

    # The dispatcher serves the tuned kernel, and the nearest one for an untuned length.
    monkeypatch.setenv("AUTOGEN_DB", db_url)
    from autogen.runtime import dispatch
    monkeypatch.setattr(dispatch, "_default_dispatcher", None)
    x = cupy.random.random(1000003, dtype=cupy.float32)
    y = cupy.random.random(1000003, dtype=cupy.float32)
    out = autogen.call("mykernels.axpy", x, y, alpha=2.0)
    assert np.allclose(out.get(), 2.0 * x.get() + y.get(), rtol=1e-6)
    assert autogen.lookup("mykernels.axpy", n=1000003).served_by == "exact"
    assert autogen.lookup("mykernels.axpy", n=5000).served_by == "nearest"

    # Its export self-test builds and passes.
    if shutil.which("nvcc") is None or shutil.which("make") is None:
        pytest.skip("needs nvcc and make on PATH")
    out_dir = tmp_path / "export"
    done = cli("export", "mykernels.axpy", "--out", str(out_dir), "--self-test", db_url=db_url)
    assert done.returncode == 0, done.stderr
    build = subprocess.run(["make", "-C", str(out_dir), "selftest"], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(out_dir / "autogen_mykernels_axpy_selftest")], capture_output=True, text=True,
                         timeout=600)
    print(run.stdout[-2000:])
    assert run.returncode == 0 and "autogen self-test: PASS" in run.stdout
