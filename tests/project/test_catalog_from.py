"""scripts/catalog_from.py without a GPU: it writes the catalog file of a GPU where the dispatcher
reads the shipped catalog from (autogen.catalog.pretuned.CATALOG_DIR), under the file name the
shipped catalogs have."""

from __future__ import annotations

import sys
from pathlib import Path

from dbfixtures import H100, store_winner
from tuning_db import TuningDB

from autogen.catalog import pretuned

SCRIPTS = Path(__file__).resolve().parent.parent.parent / "scripts"
if str(SCRIPTS) not in sys.path:  # as `python scripts/catalog_from.py` has it
    sys.path.append(str(SCRIPTS))

import catalog_from  # noqa: E402


def test_the_catalog_path_is_a_shipped_catalog_file():
    shipped = set(pretuned.catalog_files())
    assert catalog_from.catalog_path("NVIDIA H100 80GB HBM3") in shipped
    assert catalog_from.catalog_path("NVIDIA H200") in shipped


def test_the_winners_are_written_where_the_dispatcher_reads_them(tmp_path, monkeypatch, capsys):
    database = tmp_path / "tuned.db"
    store_winner(TuningDB(database), H100, 4096, 16, time_us=2.5)
    monkeypatch.setattr(pretuned, "CATALOG_DIR", tmp_path / "data")
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(sys, "argv", ["catalog_from.py", "--gpu", H100.name, str(database)])
    assert catalog_from.main() == 0
    assert "wrote 1 winners" in capsys.readouterr().out
    [written] = pretuned.catalog_files()
    assert written.name == "pretuned_nvidia_h100_80gb_hbm3.json"
    [winner] = pretuned.load_catalog(written)
    assert winner.trial.time_us == 2.5
