"""CUDA kernels run as host C++ on the CPU, for tests that check a template's index arithmetic
without a GPU: PRELUDE makes the CUDA keywords plain C++ (the thread and block indices globals,
__shared__ one static copy: one block runs at a time) and runs a block's threads as fibers that meet
at __syncthreads, so shared memory is seen in an order a GPU may take. build() compiles a test's
source with g++ (skipping the test where there is none)."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
"""


def build(work: Path, source: str) -> Path:
    """PRELUDE + `source` compiled with g++ into work/emulated; the test is skipped without g++."""
    path = work / "emulated.cpp"
    path.write_text(PRELUDE + source)
    binary = work / "emulated"
    try:
        done = subprocess.run(["g++", "-std=c++17", "-O1", "-w", str(path), "-o", str(binary)],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no g++")
    assert done.returncode == 0, done.stderr[-3000:]
    return binary
