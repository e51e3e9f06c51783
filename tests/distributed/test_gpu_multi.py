"""`autogen tune --gpus all` on 8 sgemv shapes, on a machine with two GPUs or more."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu


def test_gpus_all_tunes_8_sgemv_shapes(tmp_path, capsys):
    from autogen.cli.main import main
    from autogen.gpu.device import require_cupy
    from tuning_db import TuningDB

    cupy = require_cupy()
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("".join(f"m={m} n={n}\n" for m in (4096, 16384) for n in (16, 32, 128, 1024)))
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    assert main(["tune", "sgemv", "--shapes", str(shapes), "--trials", "12", "--gpus", "all", "--db", url,
                 "--json"]) == 0
    documents = json.loads(capsys.readouterr().out)
    assert len(documents) == 8 and all(d["winner"] for d in documents)
    assert {g for d in documents for g in d["gpus"]} == set(range(cupy.cuda.runtime.getDeviceCount()))
    db = TuningDB(url)
    for d in documents:
        shape = f"m={d['problem']['shape']['m']},n={d['problem']['shape']['n']}"
        winner = db.winners(family="sgemv", shape_key=shape)[0]
        trials = db.trials(winner.device, "sgemv", "float32", shape)
        assert len(trials) == 12 == len({t.kernel_name for t in trials})
        claims = db.claims(winner.device, "sgemv", "float32", shape)
        assert all(c.state == "done" for c in claims)
