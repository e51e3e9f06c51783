// How fast can one kernel read N bytes cold (rotating buffers > L2) in a CUDA graph on sm_90?
// Variants: vectorized ldg (grid / block / unroll / L2::256B hint / blocks per SM), 1D TMA bulk
// copies, and at 32 MiB a hand-written GEMV of 4096 x 4096 halves (the hgemv batch-1 shape) with
// and without x and its block reduction. Evidence for issue 11 (docs/benchmarks.md):
//   nvcc -arch=sm_90 -O3 -std=c++17 -o probe_cold_read scripts/probe_cold_read.cu
//   ./probe_cold_read 33554432
// To time a rendered hgemv kernel in the same harness, #include its source and launch it like
// gemv_probe (grid 2048, block 256 for tpr256_wpb8_rpg2).
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("ERR %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

template <int U, bool HINT>
__global__ void rd_ldg(const uint4* __restrict__ p, size_t words, unsigned* out) {
    // Block b reads a contiguous equal share; threads stride by blockDim, U loads in flight.
    size_t per = (words + gridDim.x - 1) / gridDim.x;
    size_t lo = blockIdx.x * per, hi = min(words, lo + per);
    unsigned acc = 0;
    size_t i = lo + threadIdx.x;
    for (; i + (U - 1) * blockDim.x < hi; i += U * blockDim.x) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const uint4* q = p + i + u * blockDim.x;
            if (HINT) asm volatile("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(q));
            else v[u] = __ldg(q);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x + v[u].y + v[u].z + v[u].w;
    }
    for (; i < hi; i += blockDim.x) { uint4 v = __ldg(p + i); acc ^= v.x + v.y + v.z + v.w; }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

template <int S, int TILE>
__global__ void rd_tma(const char* __restrict__ p, size_t bytes, unsigned* out) {
    extern __shared__ __align__(128) char smem[];
    __shared__ __align__(8) uint64_t bar[S];
    size_t per = ((bytes / gridDim.x) + 15) & ~size_t(15);
    size_t lo = blockIdx.x * per; size_t hi = min(bytes, lo + per);
    if (lo >= hi) return;
    int tiles = (int)((hi - lo + TILE - 1) / TILE);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sa(&bar[s])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int t) {
        size_t off = lo + (size_t)t * TILE; uint32_t n = (uint32_t)min((size_t)TILE, hi - off);
        int s = t % S;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sa(&bar[s])), "r"(n) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(sa(smem + s * TILE)), "l"(p + off), "r"(n), "r"(sa(&bar[s])) : "memory");
    };
    if (threadIdx.x == 0) for (int t = 0; t < S && t < tiles; ++t) issue(t);
    unsigned acc = 0;
    for (int t = 0; t < tiles; ++t) {
        int s = t % S; uint32_t phase = (t / S) & 1; uint32_t done = 0;
        while (!done) asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }" : "=r"(done) : "r"(sa(&bar[s])), "r"(phase) : "memory");
        size_t off = lo + (size_t)t * TILE; int n = (int)min((size_t)TILE, hi - off) / 16;
        const uint4* w = reinterpret_cast<const uint4*>(smem + s * TILE);
        for (int k = threadIdx.x; k < n; k += blockDim.x) { uint4 v = w[k]; acc ^= v.x + v.y + v.z + v.w; }
        __syncthreads();
        if (threadIdx.x == 0 && t + S < tiles) issue(t + S);
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}


