"""hgemv on a real GPU: a sample of variants holding every choice of every parameter validates on
tail shapes (every batch tile against every batch kind) and on misaligned operands, for fp16 and
bf16; the validation catches a kernel that accumulates in half precision; autogen.hgemv with CuPy
and torch operands; the torch peer inside graph capture; a short tune and the exported self-test."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from autogen.gpu.compile import compile_many
from autogen.core.registry import get_family
from autogen.core.render import render

pytestmark = pytest.mark.gpu

FAMILY = get_family("hgemv")
DTYPES = ("float16", "bfloat16")
# (m, n, batch): tails on every edge, n not a multiple of any pack, batches below, at and above
# each tile (9: two launches of 8), rows not a multiple of rows per block.
# 67 x 2048: whole chunks only (tail=peeled's unchecked loop alone), rows past m in the last block.
# 300 x 1003 and 130 x 4099: rows at every offset from a 16-byte boundary (row_align=peeled's
# windows of blocks, one per offset, the last window part past m). 70 x 2567 x 6: an odd number
# of 256- and 512-column chunks and a part one (a_buffers=2 ends its two-chunk loop halfway).
SHAPES = [(1, 1, 1), (3, 5, 3), (1000, 37, 4), (37, 1000, 8), (513, 4104, 1), (130, 4104, 2), (5, 16, 9),
          (67, 2048, 1), (300, 1003, 3), (130, 4099, 1), (130, 4099, 8), (70, 2567, 6)]
SAMPLE = 40  # random variants per dtype on top of those covering every choice


def sample_configs() -> list:
    """The default, a config for every choice of every parameter, and a random sample."""
    configs = list(FAMILY.space.enumerate())
    chosen = {FAMILY.default_config()}
    for param in FAMILY.space.params:
        for choice in param.choices:
            chosen.add(next(c for c in configs if c[param.name] == choice))
    chosen.update(random.Random(7).sample(configs, SAMPLE))
    # The defaults per shape (batch 1 on long rows: unroll=4; batches: tensor cores), and tensor-core
    # variants of every geometry (split columns over 1 to 8 warps, 1 or 2 tiles, unroll) and tile.
    for dims in ({"m": 64, "n": 4096, "batch": 1}, {"m": 64, "n": 64, "batch": 4}):
        chosen.add(FAMILY.default_config(FAMILY.problem(**dims)))
    # The batch-1 seeds of short and long rows, and their tail=peeled twins.
    for n in (4096, 14336):
        chosen.update(FAMILY.seed_configs(FAMILY.problem(m=64, n=n, batch=1)))
    # Rows off the 16-byte boundary: the defaults (rows in flight at batches 1-2) and seeds with
    # row_align=peeled (rows in flight at 3 and 4 too).
    for batch in (1, 2, 3, 4, 8):
        chosen.update(FAMILY.seed_configs(FAMILY.problem(m=64, n=4099, batch=batch)))
    mma = [c for c in configs if c["x_path"] == "mma"]
    for key in {(c["threads_per_row"], c["rows_per_group"], c["unroll"]) for c in mma}:
        chosen.add(next(c for c in mma if (c["threads_per_row"], c["rows_per_group"], c["unroll"]) == key))
    chosen.update(random.Random(8).sample(mma, 8))
    # The column split (clusters of split_k blocks): every split of every one-group geometry, rows
    # on and off the 16-byte boundary.
    split = [c for c in mma if c["split_k"] > 1]
    for key in {(c["split_k"], c["row_align"], c["threads_per_row"]) for c in split}:
        chosen.add(next(c for c in split if (c["split_k"], c["row_align"], c["threads_per_row"]) == key))
    # A double-buffered in registers (a_buffers=2) and the register bound (min_blocks): each with
    # every unroll, rows on and off the boundary, split or not, and every batch tile.
    new = [c for c in mma if c["a_buffers"] == 2 or c["min_blocks"] > 1]
    for key in {(c["a_buffers"], c["min_blocks"], c["unroll"], c["row_align"], c["split_k"] > 1) for c in new}:
        chosen.add(next(c for c in random.Random(9).sample(new, len(new))
                        if (c["a_buffers"], c["min_blocks"], c["unroll"], c["row_align"], c["split_k"] > 1) == key))
    for tile in (1, 2, 4, 8):
        chosen.add(next(c for c in new if c["batch_tile"] == tile and c["a_buffers"] == 2))
    # load_schedule=early (A requested before x is staged): rows on and off the boundary, every tile.
    early = random.Random(10).sample([c for c in configs if c["load_schedule"] == "early"], 400)
    for key in {(c["row_align"], c["batch_tile"]) for c in early}:
        chosen.add(next(c for c in early if (c["row_align"], c["batch_tile"]) == key))
    # row_align=peeled through the read-only path (rows in flight): every batch tile with every
    # warps-a-row, every pack width, every unroll and every rows-a-group.
    flight = random.Random(11).sample([c for c in configs if c["row_align"] == "peeled" and c["x_path"] == "ldg"], 400)
    for other in ("threads_per_row", "pack_width", "unroll", "rows_per_group"):
        for key in {(c["batch_tile"], c[other]) for c in flight}:
            chosen.add(next(c for c in flight if (c["batch_tile"], c[other]) == key))
    # ... and those bounded to 64 registers (min_blocks=4): every batch tile with every pack width.
    bounded = [c for c in configs if c["min_blocks"] == 4]
    for key in {(c["batch_tile"], c["pack_width"]) for c in bounded}:
        chosen.add(next(c for c in bounded if (c["batch_tile"], c["pack_width"]) == key))
    return sorted(chosen, key=lambda c: FAMILY.kernel_name("float16", c))


@pytest.fixture(scope="module")
def cubins():
    from autogen.gpu.device import device_identity

    sources = {(dtype, c): render(FAMILY, dtype, c) for dtype in DTYPES for c in sample_configs()}
    names = {FAMILY.kernel_name(dtype, c): (dtype, c) for dtype, c in sources}
    built = compile_many({FAMILY.kernel_name(d, c): s for (d, c), s in sources.items()}, device_identity().arch)
    return {names[name]: cubin for name, cubin in built.items()}


def _rng():
    import secrets

    import cupy
    return cupy.random.default_rng(secrets.randbits(63))


def test_sample_compiles_with_nvrtc(cubins):
    failures = {f"{d} {c}": str(b) for (d, c), b in cubins.items() if not isinstance(b, bytes)}
    assert not failures


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,batch", SHAPES)
def test_sampled_variants_validate(cubins, dtype, m, n, batch):
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    evaluator = Evaluator(WorkSpec.of(FAMILY.problem(dtype, m=m, n=n, batch=batch)))
    failures = []
    for (d, config), cubin in cubins.items():
        if d != dtype:
            continue
        check = evaluator.check(FAMILY.kernel_name(dtype, config), cubin, config.as_dict())
        if not check.ok:
            failures.append(f"{FAMILY.kernel_name(dtype, config)}: {check.reason}")
    assert not failures, f"{len(failures)} variants failed on {m}x{n}x{batch}:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 4])
def test_misaligned_operands_take_the_scalar_paths(cubins, dtype, batch):
    """A, x and y one element past an aligned address (views into larger buffers): every
    variant must fall back to element accesses and still be right (batch 1: tail=peeled's
    unchecked loop must not run either)."""
    import cupy

    from autogen.gpu.measure import validate

    problem = FAMILY.problem(dtype, m=67, n=264, batch=batch)
    failures = []
    for (d, config), cubin in cubins.items():
        if d != dtype:
            continue
        module = cupy.cuda.function.Module()
        module.load(cubin)
        function = module.get_function(FAMILY.kernel_name(dtype, config))
        steps = FAMILY.plan(problem, config)

        def launch(inputs, function=function, steps=steps):
            shifted = dict(inputs)
            for key in ("A", "x", "y"):
                flat = cupy.empty(inputs[key].size + 1, dtype=inputs[key].dtype)
                flat[1:] = inputs[key].ravel()
                shifted[key] = flat[1:].reshape(inputs[key].shape)
            for step in steps:
                function(step.launch.grid, step.launch.block, step.args(shifted))
            inputs["y"][...] = shifted["y"]

        check = validate(FAMILY, problem, launch, cupy, _rng())
        if not check.ok:
            failures.append(f"{FAMILY.kernel_name(dtype, config)}: {check.reason}")
    assert not failures, "\n".join(failures[:20])


def test_validation_catches_half_precision_accumulation():
    """The same kernel summing in fp16 (each product and partial sum rounded to half) fails
    validation, and the large case alone catches it with inf."""
    import cupy

    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    config = FAMILY.default_config()
    name = FAMILY.kernel_name("float16", config)
    source = render(FAMILY, "float16", config)
    fma = "acc[r][j] = fmaf(a, xf[k * BT + j], acc[r][j]);"
    assert source.count(fma) == 1
    broken = source.replace(fma, "acc[r][j] = to_float(from_float(acc[r][j] + to_float(from_float(a * xf[k * BT + j]))));")
    cubin = compile_cubin(broken, device_identity().arch)
    problem = FAMILY.problem("float16", m=256, n=4096)
    assert not Evaluator(WorkSpec.of(problem)).check(name, cubin, config.as_dict()).ok
    module = cupy.cuda.function.Module()
    module.load(cubin)
    function = module.get_function(name)
    large = FAMILY.validation_cases(problem)[2]
    assert large["values"] == "large"
    inputs = FAMILY.make_inputs(problem, cupy, _rng(), large)
    expected = FAMILY.reference(problem, inputs, cupy)
    for step in FAMILY.plan(problem, config):
        function(step.launch.grid, step.launch.block, step.args(inputs))
    error, reason = FAMILY.compare(problem, inputs, expected, FAMILY.reference_magnitude(problem, inputs, cupy), cupy)
    assert "NaN/inf" in reason


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 4])
def test_torch_peer_is_right_inside_graph_capture(dtype, batch):
    import cupy

    from autogen.gpu.measure import time_enqueue

    problem = FAMILY.problem(dtype, m=1000, n=4104, batch=batch)
    peer = FAMILY.peer(problem)
    if peer is None:
        pytest.skip("PyTorch with CUDA is not importable here: hgemv has no peer")
    case = FAMILY.timing_case(problem)
    inputs = FAMILY.make_inputs(problem, cupy, _rng(), case)
    expected = FAMILY.reference(problem, inputs, cupy)
    assert time_enqueue(cupy, lambda _i: peer.run(inputs), 1, replays=3).median_us > 0
    error, reason = FAMILY.compare(problem, inputs, expected, FAMILY.reference_magnitude(problem, inputs, cupy), cupy)
    assert not reason and error <= FAMILY.tolerance_for(problem)


@pytest.fixture
def dispatcher(db_url, monkeypatch):
    from autogen.runtime import dispatch
    from autogen.runtime.dispatch import Dispatcher

    monkeypatch.setenv("AUTOGEN_NO_PRETUNED", "1")
    served = Dispatcher(db_url)
    monkeypatch.setattr(dispatch, "_default_dispatcher", served)
    return served


@pytest.mark.parametrize("dtype", DTYPES)
def test_autogen_hgemv_with_cupy_and_torch(dispatcher, dtype):
    import cupy
    import numpy as np

    import autogen
    from autogen.core.dtypes import to_float64, to_storage

    rng = np.random.default_rng(5)
    for batch in (1, 3, 8):
        m, n = 300, 520
        a64 = rng.random((m, n)) - 0.5
        x64 = rng.random((n,) if batch == 1 else (n, batch)) - 0.5
        A = cupy.asarray(to_storage(np, a64.astype(np.float32), dtype))
        x = cupy.asarray(to_storage(np, x64.astype(np.float32), dtype))
        want = to_float64(np, cupy.asnumpy(A), dtype) @ to_float64(np, cupy.asnumpy(x), dtype)
        y = autogen.hgemv(A, x)
        assert y.shape == want.shape and y.dtype == A.dtype
        got = to_float64(np, cupy.asnumpy(y), dtype)
        assert np.linalg.norm(got - want) <= FAMILY.tolerance_for(FAMILY.problem(dtype, m=1, n=1)) * np.linalg.norm(want)
        # alpha and beta with a given y.
        y2 = cupy.asarray(to_storage(np, (rng.random(want.shape) - 0.5).astype(np.float32), dtype))
        before = to_float64(np, cupy.asnumpy(y2), dtype)
        out = autogen.hgemv(A, x, alpha=2.0, beta=-0.5, y=y2)
        assert out is y2
        got = to_float64(np, cupy.asnumpy(y2), dtype)
        want2 = 2.0 * want - 0.5 * before
        assert np.linalg.norm(got - want2) <= 2 * FAMILY.tolerance_for(FAMILY.problem(dtype, m=1, n=1)) * np.linalg.norm(want2)
    try:
        import torch
    except ImportError:
        return
    tdtype = getattr(torch, dtype)
    At = torch.rand((256, 1000), device="cuda", dtype=tdtype) - 0.5
    for xt in (torch.rand(1000, device="cuda", dtype=tdtype) - 0.5, torch.rand((1000, 4), device="cuda", dtype=tdtype) - 0.5):
        yt = autogen.hgemv(At, xt)
        assert isinstance(yt, torch.Tensor) and yt.dtype == tdtype and yt.shape == (256,) + tuple(xt.shape[1:])
        want = At.double() @ xt.double()
        assert float((yt.double() - want).norm() / want.norm()) <= FAMILY.tolerance_for(FAMILY.problem(dtype, m=1, n=1))


def test_bad_operands_name_the_argument(dispatcher):
    import cupy

    import autogen
    from autogen.errors import ArgumentError

    A = cupy.zeros((8, 16), dtype=cupy.float16)
    with pytest.raises(ArgumentError, match="x has 15 rows"):
        autogen.hgemv(A, cupy.zeros(15, dtype=cupy.float16))
    with pytest.raises(ArgumentError, match="x must have dtype float16"):
        autogen.hgemv(A, cupy.zeros(16, dtype=cupy.float32))
    with pytest.raises(ArgumentError, match="A must have dtype"):
        autogen.hgemv(cupy.zeros((8, 16), dtype=cupy.float32), cupy.zeros(16, dtype=cupy.float32))
    with pytest.raises(ArgumentError, match="C-contiguous"):
        autogen.hgemv(cupy.zeros((16, 8), dtype=cupy.float16).T, cupy.zeros(16, dtype=cupy.float16))
    with pytest.raises(ArgumentError, match="beta != 0 needs y"):
        autogen.hgemv(A, cupy.zeros(16, dtype=cupy.float16), beta=1.0)
    with pytest.raises(ArgumentError, match="y has shape"):
        autogen.hgemv(A, cupy.zeros((16, 2), dtype=cupy.float16), y=cupy.zeros((8, 3), dtype=cupy.float16))


def test_short_tune_export_and_selftest(db_url, tmp_path):
    from autogen.cli.main import main
    from autogen.search.tuner import TuneOptions, tune

    for dtype, batch in (("float16", 1), ("bfloat16", 4)):
        result = tune(FAMILY.problem(dtype, m=1000, n=4104, batch=batch), TuneOptions(trials=6, db_url=db_url, workers=8))
        assert result.winner is not None and result.winner.trial.error <= FAMILY.tolerance_for(result.problem)
    if shutil.which("nvcc") is None or shutil.which("make") is None:
        pytest.skip("needs nvcc and make on PATH")
    out = tmp_path / "export"
    assert main(["export", "hgemv", "--out", str(out), "--db", db_url, "--self-test"]) == 0
    build = subprocess.run(["make", "-C", str(out), "selftest"], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    done = subprocess.run([str(out / "autogen_hgemv_selftest")], capture_output=True, text=True, timeout=600)
    print(done.stdout + done.stderr)
    assert done.returncode == 0 and "autogen self-test: PASS" in done.stdout


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,batch", [(4096, 512, 1), (1000, 4104, 4), (37, 1000, 8), (513, 70, 9)])
def test_pdl_call_is_bit_identical_to_the_plain_one(dtype, m, n, batch):
    """pdl=True serves the same config with its first weights loaded before griddepcontrol.wait:
    the same arithmetic, so the same bits; also inside a captured graph on a non-blocking stream."""
    import cupy

    import autogen
    from autogen.core.dtypes import DTYPES as TABLE, to_storage

    rng = _rng()
    A = to_storage(cupy, rng.random((m, n), dtype=cupy.float32) - 0.5, dtype)
    x = to_storage(cupy, rng.random((n, batch) if batch > 1 else (n,), dtype=cupy.float32) - 0.5, dtype)
    plain = autogen.hgemv(A, x)
    pdl = autogen.hgemv(A, x, pdl=True)
    assert cupy.array_equal(plain, pdl) and not bool(cupy.isnan(plain.astype(cupy.float32)).any())
    stream = cupy.cuda.Stream(non_blocking=True)
    y = cupy.empty(plain.shape, dtype=TABLE[dtype].storage)
    with stream:
        autogen.hgemv(A, x, y=y, pdl=True)
        stream.begin_capture()
        try:
            autogen.hgemv(A, x, y=y, pdl=True)
        finally:
            graph = stream.end_capture()
    with stream:  # cleared on the graph's stream: a non-blocking stream does not wait for the null stream
        y.fill(0)
    graph.launch(stream)
    stream.synchronize()
    assert cupy.array_equal(y, plain)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,batch", [(130, 4099, 1), (300, 1003, 3), (1000, 4103, 1)])
def test_rows_in_flight_pdl_form_is_bit_identical(dtype, m, n, batch):
    """The rows-in-flight body (row_align=peeled, x_path=ldg) rendered with pdl=True requests its
    first pass of A before griddepcontrol.wait and x after it: the same arithmetic as without, so
    the same bits (launched plainly here, where the wait returns at once), and both right."""
    import cupy

    from autogen.gpu.device import device_identity
    from autogen.gpu.measure import validate

    config = FAMILY.space.check({**FAMILY.default_params, "x_path": "ldg", "row_align": "peeled",
                                 "threads_per_row": 128, "warps_per_block": 8, "unroll": 4})
    problem = FAMILY.problem(dtype, m=m, n=n, batch=batch)
    name = FAMILY.kernel_name(dtype, config)
    sources = {name: render(FAMILY, dtype, config), name + "_pdl": render(FAMILY, dtype, config, pdl=True)}
    cubins = compile_many(sources, device_identity().arch)
    functions = {}
    for kernel, cubin in cubins.items():
        assert isinstance(cubin, bytes), cubin
        module = cupy.cuda.function.Module()
        module.load(cubin)
        functions[kernel] = (module, module.get_function(kernel))
    for kernel, (_, function) in functions.items():
        def launch(inputs, function=function):
            for step in FAMILY.plan(problem, config):
                function(step.launch.grid, step.launch.block, step.args(inputs))
        check = validate(FAMILY, problem, launch, cupy, _rng())
        assert check.ok, f"{kernel}: {check.reason}"
    # The same inputs through both kernels: bit for bit.
    inputs = FAMILY.make_inputs(problem, cupy, _rng(), FAMILY.timing_case(problem))
    results = []
    for _, function in functions.values():
        y = cupy.zeros_like(inputs["y"])
        for step in FAMILY.plan(problem, config):
            function(step.launch.grid, step.launch.block, step.args(dict(inputs, y=y)))
        results.append(y)
    cupy.cuda.runtime.deviceSynchronize()
    assert cupy.array_equal(results[0], results[1])
