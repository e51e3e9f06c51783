"""What the fp32 GEMM families (sgemm, gemm_bias_act) share: sgemm's kernel geometry, its search
space and pruning (constraints measured with nvcc 13 -Xptxas -v), the seed templates, and
GemmBase, which starts searches from them and lays out the grid. Registers no family (a private
module); the kernel is templates/sgemm/kernel.cu.j2, which gemm_bias_act's template extends.
The measurements behind the pruning and the seeds: docs/families/sgemm.md.
"""

from __future__ import annotations

from autogen.core.family import Family, Launch
from autogen.core.problem import Config, Problem
from autogen.core.space import Param, Space
from autogen.errors import UsageError
from autogen.gpu.device import sm_count

# Blocks of the split-K init kernel (256 threads, grid-stride); the template has the same figure.
INIT_THREADS = 256
INIT_MAX_BLOCKS = 4096
SHARED_LIMIT = 48 * 1024  # static shared memory per block
REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80, sm_90)
MAX_THREADS_PER_SM = 2048  # sm_80, sm_90
# Shared memory one SM holds for resident blocks: sm_80's 164 KiB (sm_90: 228), for one space.
SM_SHARED = 164 * 1024
SHARED_RESERVED = 1024  # per resident block
PTXAS_MAX_REGISTERS = 255
# What the estimate below may reach: nvcc spills past an estimate of ~215 (8 x 8 thread tiles,
# block_k 32, 64-thread blocks). REGISTER_OVERHEAD: indices, pointers, bounds and loop state,
# calibrated with nvcc 13 -Xptxas -v on sm_80 and sm_90 (no spill at or under the cap).
MAX_REGISTERS = 208
REGISTER_OVERHEAD = 40
# min_blocks = 2 (see _occupancy_fits): the register estimate may exceed the cap of
# __launch_bounds__(threads, 2) by this much (ptxas then schedules tighter, without spilling);
# only blocks of up to CAPPED_MAX_THREADS threads are capped.
CAP_SLACK = 22  # register-staged pipelines (sync, regs, regsedge) with 16-byte loads
CAP_SLACK_ASYNC = 13  # cp.async pipelines: ptxas spills from 144 registers estimated (sm_90)
CAPPED_MAX_THREADS = 256
MAX_COPIES = 32  # global loads (or cp.async copies) per thread per k tile: bounds code size
MAX_THREADS = 512
SMALL_TILE = 64 * 64  # block tiles under this are pruned where 128 x 128 tiles fill the GPU 4 times

STAGES = {"sync": 1, "regs": 2, "regsedge": 2, "async2": 2, "async3": 3}


def warp_shape(p) -> tuple[int, int]:
    rows, cols = p["warp_layout"].split("x")
    return int(rows), int(cols)