// A GEMV-shaped reader: 2 rows of 4096 halves per block of 256 threads, each thread 2 packs of 8
// per row (one pass), A without L1 allocation. MODE 0: dot with x (ldg) + block reduction + store;
// 1: no x (sum of A) + reduction + store; 2: dot with x, per-warp partials stored (no block reduction).
template <int MODE>
__global__ void __launch_bounds__(256) gemv_probe(const unsigned short* __restrict__ A, const unsigned short* __restrict__ x,
                                                  float* __restrict__ y, int n) {
    const int t = threadIdx.x; const long long row0 = 2ll * blockIdx.x;
    uint4 a[2][2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const unsigned short* p = A + (row0 + r) * n + (u * 256 + t) * 8;
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a[r][u].x), "=r"(a[r][u].y), "=r"(a[r][u].z), "=r"(a[r][u].w) : "l"(p));
        }
    float acc[2] = {0.f, 0.f};
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        uint4 xv = make_uint4(0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u);
        if (MODE != 1) xv = __ldg(reinterpret_cast<const uint4*>(x + (u * 256 + t) * 8));
        const unsigned int xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned int aw[4] = {a[r][u].x, a[r][u].y, a[r][u].z, a[r][u].w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float2 af = __half22float2(*reinterpret_cast<const __half2*>(&aw[k]));
                float2 xf = __half22float2(*reinterpret_cast<const __half2*>(&xw[k]));
                acc[r] = fmaf(af.x, xf.x, fmaf(af.y, xf.y, acc[r]));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int o = 16; o; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (MODE == 2) {
        if (t % 32 == 0) { y[(row0) * 8 + t / 32] = acc[0]; y[(row0 + 1) * 8 + t / 32] = acc[1]; }
        return;
    }
    __shared__ float part[8][2];
    if (t % 32 == 0) { part[t / 32][0] = acc[0]; part[t / 32][1] = acc[1]; }
    __syncthreads();
    if (t < 2) { float s = 0.f;
#pragma unroll
        for (int w = 0; w < 8; ++w) s += part[w][t];
        y[row0 + t] = s; }
}

