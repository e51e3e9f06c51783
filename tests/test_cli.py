"""The command line without a GPU: clear one-line errors, usage errors exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autogen.cli import main
from conftest import gpu_unavailable_reason

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autogen", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=120)


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU")
@pytest.mark.parametrize("command", [["tune", "sgemv", "--m", "16384", "--n", "16"],
                                     ["bench", "sgemv", "--m", "16384", "--n", "16"]])
def test_gpu_commands_without_a_gpu_fail_in_one_line(command):
    done = run_cli(*command)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("autogen: error: ") and ("GPU" in lines[0] or "CuPy" in lines[0])
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, fragment", [
    (["tune", "sgemv", "--m", "0", "--n", "16"], "m must be between 1"),
    (["tune", "sgemv", "--m", "16384"], "needs --n"),
    (["tune", "nosuch", "--m", "1", "--n", "1"], "unknown family 'nosuch'"),
    (["tune", "sgemv", "--m", "4", "--n", "4", "--dtype", "float64"], "invalid choice: 'float64'"),
    (["show", "sgemv", "--m", "4", "--n", "4", "--k", "3"], None),  # argparse: sgemv has no --k flag
    (["show", "sgemv", "--m", "4", "--n", "4", "--nosuch", "3"], None),  # argparse: no such flag
    (["tune", "sgemv", "--m", "x", "--n", "4"], "--m expects a whole number"),
    (["tune", "sgemv", "--m", "4", "--n", "4", "--sampler", "grid"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_a_message(args, fragment, capsys):
    with pytest.raises(SystemExit) if fragment is None or "invalid choice" in fragment else _no_raise():
        code = main(args)
        assert code == 2
    err = capsys.readouterr().err
    if fragment:
        assert fragment in err
    assert "Traceback" not in err


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_argparse_usage_errors_exit_2():
    done = run_cli("tune", "sgemv", "--m", "4", "--n", "4", "--sampler", "grid")
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_shapes_file_and_comma_lists(tmp_path, capsys):
    from autogen.cli import build_parser
    from autogen.family import get_family
    from autogen.options import problems_from_args

    sgemv = get_family("sgemv")
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("# m and n\nm=4096 n=16\nm=8, n=32\n")
    args = build_parser(sgemv).parse_args(["tune", "sgemv", "--m", "1,2", "--n", "3", "--shapes", str(shapes)])
    keys = [p.shape_key for p in problems_from_args(args, sgemv)]
    assert keys == ["m=4096,n=16", "m=8,n=32", "m=1,n=3", "m=2,n=3"]
    shapes.write_text("m=4096 n=sixteen\n")
    assert main(["tune", "sgemv", "--shapes", str(shapes)]) == 2
    assert "expected 'name=size ...'" in capsys.readouterr().err


def test_help_needs_no_gpu():
    done = run_cli("--help")
    assert done.returncode == 0 and "tune" in done.stdout


def test_list_show_and_db_upgrade_read_the_database(db_url, capsys, monkeypatch):
    import json

    from autogen import commands

    from dbfixtures import A100, H100, store_winner
    from tuning_db import TuningDB

    db = TuningDB(db_url)
    store_winner(db, H100, 16384, 16, time_us=1.9, peer_time_us=2.9)
    store_winner(db, A100, 16384, 16, time_us=2.5)
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert "database at revision" in capsys.readouterr().out
    assert main(["list", "--db", db_url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    rows = [r for r in listed if r["source"] == "database"]
    assert {(r["gpu"], r["shape"]) for r in rows} == {(H100.name, "m=16384,n=16"), (A100.name, "m=16384,n=16")}
    assert next(r for r in rows if r["gpu"] == H100.name)["speedup"] == round(2.9 / 1.9, 3)
    # The shipped catalog is listed too, marked; the user's own 16384 x 16 hides the shipped one of
    # that GPU (another GPU's shipped 16384 x 16 stays listed).
    shipped = [r for r in listed if r["source"] == "shipped"]
    assert shipped and H100.name in {r["gpu"] for r in shipped}
    assert (H100.name, "m=16384,n=16") not in {(r["gpu"], r["shape"]) for r in shipped}
    # Two GPUs and none of them this machine's (on an H100 the local GPU would pick its own): the
    # stated rule picks the GPU with the most tuned sgemv shapes (the H100: the shipped catalog's
    # too) and names the other.
    monkeypatch.setattr(commands, "_local_gpu_name", lambda: None)
    assert main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", db_url, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["provenance"]["gpu"] == H100.name
    assert "the GPU with the most tuned shapes" in captured.err and A100.name in captured.err
    assert main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", db_url, "--arch", "sm_80", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"]["gpu"] == A100.name
    assert main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", db_url, "--arch", "sm_75"]) == 1
    assert main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", db_url, "--arch", "hopper"]) == 2
    capsys.readouterr()
    assert main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", db_url, "--gpu", H100.name, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["provenance"]["driver_version"] == H100.driver_version
    assert f"{shown['kernel']}(const float* __restrict__ A" in shown["source"]
    assert main(["show", "sgemv", "--m", "5", "--n", "5", "--db", db_url, "--gpu", H100.name]) == 1


def test_a_tampered_record_is_refused_before_rendering(db_url, capsys):
    import sqlite3

    from dbfixtures import H100, store_winner
    from tuning_db import TuningDB

    store_winner(TuningDB(db_url), H100, 64, 64)
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as connection:
        connection.execute("""UPDATE autogen_trials SET params = '{"threads_per_row": "4) { system(\\"x\\"); } //",
                              "vector_width": 4, "warps_per_block": 4, "rows_per_group": 1, "unroll": 2,
                              "x_path": "ldg", "reduce": "shfl"}'""")
    assert main(["show", "sgemv", "--m", "64", "--n", "64", "--db", db_url, "--gpu", H100.name]) == 2
    err = capsys.readouterr().err
    assert "invalid config" in err and "threads_per_row" in err and "Traceback" not in err


def test_a_corrupt_database_file_is_a_clear_error_and_left_alone(tmp_path, capsys):
    path = tmp_path / "broken.db"
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    assert main(["list", "--db", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("autogen: database error:") and "Traceback" not in err
    assert path.read_bytes() == before
