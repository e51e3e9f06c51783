"""Every option of the CLI is checked before any GPU work, on any machine (issue 16, points 5-10):
each bad value exits 2 with a message naming it, and no traceback."""

from __future__ import annotations

import json
import time

import pytest

from autogen.cli.main import main
from autogen.errors import UsageError
from autogen.core.registry import get_family
from autogen.gpu.device import _no_gpu_message
from autogen.cli.options import check_db_url, check_export_out, int_list, problems_from_args, read_shapes_file
from autogen.report import terminal_text

TUNE = ["tune", "sgemv", "--m", "64", "--n", "64"]


def exits_2(capsys, args, fragment):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("extra, fragment", [
    (["--seed", "-1"], "--seed must be between 0 and 4294967295"),
    (["--seed", str(2**32)], "--seed must be between 0"),
    (["--timeout", "0"], "--timeout must be a positive number"),
    (["--timeout", "-3"], "--timeout must be a positive number"),
    (["--timeout", "nan"], "--timeout must be a positive number"),
    (["--timeout", "inf"], "--timeout must be a positive number"),
    (["--eval-timeout", "0"], "--eval-timeout must be a positive number"),
    (["--trials", "0"], "--trials must be at least 1"),
    (["--workers", "0"], "--workers must be at least 1"),
])
def test_tune_options_exit_2_before_any_gpu_work(capsys, extra, fragment):
    exits_2(capsys, TUNE + extra, fragment)


@pytest.mark.parametrize("value", ["16_384", "１６", "4,,8", "4,", ",4", "0x10", "+5", " "])
def test_integers_are_plain_ascii_digits(capsys, value):
    err = exits_2(capsys, ["tune", "sgemv", "--m", value, "--n", "64"], "--m")
    assert "digits 0-9" in err or "empty item" in err


def test_int_list_parses_plain_lists():
    assert int_list("4096,16384", "--m") == [4096, 16384]
    with pytest.raises(UsageError, match="empty item"):
        int_list("4,,8", "--m")


def test_shapes_file_errors_and_duplicates(tmp_path):
    sgemv = get_family("sgemv")
    path = tmp_path / "shapes.txt"
    path.write_bytes(b"m=4096 n=16\n\xff\xfe m=1\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        read_shapes_file(path, sgemv)
    path.write_text("m=4096 n=16 m=8\n")
    with pytest.raises(UsageError, match="m is given twice"):
        read_shapes_file(path, sgemv)
    path.write_text("m=4096 n=16\nm=4096, n=16\nm=8 n=16\n")

    class Args:
        shapes, dtype, m, n = path, None, [8], [16]

    keys = [p.shape_key for p in problems_from_args(Args, sgemv)]
    assert keys == ["m=4096,n=16", "m=8,n=16"]  # each shape tuned once, in order


@pytest.mark.parametrize("url, fragment", [
    ("", "--db is empty"),
    ("   ", "--db is empty"),
    ("sqlite:", "is not a SQLite URL"),
    ("sqlite:/tmp/x.db", "is not a SQLite URL"),
    ("sqlite:///", "is not a SQLite URL"),
    ("postgresql:host/db", "without '://'"),
])
def test_db_urls_that_would_be_misread_are_refused(tmp_path, monkeypatch, capsys, url, fragment):
    monkeypatch.chdir(tmp_path)
    exits_2(capsys, ["list", "--db", url], fragment)
    assert list(tmp_path.iterdir()) == []  # nothing created under the working folder


def test_valid_db_forms_pass():
    assert check_db_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    assert check_db_url("tuning.db") == "tuning.db"
    assert check_db_url("postgresql://u@h/db") == "postgresql://u@h/db"


@pytest.mark.parametrize("out", ["", "/", "//"])
def test_export_out_root_or_empty_is_refused(capsys, out):
    with pytest.raises(UsageError):
        check_export_out(out)
    exits_2(capsys, ["export", "sgemv", "--out", out], "--out")


def test_family_help_lists_only_its_own_options(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "sgemv", "--help"])
    text = capsys.readouterr().out
    assert "--m" in text and "--n" in text and "{float32}" in text
    assert "--rows" not in text and "--cols" not in text  # softmax's dims are not sgemv's
    with pytest.raises(SystemExit):
        main(["tune", "softmax", "--help"])
    text = capsys.readouterr().out
    assert "--rows" in text and "float16" in text and "--m " not in text


def test_unknown_family_is_one_line(capsys):
    exits_2(capsys, ["tune", "nosuch", "--m", "1"], "unknown family 'nosuch'")


def test_no_gpu_message_names_the_cause():
    message = _no_gpu_message(RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient "
                                           "for CUDA runtime version"))
    assert message.startswith("no NVIDIA GPU or driver found")
    assert _no_gpu_message(RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")).startswith(
        "no NVIDIA GPU or driver found")


def test_terminal_text_escapes_control_characters():
    assert terminal_text("plain text") == "plain text"
    shown = terminal_text("evil\x1b[2J\x1b]0;title\x07\rname\n")
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown and "\n" not in shown
    assert "\\x1b[2J" in shown


