"""What hgemv's space allows (autogen.families.hgemv's SPACE): each constraint returns why a point is
left out, or None; split_reason, why a point does not fit a problem. The parameters in full:
docs/families/hgemv.md, "Parameters". Registers no family (a private module).
"""

from __future__ import annotations

from autogen.gpu.device import sm_count

X_TILE_BYTES = 32 * 1024  # x_path=smem stages tpr*pw*u columns x batch_tile floats; at most this


def x_tile_fits(p) -> str | None:
    columns = p["threads_per_row"] * p["pack_width"] * p["unroll"]
    if p["x_path"] == "smem" and 4 * columns * p["batch_tile"] > X_TILE_BYTES:
        return (f"x_path=smem stages {columns} columns x batch_tile={p['batch_tile']} floats, over "
                f"{X_TILE_BYTES // 1024} KiB of shared memory")
    return None


def mma_shape(p) -> str | None:
    # x_path=mma: a lane loads 8 halves of two rows per 16-row tile, a row group is whole warps,
    # and its cross-warp sum has one form (shared memory): reduce=smem would duplicate shfl.
    if p["x_path"] != "mma":
        return None
    if p["pack_width"] != 8:
        return "x_path=mma loads A fragments 8 halves at a time: pack_width=8 only"
    if p["threads_per_row"] < 32:
        return "x_path=mma needs whole warps per row tile: threads_per_row >= 32"
    if p["reduce"] != "shfl":
        return "x_path=mma has one cross-warp sum: reduce=shfl only"
    if p["rows_per_group"] > 2:
        return "x_path=mma: rows_per_group <= 2 (a 64-row tile spills registers on sm_90)"
    return None


def values_fit_registers(p) -> str | None:
    # Weights in flight and accumulators must leave room for a pack's x values: bounds checked
    # with nvcc -Xptxas -v on the extreme configs (no spills).
    in_flight = p["rows_per_group"] * p["unroll"] * p["pack_width"]
    if in_flight > 32:
        return f"rows_per_group*unroll*pack_width={in_flight} weights in flight per thread exceeds 32"
    # x_path=mma keeps 4 accumulators per 16-row tile whatever the batch tile.
    if p["x_path"] != "mma" and p["rows_per_group"] * p["batch_tile"] > 16:
        return f"rows_per_group*batch_tile={p['rows_per_group'] * p['batch_tile']} accumulators exceeds 16"
    return None


def schedule_has_steps(p) -> str | None:
    # With one step per chunk both schedules are the same code; x_path=mma keeps its own schedule.
    # Neither wins everywhere, so the search chooses per shape (docs/families/hgemv.md, load_schedule).
    if p["load_schedule"] == "step" and (p["unroll"] == 1 or p["x_path"] == "mma"):
        return "load_schedule=step needs unroll >= 2 and x_path ldg or smem"
    # early moves A's requests ahead of x's staging in shared memory; the other paths stage none.
    if p["load_schedule"] == "early" and p["x_path"] != "smem":
        return "load_schedule=early needs x_path=smem (A requested before x is staged)"
    return None


def tail_peels_one_vector(p) -> str | None:
    # The unchecked loop reads x's packs straight from global memory (x_path=smem stages x behind
    # barriers, mma has its own loop); with several vectors it spills (docs/families/hgemv.md, tail).
    if p["tail"] == "peeled" and (p["x_path"] != "ldg" or p["batch_tile"] != 1):
        return "tail=peeled needs x_path=ldg and batch_tile=1"
    return None


def rows_in_flight(p) -> bool:
    """row_align=peeled through the read-only path: templates/hgemv/rows_in_flight.cu.j2."""
    return p["row_align"] == "peeled" and p["x_path"] == "ldg"


def three_vectors_in_flight(p) -> str | None:
    # A tile of 3 vectors keeps x in whole units for a batch of 3 in rows in flight alone (a tile
    # of 4 there reads a batch of 3 element by element); the other forms index x by powers of two.
    if p["batch_tile"] == 3 and not rows_in_flight(p):
        return "batch_tile=3 needs row_align=peeled with x_path=ldg (rows in flight)"
    return None


def peeled_rows_stage_x(p) -> str | None:
    # row_align=peeled: x_path smem and mma stage x shifted by the block's head in shared memory;
    # x_path=ldg takes its own body (templates/hgemv/rows_in_flight.cu.j2): whole warps a row, each
    # pass's packs and x requested before any multiply-add, the warps' sums added in shared memory.
    # Its own loop: no step schedule, unchecked tail or tree reduction; batch tiles 1 to 4 (8
    # vectors' x of a pack would hold 36 words a pack in flight); row groups of rows pack_width
    # apart, which share each load of x (values_fit_registers bounds them).
    if not rows_in_flight(p):
        return None
    if p["threads_per_row"] < 32:
        return "row_align=peeled with x_path=ldg takes whole warps a row: threads_per_row >= 32"
    if p["batch_tile"] > 4:
        return "row_align=peeled with x_path=ldg computes up to 4 vectors: batch_tile <= 4"
    if p["load_schedule"] != "chunk" or p["tail"] != "checked" or p["reduce"] != "shfl":
        return "row_align=peeled with x_path=ldg has its own loop: load_schedule=chunk, tail=checked, reduce=shfl"
    return None