def geometry(p) -> dict:
    """Derived sizes of a (complete) parameter set: warps, threads, shared bytes, loads, registers."""
    wr, wc = warp_shape(p)
    bm, bn, bk, tm, tn = p["block_m"], p["block_n"], p["block_k"], p["thread_m"], p["thread_n"]
    warps_m, warps_n = bm // (wr * tm), bn // (wc * tn)
    threads = 32 * warps_m * warps_n
    stages = STAGES[p["pipeline"]]
    pad = p["smem_pad"]
    vw = p["vector_width"]
    a_vw = 1 if p["pipeline"].startswith("async") else vw
    a_loads = -(-bm * bk // a_vw // threads)
    b_loads = -(-bk * bn // vw // threads)
    prefetch = (a_loads * a_vw + b_loads * vw) if not p["pipeline"].startswith("async") else 0
    # Accumulators, one k step's A and B fragments (twice: the next step's are loaded early), the
    # staged global loads (1.5 registers per float: nvcc keeps copies while it transposes and converts
    # them; 32-64-thread blocks with deep tiles spill without this), an address or predicate per load, overhead.
    registers = tm * tn + 2 * (tm + tn) + prefetch * 3 // 2 + a_loads + b_loads + REGISTER_OVERHEAD
    min_blocks = p["min_blocks"]
    return {"warps_m": warps_m, "warps_n": warps_n, "threads": threads, "stages": stages,
            "shared_bytes": 4 * stages * bk * (bm + pad + bn + pad), "a_loads": a_loads, "b_loads": b_loads,
            "registers": registers, "register_cap": min(MAX_REGISTERS, REGISTER_FILE // max(threads, 1)),
            "min_blocks": min_blocks,
            "launch_bounds_cap": launch_bounds_cap(threads, min_blocks)}


def launch_bounds_cap(threads: int, min_blocks: int) -> int:
    """Registers per thread ptxas allows under __launch_bounds__(threads, min_blocks): the
    register file shared by min_blocks blocks, in the allocation unit of 8 per thread, at most 255."""
    return min(PTXAS_MAX_REGISTERS, REGISTER_FILE // max(threads * min_blocks, 1) // 8 * 8)


def _warp_tiles_fit(p) -> str | None:
    wr, wc = warp_shape(p)
    if p["block_m"] % (wr * p["thread_m"]) or p["block_n"] % (wc * p["thread_n"]):
        return (f"block {p['block_m']}x{p['block_n']} is not a whole number of {wr * p['thread_m']}x"
                f"{wc * p['thread_n']} warp tiles (warp_layout {p['warp_layout']}, thread tile "
                f"{p['thread_m']}x{p['thread_n']})")
    return None


def _resources_fit(p) -> str | None:
    """Threads, shared memory, registers and loads per thread, checked before compiling."""
    if _warp_tiles_fit(p):
        return None  # reported by _warp_tiles_fit; the geometry is undefined
    g = geometry(p)
    if g["threads"] > MAX_THREADS:
        return f"{g['threads']} threads per block (over {MAX_THREADS})"
    if g["shared_bytes"] > SHARED_LIMIT:
        return f"{g['shared_bytes']} bytes of shared memory (over {SHARED_LIMIT})"
    if g["registers"] > g["register_cap"]:
        return (f"about {g['registers']} registers per thread, over the {g['register_cap']} that "
                f"{g['threads']} threads may use (it would spill)")
    if g["a_loads"] + g["b_loads"] > MAX_COPIES:
        return f"{g['a_loads'] + g['b_loads']} global loads per thread per k tile (over {MAX_COPIES})"
    return None


def _split_adds_vectors(p) -> str | None:
    # Split-K adds four floats per vector atomic (sm_90), never fewer instructions with scalar
    # ones; on earlier GPUs both compile to scalar atomicAdd: one variant, not two.
    if p["split_k"] > 1 and p["store_width"] != 4:
        return "split_k > 1 adds into C four floats at a time: store_width must be 4"
    return None


def _sync_depth(p) -> str | None:
    # Measured with nvcc 13 -Xptxas -v: single-stage kernels with 32-deep k tiles get a few bytes
    # of spill from ptxas's own occupancy target at any thread tile; the other pipelines do not.
    if p["pipeline"] == "sync" and p["block_k"] == 32:
        return "pipeline=sync with block_k=32 spills (ptxas); take block_k <= 16 or another pipeline"
    return None


def _fma_order_tiles(p) -> str | None:
    # Measured on SASS only for 8 x 8 thread tiles (docs/families/sgemm.md, fma_order); keeps the
    # space under the contract test's 30,000 points.
    if p["fma_order"] == "ji" and (p["thread_m"], p["thread_n"]) != (8, 8):
        return "fma_order=ji is for 8x8 thread tiles (thread_m = thread_n = 8)"
    return None


def _edge_checks_vectors(p) -> str | None:
    # regsedge's interior loads are 16-byte vectors; with 4-byte loads it would be regs again,
    # less the checks, in a space already near the contract test's bound.
    if p["pipeline"] == "regsedge" and p["vector_width"] != 4:
        return "pipeline=regsedge loads 16-byte vectors: vector_width must be 4"
    return None


def _occupancy_fits(p, sm_shared: int = SM_SHARED) -> str | None:
    """min_blocks = 2 (__launch_bounds__(threads, 2)): the two blocks must fit an SM together
    (threads, shared memory) and the cap must change something without making ptxas spill (the
    bounds measured with nvcc 13 -Xptxas -v: docs/families/sgemm.md, "Parameters")."""
    blocks = p["min_blocks"]
    if blocks == 1 or _warp_tiles_fit(p):
        return None
    g = geometry(p)
    threads = g["threads"]
    if threads * blocks > MAX_THREADS_PER_SM:
        return f"min_blocks={blocks} blocks of {threads} threads are over {MAX_THREADS_PER_SM} threads per SM"
    if (g["shared_bytes"] + SHARED_RESERVED) * blocks > sm_shared:
        return (f"min_blocks={blocks} blocks of {g['shared_bytes']} bytes of shared memory (+{SHARED_RESERVED} "
                f"reserved each) are over the {sm_shared} bytes of an SM")
    cap = g["launch_bounds_cap"]
    if cap >= PTXAS_MAX_REGISTERS or g["registers"] <= cap:
        return (f"min_blocks={blocks} caps nothing: {threads} threads x {blocks} blocks leave {cap} registers, "
                f"about {g['registers']} needed (the same kernel as min_blocks=1)")
    if threads > CAPPED_MAX_THREADS:
        return f"min_blocks={blocks} caps {threads}-thread blocks at {cap} registers: it spills (ptxas)"
    slack = CAP_SLACK_ASYNC if p["pipeline"].startswith("async") else CAP_SLACK
    if g["registers"] > cap + slack:
        return (f"min_blocks={blocks} caps {threads}-thread blocks at {cap} registers, {g['registers'] - cap} "
                f"under the estimate of {g['registers']} (over {slack} with pipeline={p['pipeline']}: it spills)")
    if p["vector_width"] == 1 and not p["pipeline"].startswith("async"):
        return (f"min_blocks={blocks} with 4-byte loads staged in registers (vector_width=1, "
                f"pipeline={p['pipeline']}) spills under the {cap}-register cap")
    return None


SPACE = Space(
    params=(
        Param("block_m", (16, 32, 64, 128, 256), "bm", "rows of C per block"),
        Param("block_n", (16, 32, 64, 128, 256), "bn", "columns of C per block"),
        Param("block_k", (8, 16, 32), "bk", "depth of the k tile held in shared memory"),
        Param("thread_m", (4, 8), "tm", "rows of C per thread (registers), in fragments of 4"),
        Param("thread_n", (4, 8), "tn", "columns of C per thread (registers), in fragments of 4"),
        Param("warp_layout", ("4x8", "8x4"), "wl",
              "a warp's threads as rows x columns: the warp tile is (rows*thread_m) x (cols*thread_n)"),
        Param("vector_width", (1, 4), "vw", "floats per global load of A and B (4: 16-byte loads; 1: 4-byte)"),
        Param("store_width", (1, 4), "sw", "floats per store of C (4: 16-byte stores; with split-K, vector atomic adds)"),
        Param("smem_pad", (0, 4), "pad", "floats of padding per shared-memory row, against bank conflicts"),
        Param("pipeline", ("sync", "regs", "regsedge", "async2", "async3"), "pl",
              "sync: one stage; regs: 2 stages, next tile prefetched in registers; regsedge: regs with "
              "bounds checks in edge blocks only; asyncN: N cp.async stages"),
        Param("split_k", (1, 2, 4, 8, 16, 32, 64), "sk", "blocks per tile over disjoint ranges of k (atomic adds into C)"),
        Param("min_blocks", (1, 2), "mb",
              "blocks per SM the kernel is compiled for: __launch_bounds__(threads, min_blocks) caps "
              "registers at 65536 / (threads * min_blocks), so that min_blocks blocks are resident"),
        Param("fma_order", ("ij", "ji"), "fo",
              "order of each k step's outer-product FMAs in the source: ij (row by row) or ji (column by "
              "column); same arithmetic, a different ptxas register allocation (register-bank conflicts)"),
    ),
    constraints=(_warp_tiles_fit, _resources_fit, _split_adds_vectors, _sync_depth, _occupancy_fits,
                 _fma_order_tiles, _edge_checks_vectors),
)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# The strongest SIMT configurations known, in order of the prior: what a search tries first
# (GemmBase.seed_configs adapts each to the shape; why these: docs/families/sgemm.md, "Where a
# search starts").
SEED_TEMPLATES = (
    dict(block_m=128, block_n=128, block_k=8, thread_m=8, thread_n=8, warp_layout="4x8", pipeline="regsedge",
         fma_order="ji"),
    dict(block_m=128, block_n=128, block_k=8, thread_m=8, thread_n=8, warp_layout="4x8", pipeline="regs"),
    # fma_order=ji: fewer register-bank conflicts in the SASS (docs/families/sgemm.md, fma_order).
    dict(block_m=128, block_n=128, block_k=8, thread_m=8, thread_n=8, warp_layout="4x8", pipeline="regs",
         fma_order="ji"),
    dict(block_m=128, block_n=128, block_k=8, thread_m=8, thread_n=8, warp_layout="8x4", pipeline="regsedge"),
    dict(block_m=128, block_n=128, block_k=8, thread_m=8, thread_n=8, warp_layout="4x8", pipeline="async3"),
    dict(block_m=128, block_n=128, block_k=8, thread_m=8, thread_n=8, warp_layout="8x4", pipeline="regs"),
    dict(block_m=128, block_n=64, block_k=8, thread_m=8, thread_n=8, warp_layout="4x8", pipeline="regs"),
    dict(block_m=64, block_n=128, block_k=8, thread_m=8, thread_n=8, warp_layout="4x8", pipeline="regs"),
    # The 1024^3 winner of the first H200 run, then smaller tiles.
    dict(block_m=32, block_n=128, block_k=8, thread_m=8, thread_n=4, warp_layout="4x8", pipeline="async2"),
    dict(block_m=64, block_n=64, block_k=16, thread_m=8, thread_n=8, warp_layout="4x8", pipeline="async2"),
    dict(block_m=32, block_n=32, block_k=32, thread_m=4, thread_n=4, warp_layout="8x4", pipeline="async3"),
    dict(block_m=32, block_n=32, block_k=16, thread_m=4, thread_n=4, warp_layout="4x8", pipeline="async2"),
)
SEEDS = 6  # seed configs per problem at most (each is a measured trial of the budget)
SEED_COMMON = dict(vector_width=4, smem_pad=4, fma_order="ij")
# Where split-K fills the GPU, the first template is also seeded with the smallest split giving
# DEEP_SPLIT_WAVES blocks per SM (docs/families/sgemm.md, "Where a search starts").
DEEP_SPLIT_WAVES = 4


class GemmBase(Family):
    """The block-tiled fp32 GEMM kernel of templates/sgemm/kernel.cu.j2: its space, seeds, pruning
    and grid. A subclass states the operation (name, operands, reference, peer, Python call)."""

    reuse_bound_calls = True  # bind only checks and arranges (autogen.runtime.bound_calls)
    dtypes = ("float32",)
    space = SPACE
    default_params = {"block_m": 128, "block_n": 128, "block_k": 8, "thread_m": 8, "thread_n": 8,
                      "warp_layout": "4x8", "vector_width": 4, "store_width": 4, "smem_pad": 4,
                      "pipeline": "regs", "split_k": 1, "min_blocks": 1, "fma_order": "ij"}
    roofline = "compute"

    # --- where a search starts ------------------------------------------------------------
    def default_config(self, problem: Problem | None = None) -> Config:
        """Served where nothing is tuned and measured first by every search: the strongest
        known configuration for this shape (default_params without a shape)."""
        if problem is None:
            return self.space.check(self.default_params)
        seeds = self.seed_configs(problem)
        return seeds[0] if seeds else self.space.check(self.default_params)

    def seed_configs(self, problem: Problem, count: int = SEEDS) -> list[Config]:
        """The strongest known configurations adapted to this shape, best first: each of
        SEED_TEMPLATES with split-K raised until the blocks fill the GPU (where the tiles leave
        it under one wave), min_blocks=2 where that variant compiles, 16-byte stores without
        split-K; those the shape pruning rejects are left out, duplicates once."""
        found: list[Config] = []
        ranked = []
        for order, template in enumerate(SEED_TEMPLATES):
            config = self._adapt(problem, template)
            if config is None or config in found:
                continue
            found.append(config)
            blocks = self.tiles(problem, config) * config["split_k"]
            ranked.append((blocks < sm_count(), order, config))
            if order == 0 and config["split_k"] > 1:
                deep = self._adapt(problem, template, waves=DEEP_SPLIT_WAVES)
                if deep is not None and deep not in found:
                    found.append(deep)
                    ranked.append((False, 0.5, deep))
        if not ranked:  # a tiny shape prunes every template: the smallest tiles, unpruned
            for template in reversed(SEED_TEMPLATES):
                config = self._adapt(problem, template, pruned=False)
                if config is not None:
                    return [config]
        return [config for *_key, config in sorted(ranked, key=lambda r: r[:2])][:count]

    def _adapt(self, problem: Problem, template: dict, pruned: bool = True, waves: int = 1) -> Config | None:
        tiles = _ceil(problem["m"], template["block_m"]) * _ceil(problem["n"], template["block_n"])
        splits = [1]
        if tiles < sm_count() and pruned:
            # The smallest split that gives every SM `waves` blocks, or the largest the pruning allows.
            splits = [s for s in self.space.param("split_k").choices if s == 1 or tiles * s <= 16 * sm_count()]
            filling = [s for s in splits if tiles * s >= waves * sm_count()]
            splits = sorted(set(filling[:1] + splits), key=lambda s: (s not in filling[:1], -s))
        for split in splits:
            for blocks in (2, 1):
                params = {**SEED_COMMON, **template, "split_k": split, "min_blocks": blocks,
                          "store_width": 4}
                if self.space.violations(params):
                    continue
                config = self.space.check(params)
                if not pruned or self.reject_reason(problem, config) is None:
                    return config
        return None

    # --- geometry -------------------------------------------------------------------------
    def tiles(self, problem: Problem, config: Config) -> int:
        return _ceil(problem["m"], config["block_m"]) * _ceil(problem["n"], config["block_n"])

    def check_problem(self, problem: Problem) -> None:
        # One block per 16 x 16 tile at most (the smallest block tile) must fit grid.x.
        if _ceil(problem["m"], 16) * _ceil(problem["n"], 16) > 2**31 - 1:
            raise UsageError(f"{self.name}: m x n = {problem['m']} x {problem['n']} has too many tiles for one grid")

    def launch(self, problem: Problem, config: Config) -> Launch:
        return Launch(grid=(self.tiles(problem, config), config["split_k"], 1),
                      block=(geometry(config)["threads"], 1, 1))

    def init_launch(self, problem: Problem) -> Launch:
        blocks = max(1, min(INIT_MAX_BLOCKS, _ceil(problem["m"] * problem["n"], INIT_THREADS)))
        return Launch(grid=(blocks, 1, 1), block=(INIT_THREADS, 1, 1))

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        m, n, k = problem["m"], problem["n"], problem["k"]
        bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
        if bm > 16 and bm >= 2 * m:
            return f"block_m={bm} is at least twice m={m}"
        if bn > 16 and bn >= 2 * n:
            return f"block_n={bn} is at least twice n={n}"
        if bk > 8 and bk >= 2 * k:
            return f"block_k={bk} is at least twice k={k}"
        if bm * bn < SMALL_TILE and _ceil(m, 128) * _ceil(n, 128) >= 4 * sm_count():
            return f"block tile {bm}x{bn} is small for {m}x{n}: 128x128 tiles already fill 4 waves"
        split = config["split_k"]
        if split > 1:
            tiles = self.tiles(problem, config)
            if tiles >= 2 * sm_count():
                return f"{tiles} tiles fill the GPU twice without split-K"
            if _ceil(k, bk) < 2 * split:
                return f"split_k={split} leaves fewer than 2 k tiles of {bk} per split (k={k})"
            if tiles * split > 16 * sm_count():
                return f"{tiles} tiles x split_k={split} is over 16 blocks per SM"
        return None
