"""The dispatcher's fallback chain and the pre-tuned catalog, on the CPU."""

from __future__ import annotations

import json

import pytest

from dbfixtures import A100, H100, H100_PCIE, store_winner
from tuning_db import TuningDB

from autogen.catalog import pretuned
from autogen.runtime.dispatch import Dispatcher
from autogen.errors import NotTunedError
from autogen.core.registry import get_family

SGEMV = get_family("sgemv")


@pytest.fixture
def dispatcher(db_url, monkeypatch):
    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    pretuned.pretuned_db.cache_clear()
    db = TuningDB(db_url)
    store_winner(db, H100, 16384, 16)
    store_winner(db, H100, 4096, 4096)
    store_winner(db, H100, 1024, 128)
    store_winner(db, H100_PCIE, 16384, 32)  # same architecture, other GPU
    store_winner(db, A100, 16384, 17)  # other architecture: never served on an H100
    yield Dispatcher(db_url)
    pretuned.pretuned_db.cache_clear()


def chain(dispatcher, m, n, strict=False):
    problem = SGEMV.problem(m=m, n=n)
    return [(step, w.trial.shape_key if w else None, w.device.name if w else None)
            for step, w in dispatcher._candidates(SGEMV, problem, H100, strict)]


def test_exact_shape_comes_first(dispatcher):
    steps = chain(dispatcher, 16384, 16)
    assert steps[0] == ("exact", "m=16384,n=16", H100.name)
    assert [s for s, _, _ in steps] == ["exact", "nearest", "nearest", "arch", "default"]


def test_untuned_shape_goes_nearest_then_arch_then_default(dispatcher):
    steps = chain(dispatcher, 8192, 16)
    assert steps[0] == ("nearest", "m=16384,n=16", H100.name)  # one octave away in m
    assert steps[1][1] == "m=1024,n=128" or steps[1][1] == "m=4096,n=4096"
    assert steps[-2] == ("arch", "m=16384,n=32", H100_PCIE.name)
    assert steps[-1] == ("default", None, None)
    assert all(name != A100.name for _, _, name in steps)


def test_nearest_is_ordered_by_log_distance(dispatcher):
    shapes = [key for step, key, _ in chain(dispatcher, 2048, 256) if step == "nearest"]
    assert shapes == ["m=1024,n=128", "m=4096,n=4096", "m=16384,n=16"]


def test_a_neighbours_winner_is_served_as_the_family_adapts_it():
    # exact: the winner's own config; nearest and arch: Family.seed_from's (validated before it is
    # served), where the space holds it, else the stored one; default: the default config
    from types import SimpleNamespace

    from autogen.runtime.dispatch import _served_config

    hgemv = get_family("hgemv")
    stored = dict(hgemv.default_params, threads_per_row=128, warps_per_block=4, rows_per_group=2, unroll=2,
                  tail="peeled")
    winner = SimpleNamespace(trial=SimpleNamespace(params=stored))
    odd = hgemv.problem(m=3000, n=4099, batch=1)
    assert _served_config(hgemv, odd, "exact", winner).as_dict() == stored
    for step in ("nearest", "arch"):
        assert _served_config(hgemv, odd, step, winner) == hgemv.default_config(odd)  # rows in flight
    # re-tiled for two vectors, tail=peeled is one vector's only: hgemv adapts it to the shape's default
    aligned_two = hgemv.problem(m=4096, n=4096, batch=2)
    assert _served_config(hgemv, aligned_two, "nearest", winner) == hgemv.default_config(aligned_two)
    assert _served_config(hgemv, aligned_two, "default", None) == hgemv.default_config(aligned_two)
    # an adaptation outside the space is not served: the stored winner is
    outside = SimpleNamespace(space=hgemv.space, seed_from=lambda problem, params: {**params, "batch_tile": 3})
    assert _served_config(outside, aligned_two, "nearest", winner).as_dict() == stored
    # families that adapt nothing serve the neighbour's winner as it is
    sgemv_winner = SimpleNamespace(trial=SimpleNamespace(params=dict(SGEMV.default_params)))
    assert _served_config(SGEMV, SGEMV.problem(m=8192, n=16), "nearest", sgemv_winner) == SGEMV.default_config()


