"""Session 20 probe (a record of the runs in hgemv_rows_probe_h100.json and _h200.json; run as
`python3 hgemv_rows_probe.py OUT` from the repository root with scripts/ importable): hand-written one-vector hgemv forms on rows off the 16-byte boundary, against
torch.mv and the plain read, cold, same sets. Which structure closes 1000 x 4103?"""
import json
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, "scripts")
from bench_hgemv_odd import read_ceiling  # noqa: E402

SRC = r"""
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
template <int MODE> __device__ __forceinline__ unsigned short ld16(const unsigned short* p) {
    unsigned short v;
    if (MODE == 0) asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    else if (MODE == 1) asm volatile("ld.global.L1::evict_first.u16 %0, [%1];" : "=h"(v) : "l"(p));
    else if (MODE == 2) asm volatile("ld.global.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    else if (MODE == 3) asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
    else asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v; }
template <int MODE> __device__ __forceinline__ uint4 ld128(const void* p) {
    uint4 v;
    if (MODE == 0) asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                          : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else asm volatile("ld.global.L1::evict_first.v4.u32 {%0,%1,%2,%3}, [%4];"
                          : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v; }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// A warp a row, element by element: lane reads columns lane + 32 k (64 coalesced bytes an
// instruction), CH of them in flight; x from shared memory (fp32, staged after the first chunk's
// loads are issued) or straight from L1.
template <int RPB, int CH, int XM, int AM>
__device__ void elem(const unsigned short* __restrict__ A, const unsigned short* __restrict__ x,
                     unsigned short* __restrict__ y, int m, int n)
{
    extern __shared__ float xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * RPB + warp;
    const bool live = row < m;
    const unsigned short* a = A + (long long)(live ? row : m - 1) * n;
    unsigned short v[CH];
    int j0 = 0;
#pragma unroll
    for (int k = 0; k < CH; ++k) { int j = j0 + lane + 32 * k; v[k] = j < n ? ld16<AM>(a + j) : 0; }
    if (XM == 0) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) xs[j] = h2f(__ldg(x + j));
        __syncthreads();
    }
    float acc = 0.f;
    for (;;) {
#pragma unroll
        for (int k = 0; k < CH; ++k) {
            int j = j0 + lane + 32 * k;
            if (j < n) acc += h2f(v[k]) * (XM == 0 ? xs[j] : h2f(XM == 1 ? ld16<4>(x + j) : ld16<3>(x + j)));
        }
        j0 += 32 * CH;
        if (j0 >= n) break;
#pragma unroll
        for (int k = 0; k < CH; ++k) { int j = j0 + lane + 32 * k; v[k] = j < n ? ld16<AM>(a + j) : 0; }
    }
    acc = warp_sum(acc);
    if (lane == 0 && live) y[row] = f2h(acc);
}

__device__ __forceinline__ int padded(int c) { return c + (c >> 3); }

// A warp a row, peeled: the row's head (elements before its first 16-byte boundary) and tail one
// element a lane, its body in 16-byte packs, KP a lane in flight; x staged in shared memory as fp32
// with a word of padding every 8 (lanes' packs 8 columns apart land 9 words apart: no bank conflict).
template <int RPB, int KP, int AM>
__device__ void peel(const unsigned short* __restrict__ A, const unsigned short* __restrict__ x,
                     unsigned short* __restrict__ y, int m, int n)
{
    extern __shared__ float xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * RPB + warp;
    const bool live = row < m;
    const long long base = (long long)(live ? row : m - 1) * n;
    const unsigned short* a = A + base;
    int head = (int)((8 - (((unsigned long long)a >> 1) & 7)) & 7);
    if (head > n) head = n;
    const int packs = (n - head) >> 3, tail0 = head + 8 * packs;
    const uint4* ap = reinterpret_cast<const uint4*>(a + head);
    uint4 v[KP];
    int p0 = 0;
#pragma unroll
    for (int k = 0; k < KP; ++k) { int p = p0 + lane + 32 * k; if (p < packs) v[k] = ld128<AM>(ap + p); else v[k] = make_uint4(0, 0, 0, 0); }
    unsigned short hv = lane < head ? a[lane] : 0;
    unsigned short tv = lane < n - tail0 ? a[tail0 + lane] : 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) xs[padded(j)] = h2f(__ldg(x + j));
    __syncthreads();
    float acc = 0.f;
    if (lane < head) acc += h2f(hv) * xs[padded(lane)];
    if (lane < n - tail0) acc += h2f(tv) * xs[padded(tail0 + lane)];
    for (;;) {
#pragma unroll
        for (int k = 0; k < KP; ++k) {
            int p = p0 + lane + 32 * k;
            if (p < packs) {
                const float* xp = xs + padded(head + 8 * p);  // head + 8p .. + 7 may cross a pad word
                int c = head + 8 * p;
                unsigned int w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    unsigned short h = (unsigned short)(w[e >> 1] >> (16 * (e & 1)));
                    acc += h2f(h) * xs[padded(c + e)];
                }
            }
        }
        p0 += 32 * KP;
        if (p0 >= packs) break;
#pragma unroll
        for (int k = 0; k < KP; ++k) { int p = p0 + lane + 32 * k; if (p < packs) v[k] = ld128<AM>(ap + p); else v[k] = make_uint4(0, 0, 0, 0); }
    }
    acc = warp_sum(acc);
    if (lane == 0 && live) y[row] = f2h(acc);
}


// S warps a row, R rows a block: warp w of a row takes columns [w * span, (w + 1) * span), element by
// element (lane + 32 k), all CH of them in flight with x's (plain loads: L1), 4 accumulators;
// warps' sums meet in shared memory.
template <int R, int S, int CH>
__device__ void esplit(const unsigned short* __restrict__ A, const unsigned short* __restrict__ x,
                       unsigned short* __restrict__ y, int m, int n)
{
    __shared__ float part[R * S];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = warp / S, w = warp % S;
    const int row = blockIdx.x * R + r;
    const bool live = row < m;
    const unsigned short* a = A + (long long)(live ? row : m - 1) * n;
    const int span = ((n + S * 32 - 1) / (S * 32)) * 32;
    const int j0 = w * span, j1 = min(n, j0 + span);
    unsigned short av[CH], xv[CH];
#pragma unroll
    for (int k = 0; k < CH; ++k) { int j = j0 + lane + 32 * k; av[k] = j < j1 ? ld16<1>(a + j) : 0; }
#pragma unroll
    for (int k = 0; k < CH; ++k) { int j = j0 + lane + 32 * k; xv[k] = j < j1 ? ld16<3>(x + j) : 0; }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < CH; ++k) acc[k & 3] += h2f(av[k]) * h2f(xv[k]);
    float s = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    if (S > 1) {
        if (lane == 0) part[warp] = s;
        __syncthreads();
        if (w == 0 && lane == 0) { s = 0.f; for (int i = 0; i < S; ++i) s += part[r * S + i]; }
    }
    if (w == 0 && lane == 0 && live) y[row] = f2h(s);
}

// S warps a row, peeled: the row's body packs split in S contiguous ranges, KP packs a lane all in
// flight (16 bytes each, evict-first), their x as 8 plain loads each (L1) issued before any math.
template <int R, int S, int KP>
__device__ void psplit(const unsigned short* __restrict__ A, const unsigned short* __restrict__ x,
                       unsigned short* __restrict__ y, int m, int n)
{
    __shared__ float part[R * S];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = warp / S, w = warp % S;
    const int row = blockIdx.x * R + r;
    const bool live = row < m;
    const unsigned short* a = A + (long long)(live ? row : m - 1) * n;
    int head = (int)((8 - (((unsigned long long)a >> 1) & 7)) & 7);
    if (head > n) head = n;
    const int packs = (n - head) >> 3, tail0 = head + 8 * packs;
    const int per = (packs + S - 1) / S, p0 = w * per, p1 = min(packs, p0 + per);
    const uint4* ap = reinterpret_cast<const uint4*>(a + head);
    uint4 v[KP];
    unsigned short xv[KP][8];
#pragma unroll
    for (int k = 0; k < KP; ++k) { int p = p0 + lane + 32 * k; v[k] = p < p1 ? ld128<1>(ap + p) : make_uint4(0, 0, 0, 0); }
    unsigned short hv = 0, hx = 0, tv = 0, tx = 0;
    if (w == 0 && lane < head) { hv = a[lane]; hx = ld16<3>(x + lane); }
    if (w == S - 1 && lane < n - tail0) { tv = a[tail0 + lane]; tx = ld16<3>(x + tail0 + lane); }
#pragma unroll
    for (int k = 0; k < KP; ++k) {
        int p = p0 + lane + 32 * k;
#pragma unroll
        for (int e = 0; e < 8; ++e) xv[k][e] = p < p1 ? ld16<3>(x + head + 8 * p + e) : 0;
    }
    float acc[4] = {h2f(hv) * h2f(hx), h2f(tv) * h2f(tx), 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < KP; ++k) {
        unsigned int wd[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e & 3] += h2f((unsigned short)(wd[e >> 1] >> (16 * (e & 1)))) * h2f(xv[k][e]);
    }
    float s = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    if (S > 1) {
        if (lane == 0) part[warp] = s;
        __syncthreads();
        if (w == 0 && lane == 0) { s = 0.f; for (int i = 0; i < S; ++i) s += part[r * S + i]; }
    }
    if (w == 0 && lane == 0 && live) y[row] = f2h(s);
}
#define ESPLIT(R, S, C) extern "C" __global__ void __launch_bounds__(32 * R * S) esplit_r##R##_s##S##_c##C( \
    const unsigned short* A, const unsigned short* x, unsigned short* y, int m, int n) { esplit<R, S, C>(A, x, y, m, n); }
#define PSPLIT(R, S, K) extern "C" __global__ void __launch_bounds__(32 * R * S) psplit_r##R##_s##S##_k##K( \
    const unsigned short* A, const unsigned short* x, unsigned short* y, int m, int n) { psplit<R, S, K>(A, x, y, m, n); }

// The 8 halves of x at columns 8 p + H .. 8 p + H + 7 from the aligned packs p and p + 1 (x 16-byte
// aligned): words (H / 2) .. (H / 2 + 4) of the pair, shifted by a half where H is odd.
template <int H>
__device__ __forceinline__ void x_window(const uint4& lo, const uint4& hi, unsigned int* out)
{
    const unsigned int w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (H % 2 == 0) out[i] = w[H / 2 + i];
        else out[i] = __funnelshift_r(w[H / 2 + i], w[H / 2 + i + 1], 16);
    }
}

template <int R, int S, int KP, int H>
__device__ __forceinline__ void pair_body(const uint4* ap, const uint4* xp, int p0, int p1, int lane, float* acc)
{
    uint4 v[KP], xl[KP], xh[KP];
#pragma unroll
    for (int k = 0; k < KP; ++k) { int p = p0 + lane + 32 * k; v[k] = p < p1 ? ld128<1>(ap + p) : make_uint4(0, 0, 0, 0); }
#pragma unroll
    for (int k = 0; k < KP; ++k) {
        int p = p0 + lane + 32 * k;
        if (p < p1) {
            asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(xl[k].x), "=r"(xl[k].y), "=r"(xl[k].z), "=r"(xl[k].w) : "l"(xp + p));
            if (H != 0) asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(xh[k].x), "=r"(xh[k].y), "=r"(xh[k].z), "=r"(xh[k].w) : "l"(xp + p + 1));
            else xh[k] = make_uint4(0, 0, 0, 0);
        } else { xl[k] = make_uint4(0, 0, 0, 0); xh[k] = xl[k]; }
    }
#pragma unroll
    for (int k = 0; k < KP; ++k) {
        unsigned int xw[4];
        x_window<H>(xl[k], xh[k], xw);
        unsigned int wd[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
        for (int e = 0; e < 8; ++e)
            acc[e & 3] += h2f((unsigned short)(wd[e >> 1] >> (16 * (e & 1)))) * h2f((unsigned short)(xw[e >> 1] >> (16 * (e & 1))));
    }
}

// psplit with x read as aligned 16-byte packs, two a pack of A, the row's offset (head) a compile-time
// shift (8 copies of the body, chosen once per row). Needs x 16-byte aligned and n + 8 readable... (probe: x padded).
template <int R, int S, int KP>
__device__ void xpair(const unsigned short* __restrict__ A, const unsigned short* __restrict__ x,
                      unsigned short* __restrict__ y, int m, int n)
{
    __shared__ float part[R * S];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = warp / S, w = warp % S;
    const int row = blockIdx.x * R + r;
    const bool live = row < m;
    const unsigned short* a = A + (long long)(live ? row : m - 1) * n;
    int head = (int)((8 - (((unsigned long long)a >> 1) & 7)) & 7);
    if (head > n) head = n;
    const int packs = (n - head) >> 3, tail0 = head + 8 * packs;
    const int per = (packs + S - 1) / S, p0 = w * per, p1 = min(packs, p0 + per);
    const uint4* ap = reinterpret_cast<const uint4*>(a + head);
    const uint4* xp = reinterpret_cast<const uint4*>(x);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (w == 0 && lane < head) acc[0] = h2f(a[lane]) * h2f(x[lane]);
    if (w == S - 1 && lane < n - tail0) acc[1] = h2f(a[tail0 + lane]) * h2f(x[tail0 + lane]);
    switch (head) {
    case 0: pair_body<R, S, KP, 0>(ap, xp, p0, p1, lane, acc); break;
    case 1: pair_body<R, S, KP, 1>(ap, xp, p0, p1, lane, acc); break;
    case 2: pair_body<R, S, KP, 2>(ap, xp, p0, p1, lane, acc); break;
    case 3: pair_body<R, S, KP, 3>(ap, xp, p0, p1, lane, acc); break;
    case 4: pair_body<R, S, KP, 4>(ap, xp, p0, p1, lane, acc); break;
    case 5: pair_body<R, S, KP, 5>(ap, xp, p0, p1, lane, acc); break;
    case 6: pair_body<R, S, KP, 6>(ap, xp, p0, p1, lane, acc); break;
    default: pair_body<R, S, KP, 7>(ap, xp, p0, p1, lane, acc); break;
    }
    float s = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    if (S > 1) {
        if (lane == 0) part[warp] = s;
        __syncthreads();
        if (w == 0 && lane == 0) { s = 0.f; for (int i = 0; i < S; ++i) s += part[r * S + i]; }
    }
    if (w == 0 && lane == 0 && live) y[row] = f2h(s);
}
#define XPAIR(R, S, K) extern "C" __global__ void __launch_bounds__(32 * R * S) xpair_r##R##_s##S##_k##K( \
    const unsigned short* A, const unsigned short* x, unsigned short* y, int m, int n) { xpair<R, S, K>(A, x, y, m, n); }
#define ELEM(R, C, X, M) extern "C" __global__ void __launch_bounds__(32 * R) elem_r##R##_c##C##_x##X##_a##M( \
    const unsigned short* A, const unsigned short* x, unsigned short* y, int m, int n) { elem<R, C, X, M>(A, x, y, m, n); }
#define PEEL(R, K, M) extern "C" __global__ void __launch_bounds__(32 * R) peel_r##R##_k##K##_a##M( \
    const unsigned short* A, const unsigned short* x, unsigned short* y, int m, int n) { peel<R, K, M>(A, x, y, m, n); }
ELEM(4, 32, 0, 0) ELEM(4, 32, 0, 1) ELEM(4, 32, 0, 2) ELEM(4, 32, 0, 3) ELEM(4, 32, 1, 0) ELEM(4, 32, 1, 1) ELEM(4, 32, 1, 2) ELEM(4, 32, 1, 3) ELEM(4, 32, 3, 0) ELEM(4, 32, 3, 1) ELEM(4, 32, 3, 2) ELEM(4, 32, 3, 3) ELEM(4, 64, 0, 0) ELEM(4, 64, 0, 1) ELEM(4, 64, 0, 2) ELEM(4, 64, 0, 3) ELEM(4, 64, 1, 0) ELEM(4, 64, 1, 1) ELEM(4, 64, 1, 2) ELEM(4, 64, 1, 3) ELEM(4, 64, 3, 0) ELEM(4, 64, 3, 1) ELEM(4, 64, 3, 2) ELEM(4, 64, 3, 3) ELEM(4, 130, 0, 0) ELEM(4, 130, 0, 1) ELEM(4, 130, 0, 2) ELEM(4, 130, 0, 3) ELEM(4, 130, 1, 0) ELEM(4, 130, 1, 1) ELEM(4, 130, 1, 2) ELEM(4, 130, 1, 3) ELEM(4, 130, 3, 0) ELEM(4, 130, 3, 1) ELEM(4, 130, 3, 2) ELEM(4, 130, 3, 3) ELEM(2, 64, 3, 1) ELEM(8, 64, 3, 1) ELEM(2, 130, 3, 1) ELEM(8, 130, 3, 1) ELEM(2, 64, 0, 1) ELEM(8, 64, 0, 1) ELEM(2, 130, 0, 1) ELEM(8, 130, 0, 1) PEEL(4, 8, 0) PEEL(4, 8, 1) PEEL(4, 16, 0) PEEL(4, 16, 1) PEEL(8, 16, 0) PEEL(8, 16, 1) PEEL(2, 16, 0) PEEL(2, 16, 1) PEEL(4, 4, 0) PEEL(4, 4, 1) 
ESPLIT(1, 4, 33) ESPLIT(2, 4, 33) ESPLIT(1, 8, 17) ESPLIT(2, 2, 65) ESPLIT(1, 2, 65) ESPLIT(4, 1, 130) ESPLIT(1, 16, 9) ESPLIT(2, 8, 17) PSPLIT(1, 4, 4) PSPLIT(2, 4, 4) PSPLIT(1, 8, 2) PSPLIT(2, 8, 2) PSPLIT(1, 2, 8) PSPLIT(2, 2, 8) PSPLIT(4, 2, 8) PSPLIT(1, 16, 1) 
XPAIR(2, 4, 4) XPAIR(1, 4, 4) XPAIR(2, 2, 8) XPAIR(4, 2, 8) XPAIR(2, 8, 2) XPAIR(1, 8, 4) XPAIR(2, 8, 4) XPAIR(4, 4, 4) XPAIR(2, 4, 8) XPAIR(1, 16, 2) PSPLIT(2, 8, 4) PSPLIT(4, 4, 4) PSPLIT(2, 4, 8) 
"""
NAMES = ['xpair_r2_s4_k4', 'xpair_r1_s4_k4', 'xpair_r2_s2_k8', 'xpair_r4_s2_k8', 'xpair_r2_s8_k2', 'xpair_r1_s8_k4', 'xpair_r2_s8_k4', 'xpair_r4_s4_k4', 'xpair_r2_s4_k8', 'xpair_r1_s16_k2', 'psplit_r2_s8_k4', 'psplit_r4_s4_k4', 'psplit_r2_s4_k8'] + ['esplit_r1_s4_c33', 'esplit_r2_s4_c33', 'esplit_r1_s8_c17', 'esplit_r2_s2_c65', 'esplit_r1_s2_c65', 'esplit_r4_s1_c130', 'esplit_r1_s16_c9', 'esplit_r2_s8_c17', 'psplit_r1_s4_k4', 'psplit_r2_s4_k4', 'psplit_r1_s8_k2', 'psplit_r2_s8_k2', 'psplit_r1_s2_k8', 'psplit_r2_s2_k8', 'psplit_r4_s2_k8', 'psplit_r1_s16_k1'] + ['elem_r4_c32_x0_a0', 'elem_r4_c32_x0_a1', 'elem_r4_c32_x0_a2', 'elem_r4_c32_x0_a3', 'elem_r4_c32_x1_a0', 'elem_r4_c32_x1_a1', 'elem_r4_c32_x1_a2', 'elem_r4_c32_x1_a3', 'elem_r4_c32_x3_a0', 'elem_r4_c32_x3_a1', 'elem_r4_c32_x3_a2', 'elem_r4_c32_x3_a3', 'elem_r4_c64_x0_a0', 'elem_r4_c64_x0_a1', 'elem_r4_c64_x0_a2', 'elem_r4_c64_x0_a3', 'elem_r4_c64_x1_a0', 'elem_r4_c64_x1_a1', 'elem_r4_c64_x1_a2', 'elem_r4_c64_x1_a3', 'elem_r4_c64_x3_a0', 'elem_r4_c64_x3_a1', 'elem_r4_c64_x3_a2', 'elem_r4_c64_x3_a3', 'elem_r4_c130_x0_a0', 'elem_r4_c130_x0_a1', 'elem_r4_c130_x0_a2', 'elem_r4_c130_x0_a3', 'elem_r4_c130_x1_a0', 'elem_r4_c130_x1_a1', 'elem_r4_c130_x1_a2', 'elem_r4_c130_x1_a3', 'elem_r4_c130_x3_a0', 'elem_r4_c130_x3_a1', 'elem_r4_c130_x3_a2', 'elem_r4_c130_x3_a3', 'elem_r2_c64_x3_a1', 'elem_r8_c64_x3_a1', 'elem_r2_c130_x3_a1', 'elem_r8_c130_x3_a1', 'elem_r2_c64_x0_a1', 'elem_r8_c64_x0_a1', 'elem_r2_c130_x0_a1', 'elem_r8_c130_x0_a1', 'peel_r4_k8_a0', 'peel_r4_k8_a1', 'peel_r4_k16_a0', 'peel_r4_k16_a1', 'peel_r8_k16_a0', 'peel_r8_k16_a1', 'peel_r2_k16_a0', 'peel_r2_k16_a1', 'peel_r4_k4_a0', 'peel_r4_k4_a1']


