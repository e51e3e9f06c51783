"""Kernel Tuner's examples tuned for real by autogen.tune_kernel on the GPU: every point measured
(brute force), a winner stored, and the dispatcher serving it through autogen.lookup and
autogen.call with correct results."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import autogen

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "examples"))

from kt_examples import matmul, vector_add  # noqa: E402


@pytest.fixture
def db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    monkeypatch.setenv("AUTOGEN_DB", url)  # where autogen.lookup's dispatcher reads
    import autogen.runtime.dispatch as dispatch
    monkeypatch.setattr(dispatch, "_default_dispatcher", None)
    return url


def test_vector_add_tunes_and_is_served(db):
    import cupy

    n = 1_000_003  # not a multiple of any block size
    found = vector_add.tune(n, db=db)
    assert found.best is not None and len(found.results) == len(vector_add.TUNE_PARAMS["block_size_x"])
    assert all(r["status"] == "ok" for r in found.results), found.results
    kernel = autogen.lookup(vector_add.NAME, size_x=n)
    assert kernel.served_by == "exact" and kernel.params == found.best
    a, b = cupy.random.random(n, dtype=cupy.float32), cupy.random.random(n, dtype=cupy.float32)
    c = cupy.full(n, cupy.nan, dtype=cupy.float32)
    autogen.call(vector_add.NAME, c, a, b, np.int32(n), problem_size=n)
    assert cupy.allclose(c, a + b)


def test_matmul_tunes_its_whole_restricted_grid(db):
    found = matmul.tune(512, db=db)
    statuses = {r["status"] for r in found.results}
    assert len(found.results) == 44 and "ok" in statuses
    # Tiles over 48 KiB of static shared memory, or blocks over 1,024 threads, fail; the rest pass.
    assert found.best is not None and found.env["best_time_us"] > 0
