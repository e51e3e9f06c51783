"""transpose and concat on the CPU: spaces and constraints, exact references and checks (poison
caught), random splits, nvcc compile of a small sample for sm_90, CLI help and bad input."""

import subprocess
import sys

import numpy as np
import pytest

from autogen.core.registry import get_family
from autogen.core.render import render
from autogen.core.signature import functional_schema, out_schema
from autogen.errors import UsageError

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0] + "/tests/support")
from nvcc_tools import extreme_configs, nvcc_compile  # noqa: E402

TRANSPOSE, CONCAT = get_family("transpose"), get_family("concat")


def test_every_config_keeps_whole_packs_and_a_block_of_64_to_1024_threads():
    for config in TRANSPOSE.space.enumerate():
        threads = config["tile"] ** 2 // config["elements_per_thread"]
        assert 64 <= threads <= 1024 and config["elements_per_thread"] % config["vector_width"] == 0
    assert all(c["elements_per_thread"] % c["vector_width"] == 0 for c in CONCAT.space.enumerate())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_transpose_reference_is_exact_and_poison_fails(dtype):
    problem = TRANSPOSE.problem(dtype, rows=7, cols=33)
    for case in TRANSPOSE.validation_cases(problem):
        inputs = TRANSPOSE.make_inputs(problem, np, np.random.default_rng(0), case)
        expected = TRANSPOSE.reference(problem, inputs)
        assert TRANSPOSE.compare(problem, inputs, expected, None)[0] == np.inf  # all poison
        inputs["y"][...] = inputs["x"].T
        assert TRANSPOSE.compare(problem, inputs, expected, None) == (0.0, "")
        inputs["y"][3, 5] = inputs["y"][3, 6]
        assert "1 of 231 elements differ" in TRANSPOSE.compare(problem, inputs, expected, None)[1]


@pytest.mark.parametrize("axis", ["0", "1"])
def test_concat_splits_cover_the_axis_and_the_reference_joins_them(axis):
    problem = CONCAT.problem("bfloat16", k=9, rows=19, cols=23, axis=axis)
    for case in CONCAT.validation_cases(problem):
        inputs = CONCAT.make_inputs(problem, np, np.random.default_rng(1), case)
        pieces = [inputs[f"x{s}"] for s in range(9)]
        assert all(p.shape[int(axis)] >= 1 for p in pieces)
        expected = CONCAT.reference(problem, inputs)
        inputs["y"][...] = np.concatenate(pieces, axis=int(axis))
        assert CONCAT.compare(problem, inputs, expected, None) == (0.0, "")
    assert len(CONCAT.plan(problem, CONCAT.default_config())) == 1  # 9 inputs: one launch of 16 slots
    more = CONCAT.problem("bfloat16", k=17, rows=40, cols=33, axis=axis)
    assert len(CONCAT.plan(more, CONCAT.default_config())) == 2


def test_concat_row_walk_grid_covers_every_chunk_of_y_rows():
    config = CONCAT.space.check({"vector_width": 8, "elements_per_thread": 16, "block_size": 128, "walk": "rows"})
    (step,) = CONCAT.plan(CONCAT.problem("float16", k=9, rows=2047, cols=3001, axis="1"), config)
    assert step.launch.grid == (2047 * 2, 1, 1)  # 2048 elements a block: two chunks a row
    (step,) = CONCAT.plan(CONCAT.problem("float16", k=9, rows=2047, cols=3001, axis="0"), config)
    assert step.launch.grid == (-(-2047 * 3001 // 2048), 1, 1)  # one row of rows * cols
    # Packs need no aligned rows on this walk; the element walk refuses them.
    odd = CONCAT.problem("float16", k=3, rows=7, cols=3001, axis="0")
    assert CONCAT.reject_reason(odd, config) is None
    assert "does not divide" in CONCAT.reject_reason(odd, CONCAT.space.check({**config.as_dict(), "walk": "elements"}))



def test_concat_input_walk_grid_is_one_input_of_the_even_split_by_the_inputs():
    config = CONCAT.space.check({"vector_width": 8, "elements_per_thread": 16, "block_size": 128, "walk": "inputs"})
    k9 = CONCAT.problem("float16", k=9, rows=2047, cols=3001, axis="1")
    (step,) = CONCAT.plan(k9, config)
    assert step.launch.grid == (-(-2047 * 334 // 2048), 9, 1)  # the widest input, 334 columns
    two = CONCAT.plan(CONCAT.problem("float32", k=17, rows=40, cols=33, axis="0"), config)
    assert [s.launch.grid for s in two] == [(1, 16, 1), (1, 1, 1)]  # 3 rows of 33 an input: one chunk
    # A seed where the inputs are narrow along axis 1, not along axis 0.
    assert CONCAT.seed_configs(k9)[0] == config
    assert all(c["walk"] != "inputs" for c in CONCAT.seed_configs(CONCAT.problem("float16", k=9, rows=2047, cols=3001, axis="0")))
    # Its stage is static shared memory: 48 KiB at most, in every dtype.
    assert "stages 65536 bytes" in CONCAT.space.violations({**config.as_dict(), "elements_per_thread": 32, "block_size": 512})[0]

def test_bad_problems_are_refused():
    with pytest.raises(UsageError, match="at least one row"):
        CONCAT.problem("float32", k=5, rows=3, cols=8, axis="0")
    with pytest.raises(UsageError, match="axis must be one of"):
        CONCAT.problem("float32", k=1, rows=3, cols=8, axis="2")


def test_op_schemas_take_a_tensor_list():
    assert functional_schema(CONCAT.op_signature) == "(Tensor[] arrays, int axis=0) -> Tensor"
    assert out_schema(CONCAT.op_signature) == "(Tensor[] arrays, int axis=0, *, Tensor(a!) out) -> ()"
    assert functional_schema(TRANSPOSE.op_signature) == "(Tensor x) -> Tensor"


def test_a_sample_of_variants_compiles_for_sm_90(tmp_path):
    sources = [render(TRANSPOSE, "float16", c, host_launcher=True) for c in extreme_configs(TRANSPOSE)[:4]]
    sources += [render(CONCAT, "float32", c, host_launcher=True, traits=(("axis", "1"),))
                for c in extreme_configs(CONCAT)[:3]]
    report = nvcc_compile(["#include <cuda_runtime.h>", *sources], "sm_90", tmp_path)
    assert "bytes spill" not in report.replace(" 0 bytes spill", "")


@pytest.mark.parametrize("family", ["transpose", "concat"])
def test_cli_help_and_bad_input(family):
    done = subprocess.run([sys.executable, "-m", "autogen", "tune", family, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--rows" in done.stdout and "--cols" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "autogen", "tune", family, "--rows", "0", "--cols", "5"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