def test_list_and_show_escape_what_the_database_says(db_url, capsys):
    import sqlite3

    from dbfixtures import H100, store_winner
    from tuning_db import TuningDB

    store_winner(TuningDB(db_url), H100, 64, 64)
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as connection:
        connection.execute("UPDATE autogen_winners SET peer_name = 'cuBLAS\x1b[31m red\x1b[0m'")
        connection.execute("UPDATE autogen_gpus SET name = name || '\x1b]0;owned\x07'")
    assert main(["list", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]0;owned\\x07" in out
    gpu = H100.name + "\x1b]0;owned\x07"
    assert main(["show", "sgemv", "--m", "64", "--n", "64", "--db", db_url, "--gpu", gpu]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[31m" in out


def test_show_names_the_kernel_its_source_defines(db_url, capsys):
    import sqlite3

    from dbfixtures import H100, store_winner
    from tuning_db import TuningDB

    store_winner(TuningDB(db_url), H100, 64, 64)
    assert main(["show", "sgemv", "--m", "64", "--n", "64", "--db", db_url, "--gpu", H100.name, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert f"{shown['kernel']}(" in shown["source"]
    # A stored name its params do not derive is an inconsistent row (issue 34.11): its time is
    # another kernel's, so it is skipped with a note, never shown under the rendered kernel.
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as connection:
        connection.execute("UPDATE autogen_trials SET kernel_name = 'some_other_name'")
    assert main(["show", "sgemv", "--m", "64", "--n", "64", "--db", db_url, "--gpu", H100.name, "--json"]) == 1
    err = capsys.readouterr().err
    assert f"stored as 'some_other_name' but its params name '{shown['kernel']}'" in err
    assert "nothing stored for sgemv float32 m=64,n=64" in err


def test_shipped_catalog_shows_when_it_was_tuned(capsys, tmp_path):
    from autogen.catalog import pretuned

    pretuned.pretuned_db.cache_clear()
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", empty, "--gpu", "NVIDIA H100 80GB HBM3",
                 "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["stored_in"] == "the shipped catalog"
    tuned = [e for f in pretuned.catalog_files() for e in json.loads(f.read_text())["entries"]]
    times = {e["trial"]["created_at"] for e in tuned} | {e.get("updated_at") for e in tuned}
    assert shown["provenance"]["tuned_at"] in times  # the catalog's own time, not today's
    assert not (tmp_path / "empty.db").exists()  # reading wrote nothing


# -- usage errors in one line (issue 34, point 10) --------------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    (TUNE + ["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
    (TUNE + ["--nosuch"], "unrecognized arguments: --nosuch"),
    (TUNE + ["--trials"], "argument --trials: expected one argument"),
    (TUNE + ["--trials", "x"], "--trials expects a whole number"),
    (TUNE + ["--timeout", "soon"], "--timeout expects a number"),
    (TUNE + ["--cache", "warm"], "argument --cache: invalid choice"),
    (["tune"], "the following arguments are required: family"),
    (["nosuch"], "argument COMMAND: invalid choice: 'nosuch'"),
    ([], "the following arguments are required: COMMAND"),
    (["db"], "the following arguments are required: ACTION"),
    (["list", "--json", "extra"], "unrecognized arguments: extra"),
    (["export", "sgemv"], "the following arguments are required: --out"),
])
def test_argparse_errors_are_one_line_naming_the_help(capsys, args, fragment):
    err = exits_2(capsys, args, fragment)
    assert "usage:" not in err
    if args[:2] == ["tune", "sgemv"] and "expects" not in fragment:
        assert err.rstrip().endswith("(see autogen tune sgemv --help)"), err


@pytest.mark.parametrize("args, option", [
    (["tune", "sgemv", "--m", "1024", "--m", "2048", "--n", "64"], "--m"),
    (TUNE + ["--db", "a.db", "--db", "b.db"], "--db"),
    (TUNE + ["--trials", "5", "--trials", "6"], "--trials"),
    (TUNE + ["--tri", "5", "--trials", "6"], "--trials"),  # an abbreviation is the same option
    (["list", "--family", "sgemv", "--family", "softmax"], "--family"),
    (["show", "sgemv", "--m", "4", "--n", "4", "--gpu", "a", "--gpu", "b"], "--gpu"),
])
def test_an_option_given_twice_is_refused(capsys, tmp_path, monkeypatch, args, option):
    monkeypatch.chdir(tmp_path)
    exits_2(capsys, args, f"argument {option}: given more than once")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, option", [
    (TUNE + ["--trials", "١٢"], "--trials"),  # Arabic-Indic digits
    (TUNE + ["--trials", "６０"], "--trials"),  # full-width digits
    (TUNE + ["--seed", "６０"], "--seed"),
    (TUNE + ["--workers", "٢"], "--workers"),
    (TUNE + ["--timeout", "６０"], "--timeout"),
    (TUNE + ["--eval-timeout", "1_0"], "--eval-timeout"),
    (TUNE + ["--lease", "٦٠"], "--lease"),
    (["tune", "copy_if", "--n", "4096", "--selectivity", "０.５"], "--selectivity"),
])
def test_numbers_are_ascii_only(capsys, args, option):
    exits_2(capsys, args, option)


def test_ascii_numbers_and_fractions_still_parse():
    from autogen.cli.main import build_parser

    copy_if = get_family("copy_if")
    args = build_parser(copy_if).parse_args(["tune", "copy_if", "--n", "4096", "--selectivity", "0.5", "--trials",
                                             "12", "--seed", "7", "--timeout", "1.5"])
    assert (args.trials, args.seed, args.timeout) == (12, 7, 1.5)
    (problem,) = problems_from_args(args, copy_if)
    assert problem["selectivity"] == "p50"


@pytest.mark.parametrize("url, fragment", [
    ("sqlite:///x.db?mode=ro", "read-only"),
    ("sqlite:///x.db?immutable=1", "read-only"),
    ("sqlite:///file:x.db?mode=ro&uri=true", "read-only"),
    ("sqlite:///:memory:", "in-memory"),
    ("sqlite:///file::memory:?uri=true", "in-memory"),
])
@pytest.mark.parametrize("command", [TUNE, ["db", "upgrade"]])
def test_a_database_that_cannot_keep_what_is_stored_is_refused(capsys, tmp_path, monkeypatch, url, fragment,
                                                               command):
    monkeypatch.chdir(tmp_path)
    exits_2(capsys, command + ["--db", url], fragment)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_missing_database_is_noted_and_not_created(capsys, tmp_path):
    missing = tmp_path / "missing.db"
    for db in (str(missing), f"sqlite:///{missing}"):
        assert main(["list", "--db", db]) == 0
        out, err = capsys.readouterr()
        assert err == f"autogen: note: the database {missing} does not exist (a read does not create it); " \
                      "only the shipped catalog is read\n"
        assert "shipped" in out  # the catalog is still listed
    assert list(tmp_path.iterdir()) == []


def test_an_existing_database_gets_no_note(capsys, db_url):
    from tuning_db import TuningDB

    TuningDB(db_url).close()
    assert main(["list", "--db", db_url]) == 0
    assert "note" not in capsys.readouterr().err


# -- --shapes is a bounded regular file (issue 34, point 8) -----------------------------------------


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs here")
def test_shapes_that_are_not_a_regular_file_are_refused(capsys, tmp_path):
    import os
    import threading

    fifo = tmp_path / "shapes.fifo"
    os.mkfifo(fifo)  # opening it to read would wait for a writer

    def unblock_a_waiting_reader() -> None:  # so that a regression fails this test instead of hanging it
        time.sleep(5)
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # nobody is waiting to read: as it should be

    threading.Thread(target=unblock_a_waiting_reader, daemon=True).start()
    # A character device (/dev/zero is one too, and endless) and a folder are not regular files either.
    for path in [fifo, tmp_path] + [p for p in ("/dev/null",) if os.path.exists(p)]:
        exits_2(capsys, ["tune", "sgemv", "--shapes", str(path)], f"--shapes {path} is not a regular file")


def test_shapes_larger_than_the_limit_are_refused(capsys, tmp_path):
    from autogen.cli.options import MAX_SHAPES_BYTES

    path = tmp_path / "shapes.txt"
    with path.open("wb") as file:
        file.truncate(MAX_SHAPES_BYTES + 1)  # sparse: nothing is written
    exits_2(capsys, ["tune", "sgemv", "--shapes", str(path)], "is larger than 1 MiB, the limit of a shapes file")
    path.write_text("m=64 n=64\n" * (MAX_SHAPES_BYTES // 10))  # at the limit: read
    assert len(read_shapes_file(path, get_family("sgemv"))) == MAX_SHAPES_BYTES // 10


# -- terminal safety of tune's output (issue 34, point 7) -------------------------------------------


def test_tune_table_escapes_a_stored_kernel_name():
    from autogen.report import tune_table

    evil = "sgemv_f32\x1b]0;owned\x07\x1b[2J"
    doc = {"problem": {"family": "sgemv", "dtype": "float32", "shape": {"m": 64, "n": 64}}, "gpu": "GPU\x1b[31m",
           "arch": "sm_90", "winner": {"kernel": evil, "params": {"x_path": "ldg\x1b[0m"}, "time_us": 1.0,
                                       "spread_us": 0.1, "gb_per_s": 10.0, "tflop_per_s": None, "pct_of_floor": None,
                                       "roofline": "memory", "peer": None},
           "trials": {"measured": 1, "failed": 0, "rejected": 0, "reused": 0, "worker_restarts": 0},
           "wall_s": 1.0, "database": "sqlite:///x\x1b[8m.db"}
    shown = tune_table(doc)
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;owned\\x07" in shown


@pytest.mark.parametrize("module", ["autogen.search.tuner", "autogen.distributed.multi_gpu"])
def test_tune_progress_lines_escape_stored_names(capsys, module):
    import importlib

    log = importlib.import_module(module)._log  # the default progress of tune() and of the CLI
    log("kept the stored winner sgemv\x1b]0;owned\x07 (1.00 us): sgemv_x is not faster beyond its spread")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b]0;owned\\x07" in err and err.count("\n") == 1
