"""autogen.kernel_family / tune_kernel's argument handling without a GPU: Kernel Tuner's
semantics (defines, default grid divisors, restrictions, answers), the checks' one-line errors,
validation by relative L2 and allclose on poisoned outputs, and the GPU worker's recipe."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from autogen.core.kernel_family import KernelFamily, kernel_family, recreate, save_data
from autogen.core.kernel_spec import grid_of, parse_argument_rule, tunable_space
from autogen.core.registry import get_family
from autogen.core.render import render
from autogen.errors import ArgumentError, FamilyError, NotTunedError, UsageError
from autogen.search.kernel_tune import _trials, tune_kernel

SOURCE = """__global__ void scale(float *y, const float *x, float a, int n)
{
    int i = blockIdx.x * block_size_x * work + threadIdx.x;
    for (int k = 0; k < work; k++) if (i + k * block_size_x < n) y[i + k * block_size_x] = a * x[i + k * block_size_x];
}
"""
N = 1000


def arguments(n=N):
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, dtype=np.float32)
    return [y, x, np.float32(2.0), np.int32(n)], [2 * x, None, None, None]


def family(**extra):
    args, answer = arguments()
    options = dict(grid_div_x=["block_size_x", "work"], answer=answer, name="kernel.scale_test")
    options.update(extra)
    return kernel_family("scale", SOURCE, N, args, {"block_size_x": [32, 64, 128], "work": [1, 2, 4]}, **options)


def test_parameters_are_defined_before_the_source_and_the_kernel_renamed():
    f = family()
    config = f.space.check({"block_size_x": 64, "work": 2})
    source = render(f, "float32", config)
    name = f.kernel_name("float32", config)
    assert name == "kernel_scale_test_f32_bsx64_w2"
    lines = source.splitlines()
    assert lines[:6] == ["#define block_size_x 64", "#define block_size_y 1", "#define block_size_z 1",
                         "#define work 2", "#define kernel_tuner 1", f"#define scale {name}"]
    assert 'extern "C" {' in source and "#undef work" in source and "#undef scale" in source
    assert f.c_params == "int size_x, float* y, const float* x, float a, int n"  # names from the signature
    assert f.outputs == ("y",) and f.dims == ("size_x",) and f.dtypes == ("float32",)


def test_grid_divides_the_problem_by_the_divisors_rounding_up():
    f = family()
    launch = f.launch(f.problem(size_x=N), f.space.check({"block_size_x": 128, "work": 4}))
    assert launch.grid == (2, 1, 1) and launch.block == (128, 1, 1)  # ceil(1000 / 512)
    # Kernel Tuner's default: block_size_x where it is tuned, 1 for y and z; a callable too.
    default = family(grid_div_x=None)
    assert default.launch(default.problem(size_x=N), default.space.check({"block_size_x": 32, "work": 1})).grid == (32, 1, 1)
    assert grid_of((10, 7), {"b": 4}, (lambda p: p["b"], (), ())) == (3, 7, 1)


def test_restrictions_as_strings_or_a_callable():
    space = tunable_space({"a": [1, 2, 4], "b": [1, 2, 4]}, ["a*b <= 4", "a >= b"])
    assert [(c["a"], c["b"]) for c in space.enumerate()] == [(1, 1), (2, 1), (2, 2), (4, 1)]
    by_callable = tunable_space({"a": [1, 2, 4], "b": [1, 2]}, lambda p: p["a"] == 2 * p["b"])
    assert [c.as_dict() for c in by_callable.enumerate()] == [{"a": 2, "b": 1}, {"a": 4, "b": 2}]


@pytest.mark.parametrize("call, message", [
    (lambda: tunable_space({"a": [1.5]}), "integers >= 0 and identifiers"),
    (lambda: tunable_space({}), "non-empty dict"),
    (lambda: tunable_space({"a": [1]}, ["a <"]), "not a Python expression"),
    (lambda: tunable_space({"a": [1]}, ["c > 1"]), "names c"),
    (lambda: family(grid_div_x=["nope"]), "names nope"),
    (lambda: family(answer=[None]), "answer has 1 entries for 4 arguments"),
    (lambda: kernel_family("scale", SOURCE, N, [np.zeros(3, np.float32), 2.0], {"b": [1]}), "NumPy scalars"),
    (lambda: kernel_family("scale", SOURCE, "n", arguments()[0], {"b": [1]}), "problem_size must be"),
    (lambda: kernel_family("scale", "no kernel here", N, arguments()[0], {"b": [1]}), "__global__"),
    (lambda: kernel_family("1x", SOURCE, N, arguments()[0], {"b": [1]}), "C identifier"),
    (lambda: family(restrictions=["block_size_x > 1000"]), "no configuration"),
    (lambda: parse_argument_rule("float32[size_q]", 1), "names size_q"),
    (lambda: parse_argument_rule("out:int32=3", 1), "a scalar cannot be an output"),
    (lambda: parse_argument_rule("float8[size_x]", 1), "is not DTYPE"),
    (lambda: family(compiler_options=["-arch=sm_80"]), "compiler option '-arch=sm_80' is not taken: autogen compiles"),
    (lambda: family(compiler_options=["-I/usr/include"]), "'-I/usr/include' is not taken"),
    (lambda: _trials("brute_force", {"popsize": 3}, 10), "max_fevals only"),
    (lambda: tune_kernel("scale", SOURCE, N, arguments()[0], {"b": [1]}, iterations=7, lang="cupy", foo=1),
     "does not take foo"),
    (lambda: tune_kernel("scale", SOURCE, N, arguments()[0], {"b": [1]}, strategy="pso"), "no autogen counterpart"),
])
def test_bad_input_is_one_line_naming_the_problem(call, message):
    with pytest.raises(UsageError) as caught:
        call()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_compiler_options_reach_the_family_and_its_worker_and_trials():
    f = family(compiler_options=["-DWIDTH=64", "-use_fast_math", "--maxrregcount=32"])
    assert f.compiler_options == ("-DWIDTH=64", "--use_fast_math", "--maxrregcount=32")
    assert "WIDTH" not in render(f, "float32", f.space.check({"block_size_x": 32, "work": 1}))  # an option, not source
    _module, _function, kwargs = pickle.loads(pickle.dumps(f.worker_recipe()))
    recreate(**kwargs)  # the GPU worker's family: the parent's options, from its definition
    assert get_family("kernel.scale_test").compiler_options == f.compiler_options
    assert _trials("brute_force", None, 44) == 44 and _trials("random_sample", None, 100) == 60
    assert _trials("bayes_opt", {"max_fevals": 5}, 100) == 5


def test_validation_poisons_outputs_and_judges_by_l2_and_allclose():
    f = family()
    problem = f.problem(size_x=N)
    inputs = f.make_inputs(problem, np, np.random.default_rng(0), {})
    assert np.isnan(inputs["y"]).all() and inputs["x"][5] == 5.0
    expected = f.reference(problem, inputs)
    assert f.compare(problem, inputs, expected, None)[1].startswith("y: 1000 of 1000")  # unwritten
    inputs["y"][:] = 2 * inputs["x"]
    assert f.compare(problem, inputs, expected, None) == (0.0, "")
    inputs["y"][3] += 0.01  # a relative L2 error well under 1e-5, but outside atol=1e-6: Kernel Tuner's rule holds too
    assert "atol" in f.compare(problem, inputs, expected, None)[1]
    loose = family(atol=0.1)
    assert loose.compare(problem, inputs, expected, None)[1] == ""
    with pytest.raises(NotTunedError, match="only at size_x=1000"):
        f.make_inputs(f.problem(size_x=7), np, np.random.default_rng(0), {})


def test_an_argument_rule_makes_inputs_for_any_size():
    f = kernel_family("scale", SOURCE, 64, "out:float32[size_x] float32[size_x] float32=1.5 int32=size_x",
                      {"block_size_x": [32]}, name="kernel.scale_rule")
    inputs = f.make_inputs(f.problem(size_x=37), np, np.random.default_rng(1), {})
    assert inputs["x"].shape == (37,) and np.isnan(inputs["y"]).all() and inputs["n"] == 37
    assert f.kernel_args(f.problem(size_x=37), inputs)[2] == np.float32(1.5)
    assert f.bytes_moved(f.problem(size_x=37)) == 2 * 37 * 4
    inputs["y"][:] = 0
    assert f.compare(f.problem(size_x=37), inputs, f.reference(f.problem(size_x=37), inputs), None) == (0.0, "")


def test_the_worker_recreates_the_family_with_its_data(tmp_path):
    f = family(restrictions=lambda p: p["work"] < 4)  # a lambda: the worker gets the points checked here
    save_data(f, tmp_path / "data.npz")
    module, function, kwargs = pickle.loads(pickle.dumps(f.worker_recipe()))
    assert kwargs["definition"].restrictions is None
    recreate(**kwargs)
    again = get_family("kernel.scale_test")
    assert again is not f and isinstance(again, KernelFamily) and again.data_sizes == (N,)
    inputs = again.make_inputs(again.problem(size_x=N), np, np.random.default_rng(0), {})
    assert inputs["x"][7] == 7.0 and again.reference(again.problem(size_x=N), inputs)["y"][7] == 14.0


def test_bind_takes_the_arguments_in_kernel_order_and_the_problem_size():
    f = family()
    with pytest.raises(ArgumentError, match="problem_size="):
        f.bind(None, 0, (), {})
    with pytest.raises(ArgumentError, match="takes 4 arguments"):
        f.bind(None, 0, (1, 2), {"problem_size": N})


def test_a_jinja_source_renders_its_parameters():
    source = "__global__ void k(float *y) { y[threadIdx.x] = {{ value }}; }"
    f = kernel_family("k", source, 32, [np.zeros(32, np.float32)], {"value": [1, 2]}, answer=[np.ones(32)],
                      jinja=True, name="kernel.jinja_test")
    assert "y[threadIdx.x] = 2;" in render(f, "float32", f.space.check({"value": 2}))
    broken = kernel_family("k", source.replace("value", "missing"), 32, [np.zeros(32, np.float32)], {"value": [1]},
                           jinja=True, name="kernel.jinja_broken")
    with pytest.raises(FamilyError, match="Jinja2"):
        render(broken, "float32", broken.space.check({"value": 1}))
