"""TRANSPOSE of a row-major rows x cols matrix into a new (or given) cols x rows one, fp32, fp16 or
bf16, any shape: y[c][r] = x[r][c], an exact copy. Template: templates/transpose/kernel.cu.j2
(shared pieces in templates/copy2d.cuh.j2 and _copy2d.py).

One block stages one tile x tile square in shared memory, so that both the reads of x and the
writes of y run along rows; the space is the tile, the elements a thread holds, the vector width
and the staged layout (plain, padded by one element per row, XOR-swizzled, or two rows' elements
side by side).
"""

from __future__ import annotations

import numpy as np

from autogen.core.dtypes import DTYPES
from autogen.core.family import Family, Launch, Peer, Step
from autogen.core.operands import kernel_scalar, new_output
from autogen.core.problem import Config, Problem
from autogen.core.registry import register
from autogen.core.signature import OpSignature, Output, Tensor
from autogen.core.space import Param, Space
from autogen.errors import ArgumentError, UsageError
from autogen.families import _copy2d as c2
from autogen.families import _elementwise as ew
from autogen.gpu.peers import torch_cuda, torch_stream_peer

MAX_TILES = 2**31 - 1  # one block per tile, in a 1-D grid


def _threads_per_block(p) -> str | None:
    threads = p["tile"] * p["tile"] // p["elements_per_thread"]
    if not 64 <= threads <= 1024:
        return f"tile={p['tile']} with elements_per_thread={p['elements_per_thread']} is {threads} threads (64 to 1024)"
    if p["elements_per_thread"] // p["vector_width"] > p["tile"]:
        return f"elements_per_thread={p['elements_per_thread']} is more rows than the tile's {p['tile']}"
    return None


