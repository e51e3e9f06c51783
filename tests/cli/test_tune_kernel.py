"""Kernel Tuner's examples (examples/kt_examples) through autogen without a GPU: a replay-backed
tune_kernel stores its results where `list`, `show`, `export` and the dispatcher's chain find
them; `autogen check` renders and compiles them (and user and built-in families) with nvcc;
`autogen tune-kernel`'s usage errors are one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import autogen
from autogen.cli.main import main
from autogen.core.render import render, source_hash
from autogen.runtime.dispatch import Dispatcher
from autogen.testing.replay import RECORDING_FORMAT, ReplayBackend
from dbfixtures import H100
from nvcc_tools import nvcc_or_skip

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "examples"))  # as PYTHONPATH=examples would

from kt_examples import matmul, vector_add  # noqa: E402

MATMUL_CHECK = ["check", str(matmul.SOURCE), "--kernel", "matmul_kernel", "--restrict",
                "block_size_x==block_size_y*tile_size_y", "--grid-div-x", "block_size_x,tile_size_x",
                "--grid-div-y", "block_size_y,tile_size_y", "--problem-size", "4096,4096"]


def recording(family, shape_key: str, time_of) -> dict:
    """TEST AID: timings made up from the parameters, so that the search has something to rank.
    Never a reported figure: plumbing only."""
    trials = {family.kernel_name("float32", c): {"status": "ok", "reason": "", "error": 1e-8,
                                                 "samples_us": [time_of(c)] * 3} for c in family.space.enumerate()}
    return {"format": RECORDING_FORMAT, "device": H100.__dict__, "peer": None, "trials": trials,
            "problem": {"family": family.name, "dtype": "float32", "shape_key": shape_key}}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('kt') / 'tuning.db'}"
    replay = ReplayBackend.factory(recording(vector_add.FAMILY, "size_x=4096", lambda c: 10 + abs(c["block_size_x"] - 256)))
    found = vector_add.tune(4096, db=db, backend_factory=replay, progress=lambda _line: None)
    return db, found


def test_a_replayed_brute_force_tune_measures_every_point_and_stores_the_best(tuned):
    db, found = tuned
    results, env = found  # unpacks as Kernel Tuner's (results, env)
    assert len(results) == 6 and {r["status"] for r in results} == {"ok"}
    assert found.best == {"block_size_x": 256} and env["best_kernel"] == "kt_examples_vector_add_f32_bsx256"
    assert env["family"] == "kt_examples.vector_add" and env["problem"] == "size_x=4096"
    assert all(r["time"] == pytest.approx(r["time_us"] / 1000) for r in results)


def test_the_dispatcher_and_the_commands_serve_it(tuned, capsys):
    db, _found = tuned
    family = vector_add.FAMILY
    served, winner = next(Dispatcher(db)._candidates(family, family.problem(size_x=4096), H100, False))
    assert served == "exact" and winner.trial.params == {"block_size_x": 256}
    assert main(["list", "--db", db, "--json"]) == 0
    assert "kt_examples.vector_add" in capsys.readouterr().out
    assert main(["show", "kt_examples.vector_add", "--size-x", "4096", "--db", db, "--gpu", H100.name]) == 0
    shown = capsys.readouterr().out
    assert "#define block_size_x 256" in shown and "#define vector_add kt_examples_vector_add_f32_bsx256" in shown


def test_it_exports_and_the_export_compiles(tuned, tmp_path, capsys):
    import subprocess

    nvcc = nvcc_or_skip()
    db, _found = tuned
    out = tmp_path / "export"
    assert main(["export", "kt_examples.vector_add", "--out", str(out), "--db", db, "--gpu", H100.name]) == 0
    source = out / "autogen_kt_examples_vector_add.cu"
    assert "kt_examples_vector_add_f32_bsx256_launch" in source.read_text()
    done = subprocess.run([nvcc, "-arch=sm_90", "-c", str(source), "-o", str(tmp_path / "k.o")], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_the_matmul_example_tunes_its_restricted_grid(tmp_path):
    family = matmul.FAMILY
    assert family.space.size() == 44  # Kernel Tuner's grid under block_size_x == block_size_y * tile_size_y
    launch = family.launch(family.problem(size_x=4096, size_y=4096),
                           family.space.check({"block_size_x": 32, "block_size_y": 8, "tile_size_x": 2,
                                               "tile_size_y": 4}))
    assert launch.grid == (64, 128, 1) and launch.block == (32, 8, 1)
    fastest = {"block_size_x": 32, "block_size_y": 8, "tile_size_x": 4, "tile_size_y": 4}
    replay = ReplayBackend.factory(recording(family, "size_x=64,size_y=64", lambda c: 5 if c.as_dict() == fastest
                                             else 20))
    found = matmul.tune(64, db=f"sqlite:///{tmp_path / 'mm.db'}", backend_factory=replay, progress=lambda _l: None,
                        strategy="random_sample", strategy_options={"max_fevals": 44})
    assert found.best == fastest and len(found.results) == 44


def test_check_renders_every_point_and_compiles_a_sample(capsys):
    nvcc_or_skip()
    params = ["--param", "block_size_x=32,256"]
    assert main(["check", str(vector_add.SOURCE), "--kernel", "vector_add", *params, "--sample", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["points"] == 2 and doc["compile_failures"] == 0 and len(doc["compiled"]) == 2
    # 64 x 8 tiles of 8 columns: 128 KiB of static shared memory, over what a block may hold
    grid = ["--param", "block_size_x=16,64", "--param", "block_size_y=8", "--param", "tile_size_x=1,8",
            "--param", "tile_size_y=2,8"]
    assert main(MATMUL_CHECK + grid + ["--sample", "4"]) == 1
    report = capsys.readouterr().out
    assert "rendered 4 of 4 points" in report and "compile failed: kernel_matmul_kernel_f32_bsx64_bsy8_tsx8_tsy8" \
        in report


def test_check_takes_user_and_built_in_families(capsys):
    nvcc_or_skip()
    assert main(["check", "kt_examples.vector_add", "--sample", "1"]) == 0
    assert "rendered 6 of 6 points" in capsys.readouterr().out
    assert main(["check", "gelu", "--sample", "1", "--arch", "sm_80"]) == 0
    assert "gelu: rendered" in capsys.readouterr().out


FAST = ["-use_fast_math", "--maxrregcount=32", "-DUNUSED_MACRO=3"]  # Kernel Tuner's spellings


def test_compiler_options_reach_every_compile_the_records_and_the_export(tmp_path, capsys):
    import subprocess

    from tuning_db import TuningDB

    nvcc = nvcc_or_skip()
    db, made = f"sqlite:///{tmp_path / 'fast.db'}", []
    family = autogen_kernel_family("kt_examples.vector_add_fast")
    replay = ReplayBackend.factory(recording(family, "size_x=4096", lambda c: c["block_size_x"]), made=made)
    args, answer = vector_add.arguments(4096)
    found = autogen.tune_kernel("vector_add", vector_add.SOURCE, 4096, args, vector_add.TUNE_PARAMS, answer=answer,
                                name="kt_examples.vector_add_fast", compiler_options=FAST, db=db,
                                backend_factory=replay, progress=lambda _line: None)
    nvrtc = ("--use_fast_math", "--maxrregcount=32", "-DUNUSED_MACRO=3")
    assert found.best == {"block_size_x": 32} and set(made[0].compiled_options) == {nvrtc}  # measured and re-timed
    trial = TuningDB(db).trials(H100, "kt_examples.vector_add_fast", "float32", "size_x=4096", "cold")[0]
    assert trial.compile_options == "-std=c++17 --gpu-architecture=sm_90 " + " ".join(nvrtc)
    source = render(family, "float32", family.space.check(trial.params))
    assert trial.source_hash == source_hash(source, nvrtc) != source_hash(source)  # re-tuned when options change
    out = tmp_path / "export"
    assert main(["export", "kt_examples.vector_add_fast", "--out", str(out), "--db", db, "--gpu", H100.name]) == 0
    makefile = (out / "Makefile").read_text()
    assert "KERNEL_FLAGS := -use_fast_math -maxrregcount=32 -DUNUSED_MACRO=3" in makefile
    assert "-maxrregcount=32;-DUNUSED_MACRO=3>" in (out / "CMakeLists.txt").read_text()
    done = subprocess.run(["make", f"NVCC={nvcc}", "-n"], cwd=out, capture_output=True, text=True)
    assert done.returncode == 0 and "-std=c++17 -use_fast_math -maxrregcount=32 -DUNUSED_MACRO=3" in done.stdout
    done = subprocess.run(["make", f"NVCC={nvcc}", "ARCH=sm_90"], cwd=out, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def autogen_kernel_family(name: str):
    return autogen.kernel_family("vector_add", vector_add.SOURCE, 4096, vector_add.arguments(4096)[0],
                                 vector_add.TUNE_PARAMS, compiler_options=FAST, name=name)


def test_check_compiles_with_the_compiler_options(capsys):
    nvcc_or_skip()
    grid = ["--param", "block_size_x=32", "--param", "block_size_y=4", "--param", "tile_size_x=8",
            "--param", "tile_size_y=8", "--sample", "1", "--json"]
    assert main(MATMUL_CHECK + grid) == 0
    free = json.loads(capsys.readouterr().out)["compiled"][0]["registers"]
    assert main(MATMUL_CHECK + grid + ["--compiler-option=-maxrregcount=32", "--compiler-option=-lineinfo"]) == 0
    assert free > 32 >= json.loads(capsys.readouterr().out)["compiled"][0]["registers"]


@pytest.mark.parametrize("argv, message", [
    (["tune-kernel", "missing.cu", "--kernel", "k", "--param", "a=1", "--problem-size", "8", "--args", "int32=1"],
     "not found"),
    (["tune-kernel", str(vector_add.SOURCE), "--kernel", "vector_add", "--param", "a", "--problem-size", "8"],
     "is not NAME=V1,V2"),
    (["tune-kernel", str(vector_add.SOURCE), "--kernel", "vector_add", "--param", "block_size_x=32",
      "--problem-size", "8"], "--args RULE or --npz FILE"),
    (["tune-kernel", str(vector_add.SOURCE), "--param", "block_size_x=32", "--problem-size", "8"], "--kernel NAME"),
    (["tune-kernel", str(vector_add.SOURCE), "--kernel", "vector_add", "--param", "block_size_x=32",
      "--problem-size", "8", "--args", "float32[size_x] bogus"], "argument 1 'bogus'"),
    (["check", "nosuchfamily"], "unknown family"),
    (["check", str(vector_add.SOURCE), "--kernel", "vector_add", "--param", "block_size_x=32",
      "--compiler-option=-arch=sm_80"], "compiler option '-arch=sm_80' is not taken: autogen compiles for"),
    (["tune-kernel", str(vector_add.SOURCE), "--kernel", "vector_add", "--param", "block_size_x=32",
      "--problem-size", "8", "--args", "int32=1", "--compiler-option=-I/opt/inc"], "'-I/opt/inc' is not taken"),
])
def test_usage_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_tune_kernel_help_works(capsys):
    with pytest.raises(SystemExit) as done:
        main(["tune-kernel", "--help"])
    assert done.value.code == 0 and "--problem-size" in capsys.readouterr().out
