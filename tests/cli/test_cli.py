"""The command line without a GPU: clear one-line errors, usage errors exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autogen.cli.main import main
from conftest import gpu_unavailable_reason

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    assert main(args) == 2
    err = capsys.readouterr().err
    if fragment:
        assert fragment in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_argparse_usage_errors_exit_2():
    done = run_cli("tune", "sgemv", "--m", "4", "--n", "4", "--sampler", "grid")
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_shapes_file_and_comma_lists(tmp_path, capsys):
    from autogen.cli.main import build_parser
    from autogen.core.registry import get_family
    from autogen.cli.options import problems_from_args

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

    from autogen.cli import commands

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
    # Skipped with one line naming the row and why (issue 34.1), never rendered.
    assert main(["show", "sgemv", "--m", "64", "--n", "64", "--db", db_url, "--gpu", H100.name]) == 1
    captured = capsys.readouterr()
    assert "outside today's space" in captured.err and "threads_per_row" in captured.err
    assert "Traceback" not in captured.err and "system" not in captured.out


def test_a_corrupt_database_file_is_a_clear_error_and_left_alone(tmp_path, capsys):
    path = tmp_path / "broken.db"
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    assert main(["list", "--db", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("autogen: database error:") and "Traceback" not in err
    assert path.read_bytes() == before


# -- every command's --help, for every family (issue 33, point 4) -----------------------------------

EXAMPLES = os.path.join(ROOT, "examples")
FAMILY_COMMANDS = ("tune", "bench", "show", "export")


def _builtin_families() -> list[str]:
    from autogen.core.registry import all_families
    return sorted(name for name, family in all_families(include_plugins=False).items()
                  if family.module.startswith("autogen."))


def _help_of(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    assert err == "" and out.startswith(f"usage: autogen {argv[0] if argv[0] != '--help' else ''}".rstrip()), out
    return out


@pytest.mark.parametrize("family", _builtin_families())
def test_every_command_has_help_for_every_builtin_family(capsys, family):
    from autogen.core.registry import get_family
    from autogen.cli.options import dim_flag

    dims = get_family(family).dims
    for command in FAMILY_COMMANDS:
        text = _help_of(capsys, [command, family, "--help"])
        if command != "export":  # export takes the family alone
            assert all(dim_flag(d) in text for d in dims) and "--dtype" in text, text


def test_every_command_has_help_for_the_example_family(capsys, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)  # as PYTHONPATH=examples would
    for command in FAMILY_COMMANDS:
        text = _help_of(capsys, [command, "mykernels.axpy", "--help"])
        assert command == "export" or "--n" in text
    done = subprocess.run([sys.executable, "-m", "autogen", "tune", "mykernels.axpy", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, EXAMPLES])})
    assert done.returncode == 0 and "mykernels.axpy" in done.stdout and done.stderr == "", done.stderr


@pytest.mark.parametrize("argv", [["--help"], ["list", "--help"], ["db", "--help"], ["db", "upgrade", "--help"],
                                  ["tune", "--help"], ["export", "--help"]])
def test_the_commands_without_a_family_have_help(capsys, argv):
    _help_of(capsys, argv)


def test_a_family_may_write_percent_signs_in_its_texts():
    # argparse %-formats help text: a family's '%' (histogram's "90% of the values") broke --help.
    import types

    from autogen.cli.main import build_parser
    from autogen.core.family import Trait

    family = types.SimpleNamespace(
        name="user.percent", description="x % y, 100% of %(prog)s, %d %o", dims=("n_50pct",), dim_defaults={},
        traits=(Trait("mode", ("a%b", "c%(x)s"), help="50% hot, %(default)s, %o"),), dtypes=("float32%",))
    for command in ("tune", "bench", "show"):
        text = " ".join(build_parser(family)._subparsers._group_actions[0].choices[command].format_help().split())
        assert "50% hot, %(default)s, %o (one of a%b, c%(x)s; default a%b)" in text, text
        assert "element type (default float32%)" in text


# -- output into a pipe whose reader went away (issue 33, point 4) ----------------------------------


def _into_a_closed_pipe(*args: str, unbuffered: bool = False) -> subprocess.CompletedProcess:
    """Run autogen with stdout a pipe nobody reads any more (as `| head` that has exited)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "autogen", *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, timeout=120, env={**env, **({"PYTHONUNBUFFERED": "1"}
                                                                             if unbuffered else {})})
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args, unbuffered", [(["list", "--json"], False), (["list", "--json"], True),
                                              (["tune", "sgemv", "--help"], False)])
def test_a_reader_that_went_away_ends_the_command_quietly(args, unbuffered):
    done = _into_a_closed_pipe(*args, unbuffered=unbuffered)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141 and done.stderr == ""


def test_an_export_into_a_closed_pipe_writes_its_files_and_ends_quietly(tmp_path):
    done = _into_a_closed_pipe("export", "sgemv", "--out", str(tmp_path / "out"), "--gpu", "NVIDIA H100 80GB HBM3",
                               "--db", f"sqlite:///{tmp_path / 'empty.db'}")
    assert "Traceback" not in done.stderr and done.returncode == 141, done.stderr
    assert (tmp_path / "out" / "CMakeLists.txt").exists() and not (tmp_path / "empty.db").exists()


# -- the compile pool a tune keeps, at the command's exit ---------------------------------------------

KEEPS_A_POOL = r"""
import os, sys
from autogen.cli import main as cli
from autogen.gpu import backend

def tune_that_keeps_its_pool():  # what a tune leaves: its compile pool kept for a next problem
    pool = backend._new_pool(2)
    pool.submit(sum, [1, 2]).result()
    backend._keep(None, pool, 2)
    return 0

if __name__ == "__main__":
    cli.main = tune_that_keeps_its_pool
    cli.entry()
"""


def test_the_command_leaves_no_semaphores_for_the_resource_tracker_to_warn_of(tmp_path):
    # entry() leaves through os._exit, which runs none of multiprocessing's exit hooks: a kept
    # pool's semaphores stayed registered and the resource tracker, outliving the command,
    # printed "There appear to be 5 leaked semaphore objects" on the user's terminal.
    script = tmp_path / "keeps_a_pool.py"
    script.write_text(KEEPS_A_POOL)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 0 and "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr
