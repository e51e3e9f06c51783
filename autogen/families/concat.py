"""CONCAT of k row-major 2-D arrays of one dtype (fp32, fp16, bf16) along axis 0 or 1 into a new
(or given) rows x cols array: an exact copy. Template: templates/concat/kernel.cu.j2 (shared
pieces in templates/copy2d.cuh.j2 and _copy2d.py).

The problem key is (k, rows, cols) of the output and the axis (a trait the kernel takes as an
argument): how the k inputs split the axis is not in the key. The kernel reads every input's
extent along the axis per launch, SLOTS inputs passed by value in each launch (ceil(k / SLOTS)
launches), so a variant tuned on one split is correct for any other: the tuner and the timing
cut the axis into nearly equal parts, validation also into random ones.
"""

from __future__ import annotations

import numpy as np

from autogen.core.dtypes import DTYPES
from autogen.core.family import Family, Launch, Peer, Step, Trait
from autogen.core.operands import kernel_scalar, new_output
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Scalar, TensorList
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError, UsageError
from autogen.families import _copy2d as c2
from autogen.families import _elementwise as ew
from autogen.gpu.peers import torch_cuda, torch_stream_peer

SLOTS = 16  # inputs per launch, passed by value (as torch.cat batches its inputs)
MAX_STAGE_BYTES = 48 * 1024  # static shared memory a block may declare (walk=inputs stages a chunk)
WIDEST_ELEMENT = 4  # bytes (fp32): a point of the space must build in every dtype
NARROW_INPUT = 1024  # elements: along axis 1, inputs narrower than this make walk=inputs a seed
AXES = ("0", "1")


def _stage_fits(p) -> str | None:
    """Space constraint: walk=inputs stages a block's chunk in static shared memory, at most
    MAX_STAGE_BYTES in the widest dtype."""
    staged = p["block_size"] * p["elements_per_thread"] * WIDEST_ELEMENT
    if p["walk"] == "inputs" and staged > MAX_STAGE_BYTES:
        return f"walk=inputs stages {staged} bytes of fp32 a block: over {MAX_STAGE_BYTES}"
    return None


SPACE = Space(
    params=(
        c2.vector_width_param(),
        Param("elements_per_thread", (1, 2, 4, 8, 16, 32), "ept",
              "elements a thread moves per block, all loaded before any is stored"),
        Param("block_size", (128, 256, 512, 1024), "bs", "threads per block"),
        Param("walk", ("rows", "elements", "shift", "inputs"), "w",
              "rows: a block copies a chunk of one row of y, each input in it a run (the widest unit both "
              "sides align to, single elements at its ends); elements: a block copies a chunk of one input, "
              "each element finding its row by a division; shift: rows, with 16-byte stores built by funnel "
              "shifts where a run's source and destination do not align alike (16-byte packs only); inputs: "
              "a block stages a chunk of one input (the grid's y) read in packs, then stores it element by "
              "element in y's order, rows found by one division a thread and a carry"),
    ),
    constraints=(c2.packs_whole, _stage_fits),
)


def _concat_shape(arrays, axis):
    """The output shape of concatenating `arrays` (2-D) along `axis`, as the torch op's fake kernel
    infers it."""
    first = tuple(arrays[0].shape)
    along = sum(int(a.shape[axis]) for a in arrays)
    return (along, first[1]) if axis == 0 else (first[0], along)


