// C = A B for WIDTH x WIDTH row-major float matrices, tiled in shared memory: the tiled
// matrix multiply of Kernel Tuner's examples, written anew for autogen with the same tunable
// parameters. A block of block_size_x x block_size_y threads computes a tile of C that is
// block_size_x * tile_size_x wide and block_size_y * tile_size_y tall; each thread computes
// tile_size_y x tile_size_x outputs, strided by the block's size so that neighbouring threads
// touch neighbouring columns. The restriction block_size_x == block_size_y * tile_size_y makes
// the tile of A square, block_size_x on a side; WIDTH must be a multiple of every tile.
#ifndef WIDTH
#define WIDTH 4096
#endif

__global__ void matmul_kernel(float *C, const float *A, const float *B)
{
    __shared__ float sA[block_size_y * tile_size_y][block_size_x];
    __shared__ float sB[block_size_x][block_size_x * tile_size_x];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int col = blockIdx.x * block_size_x * tile_size_x + tx;
    const int row = blockIdx.y * block_size_y * tile_size_y + ty;

    float sum[tile_size_y][tile_size_x];
    #pragma unroll
    for (int i = 0; i < tile_size_y; i++) {
        #pragma unroll
        for (int j = 0; j < tile_size_x; j++) {
            sum[i][j] = 0.0f;
        }
    }

    for (int k0 = 0; k0 < WIDTH; k0 += block_size_x) {
        #pragma unroll
        for (int i = 0; i < tile_size_y; i++) {
            sA[ty + block_size_y * i][tx] = A[(row + block_size_y * i) * WIDTH + k0 + tx];
            #pragma unroll
            for (int j = 0; j < tile_size_x; j++) {
                sB[ty + block_size_y * i][tx + block_size_x * j] =
                    B[(k0 + ty + block_size_y * i) * WIDTH + col + block_size_x * j];
            }
        }
        __syncthreads();

        #pragma unroll
        for (int k = 0; k < block_size_x; k++) {
            #pragma unroll
            for (int i = 0; i < tile_size_y; i++) {
                const float a = sA[ty + block_size_y * i][k];
                #pragma unroll
                for (int j = 0; j < tile_size_x; j++) {
                    sum[i][j] += a * sB[k][tx + block_size_x * j];
                }
            }
        }
        __syncthreads();
    }

    #pragma unroll
    for (int i = 0; i < tile_size_y; i++) {
        #pragma unroll
        for (int j = 0; j < tile_size_x; j++) {
            C[(row + block_size_y * i) * WIDTH + col + block_size_x * j] = sum[i][j];
        }
    }
}
