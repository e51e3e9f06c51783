"""scripts/ab_variants.py without a GPU: how it turns --base, --vary and --dims into variants and
problems (the GPU part is the Evaluator's validate and retime, tested with the tuner)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from autogen.core.registry import get_family

SCRIPT = Path(__file__).resolve().parent.parent.parent / "scripts" / "ab_variants.py"


def _script():
    if str(SCRIPT.parent) not in sys.path:  # the script imports benchlib from its folder
        sys.path.append(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("ab_variants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_base_is_crossed_with_every_varied_choice_and_invalid_ones_are_skipped(capsys):
    ab, hgemv = _script(), get_family("hgemv")
    base = {"threads_per_row": 256, "pack_width": 8, "warps_per_block": 8, "rows_per_group": 2}
    configs = ab.variants(hgemv, [base, {**base, "x_path": "smem"}],
                         [("load_schedule", ["chunk", "step"]), ("tail", ["checked", "peeled"])])
    names = [hgemv.kernel_name("float16", c) for c in configs]
    # x_path=smem has no tail=peeled: 4 + 2 variants, the two others skipped with the reason.
    assert len(names) == len(set(names)) == 6
    assert "hgemv_f16_tpr256_pw8_wpb8_rpg2_u2_xldg_rshfl_bt1_lsstep_tailpeeled" in names
    assert capsys.readouterr().out.count("tail=peeled needs x_path=ldg") == 2


def test_unvaried_parameters_come_from_the_base_then_the_default():
    ab, sgemv = _script(), get_family("sgemv")
    [config] = ab.variants(sgemv, [{"unroll": "4"}], [])
    assert config.as_dict() == {**sgemv.default_params, "unroll": 4}


def test_dims_are_parsed_as_integers_and_traits_as_words():
    ab = _script()
    assert ab.parse_dims("m=4096, n=11008,batch=1") == {"m": 4096, "n": 11008, "batch": 1}
    assert ab.parse_dims("n=1024,approximate=tanh") == {"n": 1024, "approximate": "tanh"}


def test_variants_are_named_with_the_problems_traits():
    # scan's accumulator type is a trait of the problem that changes the code: without it the
    # kernel cannot be named (the first scan A/B on a GPU stopped there).
    ab, scan = _script(), get_family("scan")
    problem = scan.problem("int32", n=1 << 24)
    configs = ab.variants(scan, [{}], [("min_blocks", ["1", "4"])])
    names = ab.named_variants(scan, problem, configs)
    assert len(names) == 2 and all(name == scan.kernel_name("int32", c, problem.traits) for name, c in names.items())
