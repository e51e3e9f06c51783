"""autogen.catalog.source_memo: the stale check's source hash, remembered under a fingerprint of the
rendering code and templates, is the hash of what render() gives, and any edit renders again."""

from __future__ import annotations

import json
import os

import pytest

from autogen.core import render as render_module
from autogen.catalog import source_memo
from autogen.core.registry import get_family

SGEMV = get_family("sgemv")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def config(**changes):
    return SGEMV.space.check({**SGEMV.default_params, **changes})


def rendered_hash(cfg) -> str:
    return render_module.source_hash(render_module.render(SGEMV, "float32", cfg))


def test_the_remembered_hash_is_the_rendered_sources(monkeypatch):
    cfgs = [config(unroll=1), config(unroll=4), config(vector_width=1)]
    first = [source_memo.rendered_source_hash(SGEMV, "float32", cfg, ()) for cfg in cfgs]
    assert first == [rendered_hash(cfg) for cfg in cfgs] and len(set(first)) == 3

    def no_rendering(*args, **kwargs):
        raise AssertionError("rendered although remembered")

    monkeypatch.setattr(render_module, "render", no_rendering)
    assert [source_memo.rendered_source_hash(SGEMV, "float32", cfg, ()) for cfg in cfgs] == first


def test_another_fingerprint_renders_again(monkeypatch):
    cfg = config()
    expected = rendered_hash(cfg)
    source_memo.rendered_source_hash(SGEMV, "float32", cfg, ())
    calls = []
    real = render_module.render
    monkeypatch.setattr(render_module, "render", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(source_memo, "rendering_fingerprint", lambda module, folders: "edited templates")
    assert source_memo.rendered_source_hash(SGEMV, "float32", cfg, ()) == expected
    assert len(calls) == 1


def test_an_edited_template_changes_the_fingerprint(tmp_path):
    folder = tmp_path / "templates"
    folder.mkdir()
    template = folder / "mine.cu.j2"
    template.write_text("// {{ kernel_name }}\n")
    before = source_memo.rendering_fingerprint("no.such.module", (str(folder),))
    assert source_memo.rendering_fingerprint("no.such.module", (str(folder),)) == before
    template.write_text("// {{ kernel_name }} edited\n")
    os.utime(template, ns=(1, 1))  # even an edit that keeps the size and sets an old time shows
    assert source_memo.rendering_fingerprint("no.such.module", (str(folder),)) != before


def test_the_memo_keeps_a_few_fingerprints_and_survives_damage(monkeypatch):
    cfg = config()
    for number in range(source_memo.KEPT_FINGERPRINTS + 3):
        monkeypatch.setattr(source_memo, "rendering_fingerprint", lambda module, folders, n=number: f"fp{n}")
        source_memo.rendered_source_hash(SGEMV, "float32", cfg, ())
    kept = json.loads(source_memo._memo_path().read_text())["by_fingerprint"]
    assert list(kept) == [f"fp{n}" for n in range(3, source_memo.KEPT_FINGERPRINTS + 3)]
    source_memo._memo_path().write_text("{damaged")
    assert source_memo.rendered_source_hash(SGEMV, "float32", cfg, ()) == rendered_hash(cfg)


def test_an_edited_kernel_source_renders_again():
    # A family made from source text (tune_kernel's) keeps its name when its .cu is edited: the
    # memo must not answer with the old text's hash.
    import numpy as np

    from autogen.core.kernel_family import kernel_family

    text = "__global__ void twice(float *y, int n) { int i = blockIdx.x * block_size_x + threadIdx.x; if (i < n) y[i] *= 2; }\n"

    def family(source):
        return kernel_family("twice", source, 64, [np.zeros(64, np.float32), np.int32(64)],
                             {"block_size_x": [32, 64]}, name="kernel.memo_edit_test")

    first = family(text)
    cfg = first.space.check({"block_size_x": 32})
    before = source_memo.rendered_source_hash(first, "float32", cfg, ())
    edited = family(text.replace("*= 2", "*= 3"))
    after = source_memo.rendered_source_hash(edited, "float32", cfg, ())
    assert after != before
    assert after == render_module.source_hash(render_module.render(edited, "float32", cfg), edited.compiler_options)
