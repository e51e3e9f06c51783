// c = a + b, one element per thread: Kernel Tuner's first example, written anew for autogen.
// block_size_x is defined by the tuner (a #define before this source).
__global__ void vector_add(float *c, const float *a, const float *b, int n)
{
    int i = blockIdx.x * block_size_x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}