struct Timer {
    std::vector<char*> bufs; size_t bytes; unsigned* out; cudaStream_t st;
    template <class F> double time(F launch, int reps = 24, int replays = 9) {
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int r = 0; r < reps; ++r) launch(bufs[r % bufs.size()], st);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
        cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
        std::vector<float> ms;
        for (int k = 0; k < replays; ++k) {
            cudaEventRecord(a, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(b, st); CK(cudaEventSynchronize(b));
            float t; cudaEventElapsedTime(&t, a, b); ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
        return ms[ms.size() / 2] * 1000.0 / reps;
    }
};

int main(int argc, char** argv) {
    size_t bytes = argc > 1 ? strtoull(argv[1], 0, 0) : (32ull << 20);
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    int sms = prop.multiProcessorCount;
    Timer T; T.bytes = bytes; CK(cudaStreamCreate(&T.st));
    int nb = (int)std::max<size_t>(4, (3 * (size_t)prop.l2CacheSize) / bytes + 2);
    for (int i = 0; i < nb; ++i) { char* b; CK(cudaMalloc(&b, bytes)); CK(cudaMemset(b, i + 1, bytes)); T.bufs.push_back(b); }
    CK(cudaMalloc(&T.out, 1 << 20));
    // Copy bandwidth: D2D copies of 512 MiB, bytes read + written.
    { size_t cb = 512ull << 20; char *s, *d; CK(cudaMalloc(&s, cb)); CK(cudaMalloc(&d, cb)); CK(cudaMemset(s, 1, cb));
      Timer C = T; C.bufs = {s};
      double us = C.time([&](char* src, cudaStream_t st) { CK(cudaMemcpyAsync(d, src, cb, cudaMemcpyDeviceToDevice, st)); }, 6, 5);
      double gbs = 2.0 * cb / us / 1e3;
      printf("%s: %d SMs, L2 %d MiB, %d rotating buffers of %zu bytes\n", prop.name, sms, prop.l2CacheSize >> 20, nb, bytes);
      printf("copy bandwidth %.1f GB/s; floor for %zu bytes %.3f us; 93%% needs <= %.3f us\n", gbs, bytes, bytes / gbs / 1e3, bytes / gbs / 1e3 / 0.93);
      cudaFree(s); cudaFree(d); }
    size_t words = bytes / 16;
    auto run_ldg = [&](const char* name, auto kern, int grid, int block) {
        double us = T.time([&](char* b, cudaStream_t st) { kern<<<grid, block, 0, st>>>((const uint4*)b, words, T.out); });
        CK(cudaGetLastError());
        printf("%-34s grid %6d block %4d  %8.3f us  %7.1f GB/s\n", name, grid, block, us, bytes / us / 1e3);
    };
    for (int block : {256, 512, 1024}) for (int mult : {1, 2, 4, 8, 16, 64}) {
        int grid = sms * mult; if (block * mult > 2048 * 4 && mult > 8) continue;
        run_ldg("ldg U4", rd_ldg<4, false>, grid, block);
        run_ldg("ldg U8", rd_ldg<8, false>, grid, block);
        run_ldg("ldg U4 L2::256B", rd_ldg<4, true>, grid, block);
        run_ldg("ldg U8 L2::256B", rd_ldg<8, true>, grid, block);
    }
    // One pass: every thread loads U words once.
    for (int block : {256, 512}) {
        int grid = (int)((words + block * 4 - 1) / (block * 4));
        run_ldg("ldg one pass U4", rd_ldg<4, false>, grid, block);
        run_ldg("ldg one pass U4 L2::256B", rd_ldg<4, true>, grid, block);
    }
    for (int smem : {0, 40000, 56000, 75000}) {  // fewer resident blocks per SM (228 KB each)
        int block = 256, grid = (int)((words + block * 4 - 1) / (block * 4));
        auto kern = rd_ldg<4, false>;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        double us = T.time([&](char* b, cudaStream_t st) { kern<<<grid, block, smem, st>>>((const uint4*)b, words, T.out); });
        int per_sm = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, block, smem));
        printf("one pass U4 b256 smem %6d (%d blocks/SM)  %8.3f us  %7.1f GB/s\n", smem, per_sm, us, bytes / us / 1e3);
    }

    if (bytes == (32ull << 20)) {
        unsigned short* xb; float* yb; CK(cudaMalloc(&xb, 8192)); CK(cudaMemset(xb, 0, 8192)); CK(cudaMalloc(&yb, 4096 * 8 * 4));
        auto run_g = [&](const char* name, auto kern) {
            double us = T.time([&](char* b, cudaStream_t st) { kern<<<2048, 256, 0, st>>>((const unsigned short*)b, xb, yb, 4096); });
            CK(cudaGetLastError());
            printf("%-34s grid   2048 block  256  %8.3f us  %7.1f GB/s\n", name, us, bytes / us / 1e3);
        };

        for (int rep = 0; rep < 2; ++rep) {
            run_g("gemv probe: x + block reduce", gemv_probe<0>);
            run_g("gemv probe: no x + block reduce", gemv_probe<1>);
            run_g("gemv probe: x, warp partials", gemv_probe<2>);
            run_ldg("ldg one pass U4 (reference)", rd_ldg<4, false>, 2048, 256);
        }
    }
    auto run_tma = [&](const char* name, auto kern, int grid, int block, int smem) {
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        double us = T.time([&](char* b, cudaStream_t st) { kern<<<grid, block, smem, st>>>(b, bytes, T.out); });
        CK(cudaGetLastError());
        printf("%-34s grid %6d block %4d  %8.3f us  %7.1f GB/s\n", name, grid, block, us, bytes / us / 1e3);
    };
    for (int mult : {1, 2}) {
        run_tma("tma S4 T16K", rd_tma<4, 16384>, sms * mult, 256, 4 * 16384);
        run_tma("tma S8 T8K", rd_tma<8, 8192>, sms * mult, 256, 8 * 8192);
        run_tma("tma S6 T16K", rd_tma<6, 16384>, sms * mult, 256, 6 * 16384);
    }
    run_tma("tma S4 T32K", rd_tma<4, 32768>, sms, 256, 4 * 32768);
    run_tma("tma S6 T32K", rd_tma<6, 32768>, sms, 512, 6 * 32768);
    run_tma("tma S12 T16K", rd_tma<12, 16384>, sms, 512, 12 * 16384);
    return 0;
}