def test_strict_raises_instead_of_falling_back(dispatcher):
    steps = dispatcher._candidates(SGEMV, SGEMV.problem(m=4096, n=4096), H100, True)
    assert next(steps)[0] == "exact"
    with pytest.raises(NotTunedError, match="not tuned"):
        next(steps)  # strict: nothing after the exact match
    with pytest.raises(NotTunedError, match="not tuned"):
        chain(dispatcher, 4097, 4096, strict=True)


def test_catalog_round_trip_and_user_db_first(tmp_path, monkeypatch, db_url):
    source = TuningDB(tmp_path / "tuned.db")
    store_winner(source, H100, 16384, 16, time_us=1.9)
    store_winner(source, A100, 4096, 4096, time_us=30.0)
    catalog = tmp_path / "pretuned_nvidia_h100_80gb_hbm3.json"
    assert pretuned.dump_catalog(source, H100.name, catalog) == 1
    assert json.loads(catalog.read_text())["entries"][0]["trial"]["time_us"] == 1.9

    monkeypatch.setattr(pretuned, "CATALOG_DIR", tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("AUTOGEN_NO_PRETUNED", raising=False)
    pretuned.pretuned_db.cache_clear()
    try:
        shipped = pretuned.pretuned_db()
        assert shipped is not None and len(shipped.winners(gpu_name=H100.name)) == 1
        user = TuningDB(db_url)
        store_winner(user, H100, 16384, 16, time_us=1.5, params={**SGEMV.default_params, "unroll": 4})
        dispatcher = Dispatcher(db_url)
        first = next(dispatcher._candidates(SGEMV, SGEMV.problem(m=16384, n=16), H100, False))
        assert first[0] == "exact" and first[1].trial.time_us == 1.5  # the user's own tuning wins
    finally:
        pretuned.pretuned_db.cache_clear()


def test_catalog_keep_adds_to_the_file_and_replaces_what_the_databases_hold(tmp_path):
    first, second = TuningDB(tmp_path / "first.db"), TuningDB(tmp_path / "second.db")
    store_winner(first, H100, 16384, 16, time_us=1.9)
    store_winner(first, H100, 4096, 4096, time_us=30.0)
    store_winner(second, H100, 16384, 16, time_us=1.7)
    catalog = tmp_path / "pretuned_nvidia_h100_80gb_hbm3.json"
    pretuned.dump_catalog(first, H100.name, catalog)
    assert pretuned.dump_catalog(second, H100.name, catalog, keep=True) == 2
    times = {e["trial"]["shape_key"]: e["trial"]["time_us"] for e in json.loads(catalog.read_text())["entries"]}
    assert times == {"m=16384,n=16": 1.7, "m=4096,n=4096": 30.0}
    assert pretuned.dump_catalog(second, H100.name, catalog) == 1  # without keep: replaced


def test_catalog_with_an_unknown_format_is_skipped_with_a_warning(tmp_path, capsys):
    bad = tmp_path / "pretuned_x.json"
    bad.write_text(json.dumps({"format": 99, "entries": []}))
    assert pretuned.load_catalog(bad) == []
    assert "unsupported catalog format 99" in capsys.readouterr().err


def test_concurrent_first_calls_build_the_kernel_once(dispatcher, monkeypatch):
    import threading
    import time
    import types

    import autogen.runtime.dispatch as dispatch

    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0)))
    monkeypatch.setattr(dispatch, "_CUPY", fake_cupy)
    builds = []

    def slow_build(problem, strict):
        builds.append(problem)
        time.sleep(0.05)  # long enough for every other thread to arrive while this one builds
        return object()

    monkeypatch.setattr(dispatcher, "_build", slow_build)
    problem = SGEMV.problem(m=4096, n=16)
    served = []
    threads = [threading.Thread(target=lambda: served.append(dispatcher.lookup(problem))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and len(served) == 8 and all(s is served[0] for s in served)


@pytest.mark.parametrize("path", pretuned.catalog_files(), ids=lambda p: p.name)
def test_shipped_catalog_holds_no_stale_kernel(path):
    # A template change that alters a shipped winner's source makes it stale: served only after
    # a validation on first use and marked stale by `autogen list`. Such a change must re-tune
    # the catalog's problems (scripts/catalog_from.py) in the same commit.
    from autogen.catalog.environment import winner_source_hash
    stale = [f"{w.trial.family} {w.trial.dtype} {w.trial.shape_key}" for w in pretuned.load_catalog(path)
             if winner_source_hash(get_family(w.trial.family), w) != w.trial.source_hash]
    assert not stale, f"{len(stale)} stale: {stale[:5]}"
