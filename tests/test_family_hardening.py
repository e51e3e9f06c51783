"""Issue 34, points 3 and 6: data never chooses code, and a user family's mistakes are one line.

A family name read from a database row is resolved among the families this environment
registers, never imported; a broken family definition (names, choices, template) is refused
when it registers, and a template that cannot render stops a command before any search, with
one line naming the family and its module.
"""

from __future__ import annotations

import json

import pytest
from tuning_db import TuningDB
from tuning_db.records import TrialRecord

from autogen import pretuned
from autogen.cli import main
from dbfixtures import H100


@pytest.fixture(autouse=True)
def _no_catalog(monkeypatch):
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    yield
    pretuned.pretuned_db.cache_clear()


# -- 34.3: data never chooses code ----------------------------------------------------------------

def test_list_never_imports_the_package_a_row_names(tmp_path, monkeypatch, capsys):
    # A package on sys.path (python -m autogen puts the working folder there) that a shared
    # database names as a row's family: reading the row must not import it.
    package = tmp_path / "planted"
    package.mkdir()
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    with TuningDB(db_url) as db:
        trial = db.record_trial(H100, TrialRecord(
            family="planted.kernel", dtype="float32", shape_key="n=1024", kernel_name="planted_kernel_f32",
            params={}, status="ok", time_us=1.0, samples_us=(1.0,), spread_us=0.0, error=0.0))
        db.set_winner(H100, trial, peer_name="", peer_time_us=None, margin=None, autogen_version="0.1.0")

    assert main(["list", "--db", db_url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["family"], r["stale"][:1]) for r in rows] == [("planted.kernel", ["unknown family"])]
    assert not marker.exists()