def rows_per_block(name):
    return int(name.split("_")[1][1:])


def threads(name):
    parts = name.split("_")
    if parts[0] in ("esplit", "psplit", "xpair"):
        return 32 * int(parts[1][1:]) * int(parts[2][1:])
    return 32 * rows_per_block(name)


def smem_bytes(name, n):
    if "_x1_" in name or "_x3_" in name or "split" in name:
        return 0
    return 4 * (n + n // 8 + 8)


def main():
    from autogen.core.registry import get_family
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.evaluator import Evaluator, WorkSpec
    from autogen.gpu.measure import time_enqueue

    out = sys.argv[1]
    shapes = [(1000, 4103), (3000, 4099), (5120, 5121), (11008, 4097), (4096, 11007)]
    family = get_family("hgemv")
    results = []
    for m, n in shapes:
        problem = family.problem("float16", m=m, n=n, batch=1)
        ev = Evaluator(WorkSpec.of(problem))
        cupy = ev.cupy
        t0 = time.time()
        cubin = compile_cubin(SRC, ev.device.arch, options=("-Xptxas", "-v")) if False else compile_cubin(SRC, ev.device.arch)
        module = cupy.cuda.function.Module()
        module.load(cubin)
        sets = ev.timing_inputs()
        row = {"m": m, "n": n, "gpu": ev.device.name, "us": {}, "err": {}, "regs": {}}
        # validation on fresh inputs
        rng = np.random.default_rng(7)
        A = cupy.asarray((rng.random((m, n)) - 0.5).astype(np.float16))
        x = cupy.asarray((rng.random(n) - 0.5).astype(np.float16))
        ref = cupy.asnumpy(A).astype(np.float64) @ cupy.asnumpy(x).astype(np.float64)
        for name in [k for k in NAMES if k.startswith(('psplit', 'xpair'))]:
            kern = module.get_function(name)
            rpb = rows_per_block(name)
            grid, block, sh = ((m + rpb - 1) // rpb,), (threads(name),), smem_bytes(name, n)
            row["regs"][name] = kern.attributes.get("num_regs") if hasattr(kern, "attributes") else None
            y = cupy.full(m, np.nan, dtype=np.float16)
            kern(grid, block, (A, x, y, np.int32(m), np.int32(n)), shared_mem=sh)
            cupy.cuda.runtime.deviceSynchronize()
            got = cupy.asnumpy(y).astype(np.float64)
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            row["err"][name] = err
            if not err < 1e-3:
                print(f"{m}x{n} {name} INVALID err {err}")
                continue
            t = time_enqueue(cupy, lambda i, k=kern, g=grid, b=block, s=sh: k(
                g, b, (sets[i]["A"], sets[i]["x"], sets[i]["y"], np.int32(m), np.int32(n)), shared_mem=s), len(sets))
            row["us"][name] = round(statistics.median(t.samples_us), 3)
        peer = ev.time_peer()
        row["torch_us"] = round(statistics.median(peer[1]), 3)
        row.update(read_ceiling(ev))
        # interleave: re-time the best three once more and torch again (drift check)
        best = sorted(row["us"], key=row["us"].get)[:3]
        again = {}
        for name in best:
            kern = module.get_function(name)
            rpb = rows_per_block(name)
            grid, block, sh = ((m + rpb - 1) // rpb,), (threads(name),), smem_bytes(name, n)
            t = time_enqueue(cupy, lambda i, k=kern, g=grid, b=block, s=sh: k(
                g, b, (sets[i]["A"], sets[i]["x"], sets[i]["y"], np.int32(m), np.int32(n)), shared_mem=s), len(sets))
            again[name] = round(statistics.median(t.samples_us), 3)
        row["again_us"] = again
        row["torch_again_us"] = round(statistics.median(ev.time_peer()[1]), 3)
        row["wall_s"] = round(time.time() - t0, 1)
        results.append(row)
        print(f"{m}x{n}: torch {row['torch_us']} / {row['torch_again_us']}  read {row['read_us']}  "
              + "  ".join(f"{k} {v}" for k, v in sorted(row["us"].items(), key=lambda kv: kv[1])[:12]), flush=True)
        with open(f"{out}/odd_probe.json", "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
