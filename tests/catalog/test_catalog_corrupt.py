"""Issue 34, point 4: a corrupt shipped catalog is one warning, never a traceback.

A temporary catalog folder holds a good file and a damaged one (truncated, empty, binary, of an
unknown format, or with an entry that lacks a field, has an unknown one or a time as text):
list, show, export, the dispatcher and the warm start of every tune use the good entries and
say once, on stderr, what was skipped.
"""

from __future__ import annotations

import json

import pytest
from tuning_db import TuningDB

from autogen.catalog import pretuned
from autogen.cli.main import main
from autogen.runtime.dispatch import Dispatcher
from autogen.core.registry import get_family
from autogen.search.warmstart import seeds
from dbfixtures import H100, store_winner

SGEMV = get_family("sgemv")
GOOD = SGEMV.problem(m=16384, n=16)
GOOD_PARAMS = {**SGEMV.default_params, "unroll": 4}  # not the default: seen only through the catalog


def _entry(tmp_path, m: int, n: int) -> dict:
    source = TuningDB(tmp_path / f"source_{m}_{n}.db")
    store_winner(source, H100, m, n, time_us=2.0, params=GOOD_PARAMS)
    made = tmp_path / f"entry_{m}_{n}.json"
    pretuned.dump_catalog(source, H100.name, made)
    source.close()
    return json.loads(made.read_text())["entries"][0]


def _document(entry: dict) -> bytes:
    return json.dumps({"format": pretuned.FORMAT, "entries": [entry]}).encode()


def _spoiled_entry(spoil):
    def make(entry: dict) -> bytes:
        spoil(entry)
        return _document(entry)
    return make


CORRUPTIONS = {
    "truncated": lambda entry: _document(entry)[:200],
    "empty": lambda entry: b"",
    "binary": lambda entry: bytes(range(256)),
    "unknown_format": lambda entry: json.dumps({"format": 99, "entries": [entry]}).encode(),
    "entries_not_a_list": lambda entry: json.dumps({"format": pretuned.FORMAT, "entries": entry}).encode(),
    "missing_trial_field": _spoiled_entry(lambda e: e["trial"].pop("source_hash")),
    "unknown_trial_field": _spoiled_entry(lambda e: e["trial"].update(colour="blue")),
    "time_as_text": _spoiled_entry(lambda e: e["trial"].update(time_us="fast")),
    "device_not_an_object": _spoiled_entry(lambda e: e.update(device="H100")),
}


@pytest.fixture(params=sorted(CORRUPTIONS))
def catalog(request, tmp_path, monkeypatch):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "pretuned_good.json").write_bytes(_document(_entry(tmp_path, 16384, 16)))
    (folder / "pretuned_bad.json").write_bytes(CORRUPTIONS[request.param](_entry(tmp_path, 4096, 16)))
    monkeypatch.setattr(pretuned, "CATALOG_DIR", folder)
    monkeypatch.delenv("AUTOGEN_NO_PRETUNED", raising=False)
    pretuned.pretuned_db.cache_clear()
    yield folder
    pretuned.pretuned_db.cache_clear()


def _one_warning(capsys) -> str:
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "warning: shipped catalog" in line]
    assert len(warnings) == 1 and "pretuned_bad.json" in warnings[0], captured.err
    assert warnings[0].startswith("autogen: warning: ") and "Traceback" not in captured.err
    pretuned.pretuned_db.cache_clear()  # the next command is another process: it warns again
    return captured.out


def test_list_show_and_export_use_the_good_entries(catalog, db_url, tmp_path, capsys):
    assert main(["list", "--db", db_url, "--json"]) == 0
    assert [row["shape"] for row in json.loads(_one_warning(capsys))] == [GOOD.shape_key]

    assert main(["show", "sgemv", "--m", "16384", "--n", "16", "--db", db_url, "--gpu", H100.name, "--json"]) == 0
    assert json.loads(_one_warning(capsys))["params"] == SGEMV.space.check(GOOD_PARAMS).as_dict()

    out = tmp_path / "export"
    assert main(["export", "sgemv", "--out", str(out), "--gpu", H100.name, "--db", db_url, "--json"]) == 0
    assert [s["shape"] for e in json.loads(_one_warning(capsys))["entry_points"] for s in e["shapes"]] == [
        GOOD.shape_key]


def test_the_dispatcher_and_the_warm_start_use_the_good_entries(catalog, db_url, capsys):
    first = next(Dispatcher(db_url)._candidates(SGEMV, GOOD, H100, False))
    assert first[0] == "exact" and first[1].trial.params == GOOD_PARAMS
    _one_warning(capsys)

    with TuningDB(db_url) as db:
        assert GOOD_PARAMS in seeds(db, H100, SGEMV, SGEMV.problem(m=8192, n=16), warm_start=True)
    _one_warning(capsys)
