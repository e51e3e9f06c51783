"""Every option of the CLI is checked before any GPU work, on any machine (issue 16, points 5-10):
each bad value exits 2 with a message naming it, and no traceback."""

from __future__ import annotations

import json

import pytest

from autogen.cli import main
from autogen.errors import UsageError
from autogen.family import get_family
from autogen.gpu import _no_gpu_message
from autogen.options import check_db_url, check_export_out, int_list, problems_from_args, read_shapes_file
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
    from autogen import pretuned

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