def _pairs_hold_row_pairs(p) -> str | None:
    """layout=pairs stages two rows' elements of a column as one word: a thread holds an even
    number of rows, and y's packs are whole words."""
    if p["layout"] != "pairs":
        return None
    if p["vector_width"] < 2:
        return "layout=pairs reads y's packs as whole words: vector_width must be 2 or more"
    if (p["elements_per_thread"] // p["vector_width"]) % 2:
        return (f"layout=pairs holds rows in pairs: elements_per_thread={p['elements_per_thread']} / "
                f"vector_width={p['vector_width']} rows is odd")
    return None


SPACE = Space(
    params=(
        Param("tile", (32, 64), "t", "side of the square a block stages in shared memory"),
        c2.vector_width_param(),
        Param("elements_per_thread", (2, 4, 8, 16, 32), "ept",
              "elements a thread moves: elements_per_thread / vector_width tile rows of vector_width each"),
        Param("layout", ("pad", "swizzle", "plain", "pairs"), "l",
              "the staged square: one spare element per row (no bank conflicts on its columns), the column's "
              "4-byte word XORed by the row (the same, no spare memory), plain (conflicted columns), or "
              "pairs (two rows' elements of a column side by side, so a pack of y is read in one access)"),
        Param("raster", ("rows", "cols"), "r",
              "the order blocks take the squares in: along x's rows of squares (consecutive blocks read "
              "adjacent runs of the same rows of x), or down its columns (they write adjacent runs of the "
              "same rows of y)", added_with_default="rows"),
    ),
    constraints=(c2.packs_whole, _threads_per_block, _pairs_hold_row_pairs),
)


@register
class Transpose(Family):
    name = "transpose"
    api = "transpose"
    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dims = ("rows", "cols")
    # Shapes with tails for the export's self-test: single rows and columns, sizes off every tile
    # and vector width, and a tall and a wide one.
    tail_shapes = ((1, 1), (1, 37), (37, 1), (3, 5), (33, 65), (257, 129), (1000, 37), (31, 4099))
    dtypes = c2.DTYPES_MOVED
    space = SPACE
    default_params = {"tile": 32, "vector_width": 1, "elements_per_thread": 8, "layout": "pad"}
    outputs = ("y",)
    op_signature = OpSignature((Tensor("x"),), (Output("out", lambda x: (x.shape[1], x.shape[0]), "x"),))
    # x (rows x cols) and y (cols x rows) hold float or 16-bit patterns (fp16, bf16) as the kernel
    # name's dtype tag says.
    c_params = "const void* x, void* y, int rows, int cols"
    tolerance = 0.0  # compare() is exact
    roofline = "memory"
    # Checked on the GPU at every size: a case reads x and writes y one element past an aligned
    # address (a view), which an upload from the host would realign.
    host_check_bytes = 0
    description = "y = x^T of a rows x cols matrix, fp32, fp16 or bf16, any shape (exact)"

    def check_problem(self, problem: Problem) -> None:
        tiles = c2.rounded_up(problem["rows"], 32) * c2.rounded_up(problem["cols"], 32)
        if tiles > MAX_TILES:
            raise UsageError(f"transpose: {problem['rows']} x {problem['cols']} is over {MAX_TILES} tiles of 32 x 32")

    # --- geometry -------------------------------------------------------------------------
    def launch(self, problem: Problem, config: Config) -> Launch:
        tile = config["tile"]
        tiles = c2.rounded_up(problem["rows"], tile) * c2.rounded_up(problem["cols"], tile)
        return Launch(grid=(tiles, 1, 1), block=(tile * tile // config["elements_per_thread"], 1, 1))

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        rows, cols = kernel_scalar(problem["rows"], np.int32), kernel_scalar(problem["cols"], np.int32)
        return [Step("", self.launch(problem, config), lambda inputs: (inputs["x"], inputs["y"], rows, cols))]

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        too_wide = c2.pack_too_wide(problem, config)
        if too_wide:
            return too_wide
        rows, cols, tile, vw = problem["rows"], problem["cols"], config["tile"], config["vector_width"]
        if vw > 1 and cols % vw and rows % vw:
            return f"vector_width={vw} divides neither rows={rows} nor cols={cols}: every access is single"
        if tile == 64 and min(rows, cols) <= 32:
            return f"tile=64 on a side of {min(rows, cols)}: most of every square is empty"
        return None

    def seed_configs(self, problem: Problem) -> list[Config]:
        """The article's kernel first (32 x 32 tiles, padded, 8 elements a thread), then 64-wide
        squares taken down x's columns (raster=cols: long runs of y's rows, which the measured GPUs
        reward; docs/families/transpose_concat.md): of row pairs with 16-byte packs, padded with
        4-byte packs and padded single elements; then 16-byte packs padded and swizzled. The first
        four that fit the problem."""
        wide = c2.MAX_PACK_BYTES // DTYPES[problem.dtype].itemsize
        points = ({"tile": 32, "vector_width": 1, "elements_per_thread": 8, "layout": "pad"},
                  {"tile": 64, "vector_width": wide, "elements_per_thread": 16, "layout": "pairs", "raster": "cols"},
                  {"tile": 64, "vector_width": 2, "elements_per_thread": 8, "layout": "pad", "raster": "cols"},
                  {"tile": 64, "vector_width": 1, "elements_per_thread": 8, "layout": "pad", "raster": "cols"},
                  {"tile": 32, "vector_width": wide, "elements_per_thread": wide * 2, "layout": "pad"},
                  {"tile": 64, "vector_width": wide, "elements_per_thread": wide * 4, "layout": "swizzle"})
        return ew.fitting_seeds(self, problem, points)

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        # Offset 1: x and y one element past an aligned address, so vector variants take their
        # single-element path (and a check of one pointer only would fault or fail).
        return [{"offset": 0}, {"offset": 1}]

    def timing_case(self, problem: Problem) -> dict:
        return {"offset": 0}

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        rows, cols, dtype = problem["rows"], problem["cols"], problem.dtype
        offset = case.get("offset", 0)
        return {"x": c2.offset_matrix(xp, c2.random_matrix(xp, rng, (rows, cols), dtype), offset),
                "y": c2.offset_matrix(xp, c2.poisoned(xp, (cols, rows), dtype), offset)}

    def reference(self, problem: Problem, inputs: dict, xp=np):
        return xp.ascontiguousarray(c2.reference_values(problem, inputs["x"], xp).T)

    def compare(self, problem: Problem, inputs: dict, expected, magnitude, xp=np) -> tuple[float, str]:
        return c2.exact_compare(problem, inputs["y"], expected, xp)

    def export_compare(self, problem: Problem, configs: tuple = ()) -> str | None:
        return "exact"

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        return c2.bytes_moved(problem)

    # --- peers ----------------------------------------------------------------------------
    peer_imports = ("torch",)

    def peer(self, problem: Problem) -> Peer | None:
        """torch's strided copy of x.t() into the inputs' own y (what x.t().contiguous() runs,
        without its allocation, so it is safe inside CuPy's stream capture), on the capturing
        stream. scripts/bench_transpose_concat.py times x.t().contiguous() itself in torch's own
        CUDA graphs."""
        torch = torch_cuda()
        if torch is None:
            return None
        c2.torch_warm_up(torch, problem.dtype, lambda x, y: y.copy_(x.t()))
        return torch_stream_peer("torch x.t() copied into y (as .contiguous())", {"x": problem.dtype, "y": problem.dtype},
                                 lambda t: t["y"].copy_(t["x"].t()))

    # --- calls from Python ----------------------------------------------------------------
    def example_call(self, problem: Problem, cupy):
        x = c2.random_matrix(cupy, cupy.random.default_rng(0), (problem["rows"], problem["cols"]), problem.dtype)
        return (x,), {"out": cupy.empty((problem["cols"], problem["rows"]), dtype=x.dtype)}

    def bind(self, cupy, device: int, args: tuple, kwargs: dict):
        """autogen.transpose(x, out=None) -> x transposed (cols x rows, x's dtype) for a 2-D
        C-contiguous CUDA array x of fp32, fp16 or bf16; out, when given, must be cols x rows."""
        x, out = _transpose_arguments(*args, **kwargs)
        xv, dtype = c2.matrix_operand(cupy, x, "x", self.dtypes, device)
        rows, cols = xv.shape
        if xv.size == 0:
            raise ArgumentError(f"x has shape {tuple(xv.shape)}: transpose needs at least one element")
        if out is None:
            out = new_output(cupy, x, (cols, rows), dtype)
        outv, _ = c2.matrix_operand(cupy, out, "out", (dtype,), device)
        if outv.shape != (cols, rows):
            raise ArgumentError(f"out has shape {tuple(outv.shape)}, but x^T is ({cols}, {rows})")
        return self.problem_cached(dtype, (("rows", rows), ("cols", cols))), {"x": xv, "y": outv}, out


def _transpose_arguments(x, out=None):
    return x, out
