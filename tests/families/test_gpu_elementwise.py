"""gelu and bias_mask_scale_add on a real GPU: every variant of each space validates (both GELU
forms, every dtype) on tail shapes and on misaligned views; validation catches broken kernels;
the peers run correctly inside graph capture; autogen.gelu / autogen.bias_mask_scale_add with
CuPy and torch operands; the exported self-test builds and passes."""

from __future__ import annotations

import secrets
import shutil
import subprocess

import pytest

from autogen.gpu.compile import compile_many
from autogen.core.registry import get_family
from autogen.core.render import render

pytestmark = pytest.mark.gpu

DTYPES = ["float32", "float16", "bfloat16"]
GELU_SIZES = [1, 7, 4099]
BMSA_SHAPES = [(1, 1), (12, 6), (1000, 8), (4104, 4104)]
LARGE = {"gelu": {"n": 2**20 + 3}, "bias_mask_scale_add": {"n": 2**20 + 4096, "bias_size": 4096}}


@pytest.fixture(scope="module")
def all_cubins():
    """{(family, dtype): {kernel name: (config, cubin or CompileError)}}, compiled in one pool."""
    from autogen.gpu.device import device_identity

    configs, sources = {}, {}
    for family_name in ("gelu", "bias_mask_scale_add"):
        family = get_family(family_name)
        for dtype in DTYPES:
            for config in family.space.enumerate():
                if dtype == "float32" and config["math"] == "half2":
                    continue  # renders the math=float code (tests/families/test_gelu_family.py)
                name = family.kernel_name(dtype, config)
                configs.setdefault((family_name, dtype), {})[name] = config
                sources[name] = render(family, dtype, config)
    cubins = compile_many(sources, device_identity().arch)
    return {key: {name: (config, cubins[name]) for name, config in named.items()} for key, named in configs.items()}


def _rng():
    import cupy
    return cupy.random.default_rng(secrets.randbits(63))


def test_every_variant_compiles_with_nvrtc(all_cubins):
    for (family_name, dtype), variants in all_cubins.items():
        failures = {name: str(cubin)[:300] for name, (_, cubin) in variants.items() if not isinstance(cubin, bytes)}
        assert not failures, f"{family_name} {dtype}: {len(failures)} failed, e.g. {next(iter(failures.items()))}"


def _validate(all_cubins, family_name, dtype, dims, every=1, where=lambda config: True):
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family(family_name)
    evaluator = Evaluator(WorkSpec(family_name, dtype, tuple(dims.items()), family.module))
    failures, worst = [], 0.0
    chosen = [(name, config, cubin) for name, (config, cubin) in all_cubins[(family_name, dtype)].items() if where(config)]
    assert chosen
    for name, config, cubin in chosen[::every]:
        check = evaluator.check(name, cubin, config.as_dict())
        if not check.ok:
            failures.append(f"{name}: {check.reason}")
        else:
            worst = max(worst, check.error)
    assert not failures, f"{len(failures)} {family_name} {dtype} variants failed on {dims}:\n" + "\n".join(failures[:20])
    assert worst <= family.tolerance_for(evaluator.problem)
    return worst


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", GELU_SIZES)
def test_every_gelu_variant_validates(all_cubins, dtype, n, approximate):
    _validate(all_cubins, "gelu", dtype, {"n": n, "approximate": approximate})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, bias_size", BMSA_SHAPES)
def test_every_bias_mask_scale_add_variant_validates(all_cubins, dtype, n, bias_size):
    _validate(all_cubins, "bias_mask_scale_add", dtype, {"n": n, "bias_size": bias_size})