def split_on_tensor_cores(p) -> str | None:
    # The split combines the cluster's partial sums of mma tiles (4 accumulators a lane), for
    # blocks of one row group, whose tiles are few (several groups already share the columns).
    if p["split_k"] == 1:
        return None
    if p["x_path"] != "mma":
        return "split_k > 1 needs x_path=mma (partial sums of tensor-core tiles combined in the cluster)"
    if p["threads_per_row"] != 32 * p["warps_per_block"]:
        return "split_k > 1 needs one row group per block: threads_per_row = 32 * warps_per_block"
    return None



# min_blocks is tried where it bounds a thread to at most 128 of an SM's 64K registers (sm_80, sm_90).
REGISTERS_PER_SM = 65536
BOUND_THREADS = REGISTERS_PER_SM // 128


def tensor_core_registers(p) -> str | None:
    # A second register set of A, and a register bound, change the mma loop only (the CUDA-core
    # loops keep theirs: docs/families/hgemv.md, a_buffers and min_blocks).
    if rows_in_flight(p):
        return rows_in_flight_registers(p)
    if p["x_path"] != "mma" and (p["a_buffers"] != 1 or p["min_blocks"] != 1):
        return "a_buffers and min_blocks shape the tensor-core loop: x_path=mma only (min_blocks: rows in flight too)"
    if p["min_blocks"] == 4:
        return "min_blocks=4 is for rows in flight (x_path=mma is bounded to 2 or 3 blocks)"
    threads = p["min_blocks"] * 32 * p["warps_per_block"]
    if p["min_blocks"] > 1 and threads < BOUND_THREADS:
        return (f"min_blocks={p['min_blocks']} blocks of {32 * p['warps_per_block']} threads leave each "
                f"over {REGISTERS_PER_SM // threads} registers: no bound")
    # Bounded to 80 registers (3 blocks of 256 threads), two sets of A or 4 steps of it spill.
    if p["min_blocks"] >= 3 and (p["a_buffers"] == 2 or p["rows_per_group"] * p["unroll"] > 2):
        return "min_blocks=3 spills A's registers: a_buffers=1 and rows_per_group * unroll <= 2 only"
    return None


def rows_in_flight_registers(p) -> str | None:
    # Rows in flight at three and four vectors: unbounded, ptxas leaves room for 3 blocks of 256
    # threads an SM; bounded to 64 registers (min_blocks=4) they hold 4 (why it pays and where:
    # docs/families/hgemv.md, "Rows in flight bounded to 64 registers"). The bound is offered where
    # ptxas (nvcc 13, sm_90) fits every such variant, both dtypes and every threads_per_row, without
    # a spill: few x columns a pass (unroll * pack_width * batch_tile <= 24), at most 16 weights in
    # flight, and not 2-element packs over 8 steps of a group (rows_per_group * unroll >= 8).
    if p["a_buffers"] != 1:
        return "a_buffers=2 is the tensor-core loop's: x_path=mma only"
    if p["min_blocks"] == 1:
        return None
    if p["min_blocks"] != 4 or p["warps_per_block"] != 8 or p["batch_tile"] < 3:
        return "rows in flight take min_blocks=4 with 256-thread blocks at three or four vectors only"
    columns, weights = p["unroll"] * p["pack_width"], p["rows_per_group"] * p["unroll"] * p["pack_width"]
    if columns * p["batch_tile"] > 24 or weights > 16 or (p["pack_width"] == 2 and p["rows_per_group"] * p["unroll"] >= 8):
        return "rows in flight bounded to 64 registers spill with this many x columns or weights a pass"
    return None


# A column split pays two cluster barriers and a combine per tile; it is tried where the blocks of
# row tiles leave SMs idle or unevenly loaded: fewer than this many per SM.
SPLIT_BELOW_BLOCKS_PER_SM = 4


def split_reason(problem, config, row_blocks: int) -> str | None:
    """Why split_k does not fit this problem: the row blocks already fill the GPU, or a block of
    the cluster would get no chunk of the columns."""
    split = config["split_k"]
    if split == 1:
        return None
    enough = SPLIT_BELOW_BLOCKS_PER_SM * sm_count()
    if row_blocks >= enough:
        return f"{row_blocks} blocks of row tiles fill the GPU ({enough} or more) without split_k"
    chunk = config["threads_per_row"] * config["unroll"]  # x_path=mma: columns per chunk
    chunks = -(-problem["n"] // chunk)
    if chunks < split:
        return f"split_k={split} over {chunks} chunks of {chunk} columns leaves a block without one"
    return None
