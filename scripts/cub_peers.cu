// Benchmark-only CUB peers for the histogram, copy_if and scan families, built by
// scripts/bench_histogram_copy_if.py with the nvcc on PATH (CUDA 13 ships CUB):
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -o libautogen_cub_peers.so scripts/cub_peers.cu
//
// and loaded with ctypes (autogen/families/_cub.py, through AUTOGEN_CUB_PEERS). Every function
// is CUB's usual two-phase call: with temp == NULL it only writes the temporary storage size;
// else it enqueues the work on `stream` (no allocation, no synchronisation: safe inside stream
// capture) and returns the cudaError_t of the enqueue.
#include <cub/device/device_histogram.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/transform_iterator.h>
#include <cub/device/device_select.cuh>

#include <cuda_runtime.h>

namespace {

template <class T>
struct GreaterThan {
    T threshold;
    __host__ __device__ __forceinline__ bool operator()(const T& value) const { return value > threshold; }
};

template <class T>
int select_greater(void* temp, size_t* temp_bytes, const T* x, T* out, int* count, int n, T threshold,
                   cudaStream_t stream)
{
    return (int)cub::DeviceSelect::If(temp, *temp_bytes, x, out, count, n, GreaterThan<T>{threshold}, stream);
}

}  // namespace

// counts[b] = #{i : x[i] == b} for b in [0, bins): HistogramEven with bins + 1 levels 0..bins,
// bins of width 1; samples outside [0, bins) are ignored (autogen's histogram semantics).
extern "C" int autogen_cub_histogram_even_i32(void* temp, size_t* temp_bytes, const int* x, unsigned int* counts,
                                              int n, int bins, cudaStream_t stream)
{
    return (int)cub::DeviceHistogram::HistogramEven(temp, *temp_bytes, x, counts, bins + 1, 0, bins, n, stream);
}

// out[0..count) = the x[i] > threshold in input order (DeviceSelect::If is stable); count[0] = how many.
extern "C" int autogen_cub_select_gt_i32(void* temp, size_t* temp_bytes, const int* x, int* out, int* count, int n,
                                         int threshold, cudaStream_t stream)
{
    return select_greater<int>(temp, temp_bytes, x, out, count, n, threshold, stream);
}

extern "C" int autogen_cub_select_gt_f32(void* temp, size_t* temp_bytes, const float* x, float* out, int* count,
                                         int n, float threshold, cudaStream_t stream)
{
    return select_greater<float>(temp, temp_bytes, x, out, count, n, threshold, stream);
}

namespace {

struct Widen {
    __host__ __device__ __forceinline__ long long operator()(int v) const { return (long long)v; }
};

// out = the inclusive (or, when `exclusive`, exclusive) prefix sums of x: DeviceScan's sums in
// the input's type (In), or int32 x widened to int64 on the fly (Out = long long).
template <class In, class Out>
int prefix_sum(void* temp, size_t* temp_bytes, const In* x, Out* out, int n, int exclusive, cudaStream_t stream)
{
    if constexpr (sizeof(In) == sizeof(Out)) {
        return exclusive ? (int)cub::DeviceScan::ExclusiveSum(temp, *temp_bytes, x, out, n, stream)
                         : (int)cub::DeviceScan::InclusiveSum(temp, *temp_bytes, x, out, n, stream);
    } else {
        const auto wide = thrust::make_transform_iterator(x, Widen{});
        return exclusive ? (int)cub::DeviceScan::ExclusiveSum(temp, *temp_bytes, wide, out, n, stream)
                         : (int)cub::DeviceScan::InclusiveSum(temp, *temp_bytes, wide, out, n, stream);
    }
}

}  // namespace

extern "C" int autogen_cub_scan_f32(void* temp, size_t* temp_bytes, const float* x, float* out, int n, int exclusive,
                                    cudaStream_t stream)
{
    return prefix_sum(temp, temp_bytes, x, out, n, exclusive, stream);
}

extern "C" int autogen_cub_scan_i32(void* temp, size_t* temp_bytes, const int* x, int* out, int n, int exclusive,
                                    cudaStream_t stream)
{
    return prefix_sum(temp, temp_bytes, x, out, n, exclusive, stream);
}

extern "C" int autogen_cub_scan_i32_i64(void* temp, size_t* temp_bytes, const int* x, long long* out, int n,
                                        int exclusive, cudaStream_t stream)
{
    return prefix_sum(temp, temp_bytes, x, out, n, exclusive, stream);
}
