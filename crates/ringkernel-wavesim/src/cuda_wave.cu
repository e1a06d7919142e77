// WaveSim on CUDA: the 2-D update of the default medium (zero border) two ways.
//
// wave_step: one launch per step, a thread per cell (the baseline).
//
// wave_tiles: one persistent launch for all steps. The grid is cut into tiles; each tile
// is an actor owned by one block (a block owns tiles b, b + gridDim.x, ...). Tiles share
// the two global field buffers, so a tile's halo is its neighbours' border cells, read in
// place. flags[t] counts the steps tile t has finished. Before step k a tile waits until
// its four neighbours have finished step k - 1 (their values at level k are written, and
// they are done reading the buffer this step overwrites); there is no grid-wide barrier.
// Every block must be resident at once (the host launches at most as many blocks as fit).

__device__ __forceinline__ float wave_cell(const float* u, const float* p, int k, int s, float c2) {
  float c = __ldcg(u + k);
  float lap = __ldcg(u + k - 1) + __ldcg(u + k + 1) + __ldcg(u + k - s) + __ldcg(u + k + s) - 4.0f * c;
  return (2.0f * c + c2 * lap) - __ldcg(p + k);
}

extern "C" __global__ void wave_step(const float* u, float* p, int nx, int ny, float c2) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < nx && y < ny) {
    int s = nx + 2;
    int k = (y + 1) * s + x + 1;
    p[k] = wave_cell(u, p, k, s, c2);
  }
}

__device__ __forceinline__ void wait_for(const unsigned int* flag, unsigned int level) {
  while (*((volatile const unsigned int*)flag) < level) {
    __nanosleep(20);
  }
}

extern "C" __global__ void wave_tiles(float* b0, float* b1, unsigned int* flags, int nx, int ny, float c2,
                                      int steps, int tiles_x, int tiles_y, int tile) {
  int ntiles = tiles_x * tiles_y;
  int s = nx + 2;
  bool lead = threadIdx.x == 0 && threadIdx.y == 0;
  for (int k = 0; k < steps; k++) {
    const float* u = (k & 1) ? b0 : b1;
    float* p = (k & 1) ? b1 : b0;
    for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
      int tx = t % tiles_x, ty = t / tiles_x;
      if (lead) {
        unsigned int need = (unsigned int)k;
        if (ty > 0) wait_for(flags + t - tiles_x, need);
        if (ty < tiles_y - 1) wait_for(flags + t + tiles_x, need);
        if (tx > 0) wait_for(flags + t - 1, need);
        if (tx < tiles_x - 1) wait_for(flags + t + 1, need);
        __threadfence();
      }
      __syncthreads();
      int x0 = tx * tile, y0 = ty * tile;
      for (int yy = threadIdx.y; yy < tile; yy += blockDim.y) {
        int y = y0 + yy;
        if (y >= ny) break;
        for (int xx = threadIdx.x; xx < tile; xx += blockDim.x) {
          int x = x0 + xx;
          if (x < nx) {
            int i = (y + 1) * s + x + 1;
            p[i] = wave_cell(u, p, i, s, c2);
          }
        }
      }
      __threadfence();
      __syncthreads();
      if (lead) {
        atomicExch(flags + t, (unsigned int)(k + 1));
      }
    }
  }
}
