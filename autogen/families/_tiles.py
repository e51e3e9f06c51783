"""What histogram and copy_if share: tiles of block_size * items_per_thread elements, a grid of one
block per tile or of blocks_per_sm persistent blocks per SM looping over the tiles, the pruning of
both, and the launch of an `_init` step. Registers no family (a private module).
"""

from __future__ import annotations

from autogen.core.family import Launch
from autogen.core.problem import Config
from autogen.gpu.device import sm_count

MAX_THREADS_PER_SM = 2048
INIT_BLOCK = 256  # threads of an _init step's block
INIT_BLOCKS_CAP = 1024  # its blocks at most (grid-stride beyond)


def one_wave(p) -> str | None:
    if p["block_size"] * p["blocks_per_sm"] > MAX_THREADS_PER_SM:
        return f"block_size*blocks_per_sm={p['block_size'] * p['blocks_per_sm']} exceeds {MAX_THREADS_PER_SM} threads per SM"
    return None


def tile(config: Config) -> int:
    return config["block_size"] * config["items_per_thread"]


def tiles(n: int, config: Config) -> int:
    return -(-n // tile(config))


def grid_blocks(n: int, config: Config) -> int:
    """One block per tile (blocks_per_sm = 0), else min(tiles, SMs x blocks_per_sm)."""
    count = tiles(n, config)
    if config["blocks_per_sm"] == 0:
        return max(1, count)
    return max(1, min(count, sm_count() * config["blocks_per_sm"]))


def tile_overshoot_reason(n: int, config: Config) -> str | None:
    size = tile(config)
    if size > 2 * max(n, 128) and (config["items_per_thread"] > 4 or config["block_size"] > 128):
        return f"a tile of {size} elements spans over twice n={n}"
    return None


def init_launch(items: int) -> Launch:
    """An _init step covering `items` words with INIT_BLOCK threads a block."""
    return Launch(grid=(min(-(-items // INIT_BLOCK), INIT_BLOCKS_CAP), 1, 1), block=(INIT_BLOCK, 1, 1))