@register
class Concat(Family):
    name = "concat"
    api = "concat"
    dims = ("k", "rows", "cols")
    traits = (Trait("axis", AXES, "the axis the inputs are joined along: 0 (rows) or 1 (columns)"),)
    # Shapes with tails for the export's self-test (k, rows, cols): odd splits, one input, more
    # inputs than one launch takes.
    tail_shapes = ((1, 1, 1), (2, 3, 5), (3, 7, 33), (5, 37, 41), (9, 19, 23), (17, 40, 33), (4, 1000, 37))
    dtypes = c2.DTYPES_MOVED
    space = SPACE
    default_params = {"vector_width": 4, "elements_per_thread": 8, "block_size": 256, "walk": "rows"}
    outputs = ("y",)
    op_signature = OpSignature((TensorList("arrays"), Scalar("axis", "int", 0)),
                               (Output("out", _concat_shape, "arrays"),))
    # xs and extents are host arrays of k input pointers and their extents along the axis; y is
    # rows x cols; all of the dtype the kernel name's tag says.
    c_params = "const void* const* xs, const int* extents, int k, void* y, int rows, int cols, int axis"
    tolerance = 0.0  # compare() is exact
    example_dims = {"k": 5, "rows": 301, "cols": 257}  # 1000 inputs of 1000 x 1000 would be 4 GB
    roofline = "memory"
    # Checked on the GPU: the inputs are k arrays, their split drawn per case.
    host_check_bytes = 0
    description = "y = concatenation of k rows x cols pieces along axis 0 or 1, fp32, fp16 or bf16 (exact)"

    def check_problem(self, problem: Problem) -> None:
        along = problem["rows"] if problem["axis"] == "0" else problem["cols"]
        if problem["k"] > along:
            raise UsageError(f"concat: k={problem['k']} inputs need at least one {'row' if problem['axis'] == '0' else 'column'} "
                             f"each, but the output has {along}")

    def template_vars(self, dtype: str, config: Config, host_launcher: bool = False, traits=()) -> dict:
        return {**super().template_vars(dtype, config, host_launcher, traits), "slots": SLOTS}

    # --- geometry -------------------------------------------------------------------------
    def plan(self, problem: Problem, config: Config) -> list[Step]:
        """ceil(k / SLOTS) launches, each grid the most blocks any split can need (blocks with
        nothing to do return): walk rows, every chunk of y's rows; walk elements, the chunks of
        the whole output plus one per input; walk inputs, (the chunks of one input of the nearly
        equal split, the launch's inputs): a longer input's blocks stride over it."""
        k, rows, cols, axis = problem["k"], problem["rows"], problem["cols"], int(problem["axis"])
        chunk = config["block_size"] * config["elements_per_thread"]
        scalars = [kernel_scalar(v, np.int32) for v in (rows, cols, axis)]
        steps = []
        for group in range(0, k, SLOTS):
            slots = min(SLOTS, k - group)
            if config["walk"] == "inputs":
                launch = Launch(grid=(c2.rounded_up(_even_input_elements(problem), chunk), slots, 1),
                                block=(config["block_size"], 1, 1))
                steps.append(Step("", launch, _group_args(group, slots, axis, scalars)))
                continue
            if config["walk"] != "elements":  # rows and shift
                blocks = c2.rounded_up(rows * cols, chunk) if axis == 0 else rows * c2.rounded_up(cols, chunk)
            else:
                blocks = c2.rounded_up(rows * cols, chunk) + slots
            launch = Launch(grid=(blocks, 1, 1), block=(config["block_size"], 1, 1))
            steps.append(Step("", launch, _group_args(group, slots, axis, scalars)))
        return steps

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        too_wide = c2.pack_too_wide(problem, config)
        if too_wide:
            return too_wide
        vw, cols = config["vector_width"], problem["cols"]
        per_block = config["block_size"] * config["elements_per_thread"]
        if config["walk"] == "elements" and vw > 1 and cols % vw:
            return f"vector_width={vw} does not divide cols={cols}: rows of y break packs"
        if config["walk"] == "inputs":
            return _inputs_reject_reason(problem, config)
        if config["walk"] != "elements" and problem["axis"] == "1" and per_block > 2 * cols and config["block_size"] > 128:
            return f"block_size*elements_per_thread={per_block} is over twice a row of {cols}: most threads idle"
        if config["block_size"] > 128 and per_block > 2 * c2.elements(problem):
            return f"block_size*elements_per_thread={per_block} covers over twice the output"
        return None

    def seed_configs(self, problem: Problem) -> list[Config]:
        """Along axis 1 with inputs narrower than a row walk's chunk, first the input walk (its
        blocks never wait on one run after another); then the shifted row walk with 16-byte packs,
        two a thread, 128 threads (a chunk within one input's run of a 64 MiB join; measured in
        docs/families/transpose_concat.md); row runs in units of up to 16 bytes, two or four a
        thread, and in single elements; the shifted row walk of 256 threads; then the element walk
        with 16-byte packs and with single elements; the first four that fit the problem."""
        wide = c2.MAX_PACK_BYTES // DTYPES[problem.dtype].itemsize
        narrow = problem["axis"] == "1" and c2.rounded_up(problem["cols"], problem["k"]) < NARROW_INPUT
        first = ({"vector_width": wide, "elements_per_thread": 2 * wide, "block_size": 128, "walk": "inputs"},) if narrow else ()
        points = (*first,
                  {"vector_width": wide, "elements_per_thread": 2 * wide, "block_size": 128, "walk": "shift"},
                  {"vector_width": wide, "elements_per_thread": 2 * wide, "block_size": 256, "walk": "rows"},
                  {"vector_width": wide, "elements_per_thread": 4 * wide, "block_size": 128, "walk": "rows"},
                  {"vector_width": 1, "elements_per_thread": 8, "block_size": 256, "walk": "rows"},
                  {"vector_width": wide, "elements_per_thread": 2 * wide, "block_size": 256, "walk": "shift"},
                  {"vector_width": wide, "elements_per_thread": 2 * wide, "block_size": 256, "walk": "elements"},
                  {"vector_width": 1, "elements_per_thread": 8, "block_size": 256, "walk": "elements"})
        return ew.fitting_seeds(self, problem, points)

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # Nearly equal parts, then a random split: the kernel reads the split, the key has none.
        return [{"split": "even"}, {"split": "random"}]

    def timing_case(self, problem: Problem) -> dict:
        return {"split": "even"}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        k, rows, cols, dtype = problem["k"], problem["rows"], problem["cols"], problem.dtype
        axis = int(problem["axis"])
        extents = split_extents(xp, rng, rows if axis == 0 else cols, k, case.get("split", "even"))
        inputs = {}
        for s, extent in enumerate(extents):
            shape = (extent, cols) if axis == 0 else (rows, extent)
            inputs[f"x{s}"] = c2.random_matrix(xp, rng, shape, dtype)
        inputs["y"] = c2.poisoned(xp, (rows, cols), dtype)
        return inputs

    def reference(self, problem: Problem, inputs: dict, xp=np):
        pieces = [c2.reference_values(problem, inputs[f"x{s}"], xp) for s in range(problem["k"])]
        return xp.concatenate(pieces, axis=int(problem["axis"]))

    def compare(self, problem: Problem, inputs: dict, expected, magnitude, xp=np) -> tuple[float, str]:
        return c2.exact_compare(problem, inputs["y"], expected, xp)

    def export_compare(self, problem: Problem, configs: tuple = ()) -> str | None:
        return None  # the entry point takes host arrays of pointers: its C++ hook checks every shape

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        return c2.bytes_moved(problem)

    # --- peers ----------------------------------------------------------------------------
    peer_imports = ("torch",)

    def peer(self, problem: Problem) -> Peer | None:
        """torch.cat(..., out=y) into the inputs' own y (no allocation, so it is safe inside CuPy's
        stream capture), on the capturing stream. scripts/bench_transpose_concat.py times
        torch.cat itself in torch's own CUDA graphs."""
        torch = torch_cuda()
        if torch is None:
            return None
        k, axis = problem["k"], int(problem["axis"])
        c2.torch_warm_up(torch, problem.dtype, lambda x, y: torch.cat([x, x], dim=1, out=y), shapes=((3, 5), (3, 10)))
        names = [f"x{s}" for s in range(k)]
        return torch_stream_peer(f"torch.cat(axis={axis}, out=)", {**{n: problem.dtype for n in names}, "y": problem.dtype},
                                 lambda t: torch.cat([t[n] for n in names], dim=axis, out=t["y"]))

    # --- calls from Python ----------------------------------------------------------------
    def example_call(self, problem: Problem, cupy):
        inputs = self.make_inputs(problem, cupy, cupy.random.default_rng(0), {"split": "even"})
        arrays = [inputs[f"x{s}"] for s in range(problem["k"])]
        return (arrays,), {"axis": int(problem["axis"]), "out": inputs["y"]}

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.concat(arrays, axis=0, out=None) -> the arrays (a list or tuple of 2-D
        C-contiguous CUDA arrays of one dtype: fp32, fp16 or bf16) joined along axis 0 or 1.
        Inputs with no extent along the axis are skipped; out, when given, must have the joined shape."""
        arrays, axis, out = _concat_arguments(*args, **kwargs)
        views, dtype = [], None
        for index, array in enumerate(arrays):
            view, name = c2.matrix_operand(cupy, array, f"arrays[{index}]", (dtype,) if dtype else self.dtypes, device)
            dtype = dtype or name
            views.append(view)
        other = 1 - axis
        across = views[0].shape[other]
        for index, view in enumerate(views):
            if view.shape[other] != across:
                raise ArgumentError(f"arrays[{index}] has shape {tuple(view.shape)}, but arrays[0] has "
                                    f"{tuple(views[0].shape)}: they must agree on axis {other}")
        kept = [view for view in views if view.shape[axis]]
        if not kept or across == 0:
            raise ArgumentError("concat: the joined array would be empty")
        shape = _concat_shape(views, axis)
        if out is None:
            out = new_output(cupy, arrays[0], shape, dtype)
        outv, _ = c2.matrix_operand(cupy, out, "out", (dtype,), device)
        if tuple(outv.shape) != shape:
            raise ArgumentError(f"out has shape {tuple(outv.shape)}, but the joined array is {shape}")
        problem = self.problem_cached(dtype, (("k", len(kept)), ("rows", shape[0]), ("cols", shape[1]), ("axis", str(axis))))
        return problem, {**{f"x{s}": view for s, view in enumerate(kept)}, "y": outv}, out


def _even_input_elements(problem: Problem) -> int:
    """The elements of the longest input of the nearly equal split (the plans' and host
    launcher's share of one input)."""
    k, rows, cols = problem["k"], problem["rows"], problem["cols"]
    return c2.rounded_up(rows, k) * cols if problem["axis"] == "0" else rows * c2.rounded_up(cols, k)


def _inputs_reject_reason(problem: Problem, config: Config) -> str | None:
    """Pruning of walk=inputs: a chunk over twice an input of the nearly equal split (most
    threads would idle)."""
    per_block = config["block_size"] * config["elements_per_thread"]
    if config["block_size"] > 128 and per_block > 2 * _even_input_elements(problem):
        return f"block_size*elements_per_thread={per_block} is over twice an input of {_even_input_elements(problem)} elements"
    return None


def _group_args(group: int, slots: int, axis: int, scalars: list):
    """The kernel arguments of the launch for inputs group .. group + slots - 1: their pointers and
    extents in the slots (unused slots repeat y and have extent 0), the extent before them."""
    names = [f"x{group + s}" for s in range(slots)]
    count = kernel_scalar(slots, np.int32)
    zero = kernel_scalar(0, np.int32)

    def args(inputs: dict) -> tuple:
        arrays = [inputs[name] for name in names]
        extents = [np.int32(a.shape[axis]) for a in arrays]
        first = sum(int(inputs[f"x{s}"].shape[axis]) for s in range(group))
        filler = [inputs["y"]] * (SLOTS - slots)
        return (*arrays, *filler, *extents, *([zero] * (SLOTS - slots)), count, np.int32(first), inputs["y"], *scalars)

    return args


def _concat_arguments(arrays, axis=0, out=None):
    if isinstance(arrays, (str, bytes)) or not isinstance(arrays, (list, tuple)) or not arrays:
        raise ArgumentError(f"arrays must be a non-empty list or tuple of CUDA arrays, got {type(arrays).__name__}")
    if isinstance(axis, bool) or axis not in (0, 1, -1, -2):
        raise ArgumentError(f"axis must be 0 or 1 (or -2, -1), not {axis!r}")
    return arrays, axis % 2, out


def split_extents(xp, rng, total: int, k: int, split: str) -> list[int]:
    """k extents >= 1 summing to `total`: nearly equal (the first total % k one longer), or random
    (weights drawn with `rng`: fresh for every case)."""
    if split == "even":
        return [total // k + (1 if s < total % k else 0) for s in range(k)]
    weights = rng.random((k,), dtype=xp.float32)
    weights = np.asarray(weights.get() if hasattr(weights, "get") else weights, dtype=np.float64) + 0.25
    extents = [1 + int(w) for w in np.floor((total - k) * weights / weights.sum())]
    extents[-1] += total - sum(extents)
    return extents