@pytest.mark.parametrize("family_name", ["gelu", "bias_mask_scale_add"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_sample_validates_at_a_million_elements(all_cubins, family_name, dtype):
    # Every 5th variant: the grid-stride loop strides for real at this size.
    for approximate in (("tanh", "none") if family_name == "gelu" else (None,)):
        dims = dict(LARGE[family_name], **({"approximate": approximate} if approximate else {}))
        _validate(all_cubins, family_name, dtype, dims, every=5)


# loop=bulk over many chunks: 2^24 elements are several chunks per block of the persistent grid
# (each block's stages wrap around more than once with the smaller chunks), plus a tail that the
# bulk path leaves to its Work<1> loop; the aligned cases take the bulk path, the offset one the
# sweep. One GELU form: the pipeline does not depend on it.
BULK_DIMS = {"gelu": {"n": 2**24 + 5, "approximate": "tanh"},
             "bias_mask_scale_add": {"n": 2**24 + 24, "bias_size": 8}}


@pytest.mark.parametrize("family_name", ["gelu", "bias_mask_scale_add"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_bulk_variant_validates_over_many_chunks(all_cubins, family_name, dtype):
    _validate(all_cubins, family_name, dtype, BULK_DIMS[family_name], where=lambda config: config["loop"] == "bulk")


def _broken_check(family_name, dtype, dims, params, old, new):
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family(family_name)
    config = family.space.check({**family.default_params, **params})
    name = family.kernel_name(dtype, config)
    source = render(family, dtype, config)
    broken = source.replace(old, new)
    assert broken != source
    evaluator = Evaluator(WorkSpec(family_name, dtype, tuple(dims.items()), family.module))
    arch = device_identity().arch
    assert evaluator.check(name, compile_cubin(source, arch), config.as_dict()).ok
    return evaluator.check(name, compile_cubin(broken, arch), config.as_dict())


def test_validation_catches_a_dropped_tail_element():
    check = _broken_check("gelu", "float32", {"n": 4099, "approximate": "tanh"}, {"vector_width": 4},
                          "if (element < n) {", "if (element < n - 1) {")
    assert not check.ok and "NaN" in check.reason


def test_validation_catches_the_wrong_form_in_fp32():
    check = _broken_check("gelu", "float32", {"n": 4099, "approximate": "none"}, {},
                          "if (approximate) {", "if (!approximate) {")
    assert not check.ok and "relative L2 error" in check.reason


def test_validation_catches_a_wrong_bias_index():
    check = _broken_check("bias_mask_scale_add", "float16", {"n": 8192, "bias_size": 64}, {},
                          "(unsigned int)(first + a.offset) % a.bias_size", "(unsigned int)(first + a.offset + P) % a.bias_size")
    assert not check.ok


def test_validation_catches_a_bulk_chunk_without_its_offset():
    # Chunks of 2048 elements against a bias period of 3072: a chunk that forgets where it starts
    # reads the wrong bias (the elementwise bulk pipeline's one index-dependent input).
    check = _broken_check("bias_mask_scale_add", "float32", {"n": 12288, "bias_size": 3072},
                          {"loop": "bulk", "cache": "ldg", "vector_width": 4, "elements_per_thread": 8, "block_size": 256},
                          "s.offset = first;", "s.offset = 0;")
    assert not check.ok and "relative L2 error" in check.reason


def _replayed_peer_error(family, problem):
    import cupy

    from autogen.core.compare import relative_error
    from autogen.gpu.measure import time_enqueue

    peer = family.peer(problem)
    if peer is None:
        pytest.skip("PyTorch with CUDA is not importable here")
    inputs = family.make_inputs(problem, cupy, _rng(), family.timing_case(problem))
    expected = family.reference(problem, inputs, cupy)
    magnitude = family.reference_magnitude(problem, inputs, cupy)
    timing = time_enqueue(cupy, lambda _i: peer.run(inputs), 1, replays=3)
    assert timing.median_us > 0
    return relative_error(cupy, family.output_values(problem, inputs, "y", cupy), expected, magnitude)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_peer_is_correct_inside_graph_capture(dtype, approximate):
    family = get_family("gelu")
    problem = family.problem(dtype, n=2**20 + 3, approximate=approximate)
    error, reason = _replayed_peer_error(family, problem)
    assert not reason and error <= family.tolerance_for(problem)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_mask_scale_add_peer_is_correct_inside_graph_capture(dtype):
    family = get_family("bias_mask_scale_add")
    problem = family.problem(dtype, n=2**20, bias_size=4096)
    error, reason = _replayed_peer_error(family, problem)
    assert not reason and error <= family.tolerance_for(problem)


# -- the Python calls ---------------------------------------------------------------------------------


def test_autogen_gelu_with_cupy_and_torch():
    import cupy

    import autogen
    from autogen.errors import UsageError
    from autogen.families.gelu import gelu_reference

    x = (cupy.random.random((3, 1001), dtype=cupy.float32) - 0.5) * 8
    for approximate in ("tanh", "none"):
        y = autogen.gelu(x, approximate=approximate)
        assert y.shape == x.shape and y.dtype == x.dtype
        want = gelu_reference(cupy, x.astype(cupy.float64), approximate)
        assert float(cupy.linalg.norm(y - want) / cupy.linalg.norm(want)) < 1e-5
    # Rows 1 and 2 start 4004 bytes in, off every vector alignment: the scalar path.
    out = cupy.full_like(x[1:], cupy.nan)
    assert autogen.gelu(x[1:], out=out) is out
    want = gelu_reference(cupy, x[1:].astype(cupy.float64), "tanh")
    assert float(cupy.linalg.norm(out - want) / cupy.linalg.norm(want)) < 1e-5
    with pytest.raises(UsageError):
        autogen.gelu(x, approximate="erf")
    try:
        import torch
    except ImportError:
        pytest.skip("no PyTorch")
    for dtype, tolerance in ((torch.float16, 1e-3), (torch.bfloat16, 5e-3)):
        t = torch.randn(4, 4097, device="cuda", dtype=dtype) * 3
        for approximate in ("tanh", "none"):
            got = autogen.gelu(t, approximate=approximate)
            assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == t.shape
            want = torch.nn.functional.gelu(t.double(), approximate=approximate)
            assert float((got.double() - want).norm() / want.norm()) < tolerance


def test_autogen_bias_mask_scale_add_with_cupy_and_torch():
    import cupy

    import autogen

    x = cupy.random.random((64, 256), dtype=cupy.float32) - 0.5
    bias = cupy.random.random(256, dtype=cupy.float32) - 0.5
    mask = cupy.random.random((64, 256)) < 0.9
    addend = cupy.random.random((64, 256), dtype=cupy.float32)
    y = autogen.bias_mask_scale_add(x, bias, mask, 1 / 0.9, addend)  # a bool mask is taken as bytes
    want = (x.astype(cupy.float64) + bias) * cupy.where(mask, float(cupy.float32(1 / 0.9)), 0.0) + addend
    assert y.shape == x.shape and float(cupy.abs(y - want).max()) < 1e-5
    with pytest.raises(Exception, match="does not divide"):
        autogen.bias_mask_scale_add(x, bias[:255], mask, 2.0, addend)
    try:
        import torch
    except ImportError:
        pytest.skip("no PyTorch")
    for dtype, tolerance in ((torch.float16, 1e-3), (torch.bfloat16, 5e-3)):
        tx = torch.randn(128, 4096, device="cuda", dtype=dtype)
        tb = torch.randn(4096, device="cuda", dtype=dtype)
        tm = (torch.rand(128, 4096, device="cuda") < 0.9).to(torch.uint8)
        ta = torch.randn(128, 4096, device="cuda", dtype=dtype)
        got = autogen.bias_mask_scale_add(tx, tb, tm, 1.25, ta)
        want = (tx.double() + tb.double()) * tm.double() * 1.25 + ta.double()
        magnitude = (tx.double() + tb.double()).abs() * tm.double() * 1.25 + ta.double().abs()
        assert got.dtype == dtype and float((got.double() - want).norm() / magnitude.norm()) < tolerance


# -- export ---------------------------------------------------------------------------------------------


def _export_selftest(tmp_path, db_url, family_name, problems):
    from autogen.cli.main import main
    from autogen.search.tuner import TuneOptions, tune

    if shutil.which("nvcc") is None or shutil.which("make") is None:
        pytest.skip("needs nvcc and make on PATH")
    family = get_family(family_name)
    for dtype, dims in problems:
        result = tune(family.problem(dtype, **dims), TuneOptions(trials=4, db_url=db_url, workers=8))
        assert result.winner is not None
    out = tmp_path / "export"
    code = main(["export", family_name, "--out", str(out), "--db", db_url, "--self-test"])
    return out, code


def test_exported_bias_mask_scale_add_selftest_passes(tmp_path, db_url):
    out, code = _export_selftest(tmp_path, db_url, "bias_mask_scale_add",
                                 [("float16", {"n": 2**20, "bias_size": 4096}), ("bfloat16", {"n": 4096, "bias_size": 64}),
                                  ("float32", {"n": 2**16, "bias_size": 1024})])
    assert code == 0
    build = subprocess.run(["make", "-C", str(out), "selftest"], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    done = subprocess.run([str(out / "autogen_bias_mask_scale_add_selftest")], capture_output=True, text=True, timeout=600)
    print(done.stdout[-4000:])
    assert done.returncode == 0 and "autogen self-test: PASS" in done.stdout


def test_exported_gelu_selftest_passes(tmp_path, db_url):
    out, code = _export_selftest(tmp_path, db_url, "gelu", [("float16", {"n": 2**20, "approximate": "tanh"}),
                                                           ("float32", {"n": 4099, "approximate": "none"})])
    assert code == 0
    build = subprocess.run(["make", "-C", str(out), "selftest"], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    done = subprocess.run([str(out / "autogen_gelu_selftest")], capture_output=True, text=True, timeout=600)
    print(done.stdout[-4000:])
    assert done.returncode == 0 and "autogen self-test: PASS" in done.stdout
