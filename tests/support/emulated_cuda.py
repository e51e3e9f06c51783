"""CUDA kernels run as host C++ on the CPU, for tests that check a template's index arithmetic
without a GPU: PRELUDE makes the CUDA keywords plain C++ (the thread and block indices globals,
__shared__ one static copy: one block runs at a time) and runs a block's threads as fibers that meet
at __syncthreads, so shared memory is seen in an order a GPU may take. build() compiles a test's
source with g++ (skipping the test where there is none)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

PRELUDE = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include <ucontext.h>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __align__(n) __attribute__((aligned(n)))  // as CUDA defines it for GCC
#define __shared__ static  // one block runs at a time
struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
static Dim3 threadIdx, blockIdx, blockDim, gridDim;

// Threads of a block as fibers (walk=inputs has barriers): each runs until __syncthreads or its
// end; when none can run, all must wait at the barrier (then all go on) or all have ended.
enum FiberState { READY, WAITING, ENDED };
static ucontext_t scheduler;
static std::vector<ucontext_t> fibers;
static std::vector<FiberState> states;
static std::vector<char> stacks;
static std::function<void()> thread_body;
static int running = -1;
constexpr std::size_t kStack = 64 * 1024;

inline void __syncthreads()
{
    if (running < 0) {
        std::fprintf(stderr, "__syncthreads outside a fibered block\n");
        std::abort();
    }
    states[running] = WAITING;
    swapcontext(&fibers[running], &scheduler);
}

static void fiber_main()
{
    thread_body();
    states[running] = ENDED;  // uc_link returns to the scheduler
}

// Every thread of the current block (blockIdx set) through `body`, barriers honoured.
static bool run_fibered_block(int block, std::function<void()> body)
{
    thread_body = std::move(body);
    fibers.resize(block);
    states.assign(block, READY);
    stacks.resize((std::size_t)block * kStack);
    for (int t = 0; t < block; ++t) {
        getcontext(&fibers[t]);
        fibers[t].uc_stack.ss_sp = stacks.data() + (std::size_t)t * kStack;
        fibers[t].uc_stack.ss_size = kStack;
        fibers[t].uc_link = &scheduler;
        makecontext(&fibers[t], fiber_main, 0);
    }
    for (;;) {
        for (int t = 0; t < block; ++t) {
            if (states[t] != READY) continue;
            running = t;
            threadIdx.x = t;
            swapcontext(&scheduler, &fibers[t]);
        }
        running = -1;
        int waiting = 0;
        for (FiberState s : states) waiting += s == WAITING;
        if (waiting == 0) return true;
        if (waiting != block) {
            std::fprintf(stderr, "block %u: %d threads wait at a barrier the others never reach\n", blockIdx.x, waiting);
            return false;
        }
        states.assign(block, READY);
    }
}
// The CUDA intrinsic: the 64 bits hi:lo shifted right by shift & 31, the low 32 bits.
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift)
{
    return (unsigned int)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}

// The driver's files: argv[1] holds the input values, argv[2] gets y.
static char** ARGV;

template <class E>
int write_output(const E* y, std::size_t n)
{
    std::FILE* result = std::fopen(ARGV[2], "wb");
    if (!result || std::fwrite(y, sizeof(E), n, result) != n) return 6;
    std::fclose(result);
    return 0;
}
"""

# The driver's main: the variant number from stdin picks a case (CASES: `case i: return run<...>(...);`).
MAIN = r"""
int main(int, char** argv)
{
    ARGV = argv;
    int variant = -1;
    if (std::scanf("%d", &variant) != 1) return 2;
    switch (variant) {
CASES
    }
    return 2;
}
"""


def build(work: Path, kernels: list[str], driver: str, cases: list[str]) -> Path:
    """PRELUDE, the kernels' sources, `driver` (its run templates) and MAIN with `cases`, compiled
    with g++ into work/emulated; the test is skipped without g++."""
    path = work / "emulated.cpp"
    path.write_text(PRELUDE + "\n".join(kernels) + driver + MAIN.replace("CASES", "\n".join(cases)))
    binary = work / "emulated"
    try:
        done = subprocess.run(["g++", "-std=c++17", "-O1", "-w", str(path), "-o", str(binary)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no g++")
    assert done.returncode == 0, done.stderr[-3000:]
    return binary


def with_flaws(family, dtype: str, params: dict, flaws: dict) -> list[tuple[str, str]]:
    """(kernel name, source) of `params`' rendering with each of `flaws` ({flaw: (old, new)}: one
    edit each, the kernel renamed): deliberately broken forms an emulation must fail, or it proves
    nothing."""
    from autogen.core.render import render

    config = family.space.check(params)
    name, source = family.kernel_name(dtype, config), render(family, dtype, config)
    broken = []
    for flaw, (old, new) in flaws.items():
        assert source.count(old) == 1, f"{flaw}: {old!r} is not once in {name}"
        broken.append((f"{name}_{flaw}", source.replace(old, new).replace(name, f"{name}_{flaw}")))
    return broken


def finite_bits(rng, count: int, dtype: str):
    """`count` random bit patterns of `dtype` (fp32 or a 16-bit type) with the exponent's top bit
    clear: finite, never the NaN poison."""
    storage = np.uint32 if dtype == "float32" else np.uint16
    values = rng.integers(0, np.iinfo(storage).max, count, dtype=np.uint64).astype(storage)
    return values & storage(0xbfffffff if dtype == "float32" else 0xbfff)


def emulate(binary: Path, work: Path, spec: str, values, expected) -> str | None:
    """Run the emulator on stdin `spec` with `values` as its input file and compare what it wrote
    with `expected` bit for bit: None when equal, else what went wrong."""
    (work / "in.bin").write_bytes(values.tobytes())
    done = subprocess.run([str(binary), str(work / "in.bin"), str(work / "out.bin")],
                          input=spec, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"{spec}: exit {done.returncode} {done.stderr.strip()}"
    got = np.frombuffer((work / "out.bin").read_bytes(), dtype=expected.dtype).reshape(expected.shape)
    wrong = np.flatnonzero(got != expected)
    return f"{spec}: {wrong.size} wrong, first {wrong[:5]}" if wrong.size else None


def mismatches(binary: Path, work: Path, cases, first_only: bool = False) -> list[str]:
    """What went wrong in each of `cases` ((stdin spec, input values, expected output) each), or
    in the first that went wrong only."""
    wrong = []
    for spec, values, expected in cases:
        failed = emulate(binary, work, spec, values, expected)
        if failed:
            wrong.append(failed)
            if first_only:
                break
    return wrong
