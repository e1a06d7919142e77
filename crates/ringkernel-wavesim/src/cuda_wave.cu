// WaveSim on CUDA: the 2-D update of the default medium (zero border) three ways.
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

// Plain (L1-cached) loads: within one launch nothing else writes `u`, so neighbouring
// threads share its rows through L1 instead of each going to L2.
extern "C" __global__ void wave_step(const float* __restrict__ u, float* __restrict__ p, int nx, int ny,
                                     float c2) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < nx && y < ny) {
    int s = nx + 2;
    int k = (y + 1) * s + x + 1;
    float c = u[k];
    float lap = u[k - 1] + u[k + 1] + u[k - s] + u[k + s] - 4.0f * c;
    p[k] = (2.0f * c + c2 * lap) - p[k];
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

// wave_resident_R: tile actors whose fields stay on chip. One block (32 x 16 threads)
// per tile of 32 columns x 16R rows, every block resident (the host launches at most one
// per SM); thread (tx, ty) keeps its R cells of column tx, rows ty*R .. ty*R + R - 1, at
// the current and the previous step in registers for the whole launch. A step: the
// tile's current field goes to shared memory with the neighbours' border cells around it,
// each thread updates its cells, then the tile publishes its new border cells.
//
// Halo exchange without flags apart from the data (as NCCL's LL protocol does): each
// border cell travels as one 64-bit word {value bits, stamp}, stamp = step + 1 (zeroed
// memory never matches), written with one 64-bit store and polled with 64-bit volatile
// loads, so the value and its stamp arrive together: no fence, no counter, no barrier
// beyond the block. A tile waits only for its four neighbours' cells of the step it needs.
// Two slots per tile (by the step's parity) suffice: a tile overwrites slot s & 1 with
// step s + 2 only after it has read its neighbours' step s + 1 cells, which they published
// after reading its step s cells.
//
// Slot layout per tile and parity (HALO words): [0, 32) top row, [32, 64) bottom row,
// [64, 64 + TH) left column, [64 + TH, 64 + 2 TH) right column.

__device__ __forceinline__ void put_ll(unsigned long long* slot, float v, unsigned stamp) {
  unsigned long long w = ((unsigned long long)stamp << 32) | (unsigned long long)__float_as_uint(v);
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(slot), "l"(w) : "memory");
}

__device__ __forceinline__ unsigned long long ld_ll(const unsigned long long* slot) {
  unsigned long long w;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(slot) : "memory");
  return w;
}

// Waits for up to two stamped words at once (a null slot: nothing to wait for, the value
// stays 0, a zero border): both loads are in flight together, one round trip, not two.
__device__ __forceinline__ void get2_ll(const unsigned long long* a, const unsigned long long* b,
                                        unsigned stamp, float& av, float& bv) {
  bool need_a = a != nullptr, need_b = b != nullptr;
  while (need_a || need_b) {
    unsigned long long wa = need_a ? ld_ll(a) : 0ull;
    unsigned long long wb = need_b ? ld_ll(b) : 0ull;
    if (need_a && (unsigned)(wa >> 32) == stamp) {
      av = __uint_as_float((unsigned)(wa & 0xffffffffull));
      need_a = false;
    }
    if (need_b && (unsigned)(wb >> 32) == stamp) {
      bv = __uint_as_float((unsigned)(wb & 0xffffffffull));
      need_b = false;
    }
  }
}

template <int R>
__device__ __forceinline__ void resident(float* prev, float* cur, unsigned long long* halo, int nx, int ny,
                                         float c2, unsigned base, int steps, int tiles_x) {
  constexpr int TW = 32;
  constexpr int TH = 16 * R;
  constexpr int HALO = 2 * TW + 2 * TH;
  __shared__ float s[TH + 2][TW + 2];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tile = blockIdx.x;
  const int tiles_y = gridDim.x / tiles_x;
  const int bx = tile % tiles_x, by = tile / tiles_x;
  const int x = bx * TW + tx;
  const int stride = nx + 2;
  const int up = by > 0 ? tile - tiles_x : -1;
  const int down = by < tiles_y - 1 ? tile + tiles_x : -1;
  const int left = bx > 0 ? tile - 1 : -1;
  const int right = bx < tiles_x - 1 ? tile + 1 : -1;
  unsigned long long* mine = halo + (long long)tile * 2 * HALO;
  float u[R], p[R];
  bool in[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    int y = by * TH + ty * R + r;
    in[r] = x < nx && y < ny;
    int k = (y + 1) * stride + x + 1;
    u[r] = in[r] ? cur[k] : 0.0f;
    p[r] = in[r] ? prev[k] : 0.0f;
  }
  for (int i = 0; i <= steps; i++) {
    const unsigned step = base + (unsigned)i;  // the step u is at
    const unsigned stamp = step + 1u;
    const int par = (int)(step & 1u) * HALO;
    // Publish this tile's border cells of step `step`.
    unsigned long long* out = mine + par;
    if (ty == 0) put_ll(out + tx, u[0], stamp);
    if (ty == 15) put_ll(out + TW + tx, u[R - 1], stamp);
#pragma unroll
    for (int r = 0; r < R; r++) {
      if (tx == 0) put_ll(out + 2 * TW + ty * R + r, u[r], stamp);
      if (tx == TW - 1) put_ll(out + 2 * TW + TH + ty * R + r, u[r], stamp);
    }
    if (i == steps) break;
    // The tile and its neighbours' borders into shared memory. A warp is one row of
    // threads (blockDim.x == 32); its lanes fetch the border cells: lanes 0..R-1 the
    // left neighbour's cells of the warp's R rows, lanes 16..16+R-1 the right one's,
    // and in the first and last warp every lane one cell of the row above or below.
#pragma unroll
    for (int r = 0; r < R; r++) s[ty * R + r + 1][tx + 1] = u[r];
    {
      const unsigned long long* a_slot = nullptr;
      const unsigned long long* b_slot = nullptr;
      float* a_dst = nullptr;
      float* b_dst = nullptr;
      if (tx < R) {
        const int row = ty * R + tx;
        a_dst = &s[row + 1][0];
        if (left >= 0) a_slot = halo + (long long)left * 2 * HALO + par + 2 * TW + TH + row;
      } else if (tx >= 16 && tx < 16 + R) {
        const int row = ty * R + tx - 16;
        a_dst = &s[row + 1][TW + 1];
        if (right >= 0) a_slot = halo + (long long)right * 2 * HALO + par + 2 * TW + row;
      }
      if (ty == 0) {
        b_dst = &s[0][tx + 1];
        if (up >= 0) b_slot = halo + (long long)up * 2 * HALO + par + TW + tx;
      } else if (ty == 15) {
        b_dst = &s[TH + 1][tx + 1];
        if (down >= 0) b_slot = halo + (long long)down * 2 * HALO + par + tx;
      }
      float av = 0.0f, bv = 0.0f;
      get2_ll(a_slot, b_slot, stamp, av, bv);
      if (a_dst) *a_dst = av;
      if (b_dst) *b_dst = bv;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; r++) {
      if (in[r]) {
        const int sy = ty * R + r + 1, sx = tx + 1;
        const float c = u[r];
        const float lap = s[sy][sx - 1] + s[sy][sx + 1] + s[sy - 1][sx] + s[sy + 1][sx] - 4.0f * c;
        const float next = (2.0f * c + c2 * lap) - p[r];
        p[r] = c;
        u[r] = next;
      }
    }
    __syncthreads();  // every thread has read `s` before the next step overwrites it
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    if (in[r]) {
      int k = (by * TH + ty * R + r + 1) * stride + x + 1;
      cur[k] = u[r];
      prev[k] = p[r];
    }
  }
}

// NAME_R: the entry point of template BODY<R>, one block of 512 threads per SM.
#define WAVE_RESIDENT(NAME, BODY, R)                                                                           \
  extern "C" __global__ void __launch_bounds__(512, 1)                                                         \
      NAME##_##R(float* prev, float* cur, unsigned long long* halo, int nx, int ny, float c2, unsigned base,    \
                 int steps, int tiles_x) {                                                                     \
    BODY<R>(prev, cur, halo, nx, ny, c2, base, steps, tiles_x);                                                \
  }
WAVE_RESIDENT(wave_resident, resident, 1)
WAVE_RESIDENT(wave_resident, resident, 2)
WAVE_RESIDENT(wave_resident, resident, 4)
WAVE_RESIDENT(wave_resident, resident, 8)
WAVE_RESIDENT(wave_resident, resident, 16)

// wave_resident_h2_R: the register-resident tile actors exchanging halos of two cells,
// once every two steps. A period of two steps: each tile publishes its outer two rows and
// columns of u (level s) and its outer row and column of p (level s - 1), as stamped words
// (stamp: the period's), then reads its eight neighbours' (the diagonal ones give the
// corners); step one computes level s + 1 on the tile and on the ring of cells around it
// (the ring needs u two cells out and p one cell out), into shared memory; step two
// computes level s + 2 on the tile from that. One wait for the neighbours per two steps,
// at the price of the ring's cells computed twice (by the tile and by its neighbour).
// Two slots per tile (by the period's parity), as for wave_resident_R: a tile overwrites
// slot q & 1 with period q + 2 only after reading its neighbours' period q + 1 words,
// which they published after reading its period q words. A period of one step ends a run
// of odd length.
//
// Slot layout per tile and parity (HALO2 words): [0, 2TW) u rows 0, 1; [2TW, 4TW) u rows
// TH - 2, TH - 1; [4TW, 4TW + 2TH) u columns 0, 1 (row-major: y * 2 + c); then columns
// TW - 2, TW - 1 the same way; then p: row 0 (TW), row TH - 1 (TW), column 0 (TH), column
// TW - 1 (TH).

template <int R>
__device__ __forceinline__ void resident_h2(float* prev, float* cur, unsigned long long* halo, int nx, int ny,
                                            float c2, unsigned base, int steps, int tiles_x) {
  constexpr int TW = 32;
  constexpr int TH = 16 * R;
  constexpr int TOPU = 0, BOTU = 2 * TW, LEFTU = 4 * TW, RIGHTU = 4 * TW + 2 * TH;
  constexpr int TOPP = 4 * TW + 4 * TH, BOTP = TOPP + TW, LEFTP = TOPP + 2 * TW, RIGHTP = LEFTP + TH;
  constexpr int HALO2 = 6 * TW + 6 * TH;
  constexpr int NU = 4 * TW + 4 * TH + 16;  // u words a tile reads (corners: 2 x 2 each)
  constexpr int NP = 2 * TW + 2 * TH + 4;   // p words
  __shared__ float su[TH + 4][TW + 4];  // level s, halo 2 (offset 2)
  __shared__ float sp[TH + 2][TW + 2];  // level s - 1, on the ring only (offset 1)
  __shared__ float sv[TH + 2][TW + 2];  // level s + 1, tile and ring (offset 1)
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 32 + tx;
  const int tile = blockIdx.x;
  const int tiles_y = gridDim.x / tiles_x;
  const int bx = tile % tiles_x, by = tile / tiles_x;
  const int gx0 = bx * TW, gy0 = by * TH;  // the tile's first interior cell
  const int x = gx0 + tx;
  const int stride = nx + 2;
  const bool has_l = bx > 0, has_r = bx < tiles_x - 1, has_u = by > 0, has_d = by < tiles_y - 1;
  auto slot = [&](int dx, int dy) -> const unsigned long long* {
    return halo + (long long)(tile + dy * tiles_x + dx) * 2 * HALO2;
  };
  unsigned long long* mine = halo + (long long)tile * 2 * HALO2;
  float u[R], p[R], v[R];
  bool in[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    int y = gy0 + ty * R + r;
    in[r] = x < nx && y < ny;
    int k = (y + 1) * stride + x + 1;
    u[r] = in[r] ? cur[k] : 0.0f;
    p[r] = in[r] ? prev[k] : 0.0f;
  }
  // This thread's (at most two) words to read each period: task q < NU is a u word, then
  // NP p words. The source is the neighbour's slot of parity 0 (null: no neighbour, the
  // cell stays 0); the destination a shared-memory cell.
  static_assert(NU + NP <= 2 * 512, "two read tasks per thread");
  const unsigned long long* task_src[2] = {nullptr, nullptr};
  float* task_dst[2] = {nullptr, nullptr};
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int q = tid + h * 512;
    if (q >= NU + NP) break;
    const unsigned long long* s = nullptr;
    float* d = nullptr;
    if (q < 2 * TW) {  // rows -2, -1 from the tile above
      int j = q / TW, c = q % TW;
      d = &su[j][c + 2];
      if (has_u) s = slot(0, -1) + BOTU + j * TW + c;
    } else if ((q -= 2 * TW) < 2 * TW) {  // rows TH, TH + 1 from the tile below
      int j = q / TW, c = q % TW;
      d = &su[TH + 2 + j][c + 2];
      if (has_d) s = slot(0, 1) + TOPU + j * TW + c;
    } else if ((q -= 2 * TW) < 2 * TH) {  // columns -2, -1 from the left
      int y = q / 2, c = q % 2;
      d = &su[y + 2][c];
      if (has_l) s = slot(-1, 0) + RIGHTU + y * 2 + c;
    } else if ((q -= 2 * TH) < 2 * TH) {  // columns TW, TW + 1 from the right
      int y = q / 2, c = q % 2;
      d = &su[y + 2][TW + 2 + c];
      if (has_r) s = slot(1, 0) + LEFTU + y * 2 + c;
    } else if ((q -= 2 * TH) < 16) {  // the four 2 x 2 corners
      int k = q / 4, cy = (q % 4) / 2, cx = q % 2;
      int dx = (k & 1) ? 1 : -1, dy = (k & 2) ? 1 : -1;
      d = &su[dy < 0 ? cy : TH + 2 + cy][dx < 0 ? cx : TW + 2 + cx];
      if ((dx < 0 ? has_l : has_r) && (dy < 0 ? has_u : has_d))
        s = slot(dx, dy) + (dy < 0 ? BOTU : TOPU) + cy * TW + (dx < 0 ? TW - 2 + cx : cx);
    } else if ((q -= 16) < TW) {  // p: row -1
      d = &sp[0][q + 1];
      if (has_u) s = slot(0, -1) + BOTP + q;
    } else if ((q -= TW) < TW) {  // row TH
      d = &sp[TH + 1][q + 1];
      if (has_d) s = slot(0, 1) + TOPP + q;
    } else if ((q -= TW) < TH) {  // column -1
      d = &sp[q + 1][0];
      if (has_l) s = slot(-1, 0) + RIGHTP + q;
    } else if ((q -= TH) < TH) {  // column TW
      d = &sp[q + 1][TW + 1];
      if (has_r) s = slot(1, 0) + LEFTP + q;
    } else {  // the four corner cells
      q -= TH;
      int dx = (q & 1) ? 1 : -1, dy = (q & 2) ? 1 : -1;
      d = &sp[dy < 0 ? 0 : TH + 1][dx < 0 ? 0 : TW + 1];
      if ((dx < 0 ? has_l : has_r) && (dy < 0 ? has_u : has_d))
        s = slot(dx, dy) + (dy < 0 ? BOTP : TOPP) + (dx < 0 ? TW - 1 : 0);
    }
    task_src[h] = s;
    task_dst[h] = d;
  }
  // This thread's ring cell (at most one: 2TW + 2TH + 4 <= 512), tile coordinates.
  const int nring = 2 * TW + 2 * TH + 4;
  static_assert(2 * TW + 2 * TH + 4 <= 512, "one ring cell per thread");
  int rlx = 0, rly = 0;
  bool ring_in = false;
  if (tid < nring) {
    const int q = tid;
    if (q < TW + 2) {
      rlx = q - 1;
      rly = -1;
    } else if (q < 2 * TW + 4) {
      rlx = q - (TW + 2) - 1;
      rly = TH;
    } else if (q < 2 * TW + 4 + TH) {
      rlx = -1;
      rly = q - (2 * TW + 4);
    } else {
      rlx = TW;
      rly = q - (2 * TW + 4 + TH);
    }
    const int gx = gx0 + rlx, gy = gy0 + rly;
    ring_in = gx >= 0 && gx < nx && gy >= 0 && gy < ny;
  }
  for (int i = 0; 2 * i < steps; i++) {
    const unsigned stamp = base + 2u * (unsigned)i + 1u;
    const int par = (i & 1) * HALO2;
    const bool two = 2 * i + 1 < steps;
    // Publish: u two cells deep, p one deep (only what a neighbour will read).
    unsigned long long* out = mine + par;
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int ly = ty * R + r;
      if (ly < 2) put_ll(out + TOPU + ly * TW + tx, u[r], stamp);
      if (ly >= TH - 2) put_ll(out + BOTU + (ly - (TH - 2)) * TW + tx, u[r], stamp);
      if (tx < 2) put_ll(out + LEFTU + ly * 2 + tx, u[r], stamp);
      if (tx >= TW - 2) put_ll(out + RIGHTU + ly * 2 + (tx - (TW - 2)), u[r], stamp);
      if (ly == 0) put_ll(out + TOPP + tx, p[r], stamp);
      if (ly == TH - 1) put_ll(out + BOTP + tx, p[r], stamp);
      if (tx == 0) put_ll(out + LEFTP + ly, p[r], stamp);
      if (tx == TW - 1) put_ll(out + RIGHTP + ly, p[r], stamp);
      su[ly + 2][tx + 2] = u[r];
    }
    // Read the neighbours' words (the tasks worked out before the loop), both in flight.
    {
      float a = 0.0f, b = 0.0f;
      get2_ll(task_src[0] ? task_src[0] + par : nullptr, task_src[1] ? task_src[1] + par : nullptr, stamp, a,
              b);
      if (task_dst[0]) *task_dst[0] = a;
      if (task_dst[1]) *task_dst[1] = b;
    }
    __syncthreads();
    // Step one: level s + 1 on the tile (registers) and on the ring (shared memory).
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int ly = ty * R + r;
      const float c = u[r];
      const float lap = su[ly + 2][tx + 1] + su[ly + 2][tx + 3] + su[ly + 1][tx + 2] + su[ly + 3][tx + 2] - 4.0f * c;
      v[r] = in[r] ? (2.0f * c + c2 * lap) - p[r] : 0.0f;
      sv[ly + 1][tx + 1] = v[r];
    }
    if (two && tid < nring) {
      float nv = 0.0f;
      if (ring_in) {
        const float c = su[rly + 2][rlx + 2];
        const float lap =
            su[rly + 2][rlx + 1] + su[rly + 2][rlx + 3] + su[rly + 1][rlx + 2] + su[rly + 3][rlx + 2] - 4.0f * c;
        nv = (2.0f * c + c2 * lap) - sp[rly + 1][rlx + 1];
      }
      sv[rly + 1][rlx + 1] = nv;
    }
    __syncthreads();
    if (!two) {
#pragma unroll
      for (int r = 0; r < R; r++) {
        p[r] = u[r];
        u[r] = v[r];
      }
      break;
    }
    // Step two: level s + 2 on the tile.
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int ly = ty * R + r;
      const float c = v[r];
      const float lap = sv[ly + 1][tx] + sv[ly + 1][tx + 2] + sv[ly][tx + 1] + sv[ly + 2][tx + 1] - 4.0f * c;
      const float next = in[r] ? (2.0f * c + c2 * lap) - u[r] : 0.0f;
      p[r] = c;
      u[r] = next;
    }
    // The next period writes su (read only before the barrier above) and, after its
    // first barrier, sv (read here): no further barrier needed.
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    if (in[r]) {
      int k = (gy0 + ty * R + r + 1) * stride + x + 1;
      cur[k] = u[r];
      prev[k] = p[r];
    }
  }
}

WAVE_RESIDENT(wave_resident_h2, resident_h2, 1)
WAVE_RESIDENT(wave_resident_h2, resident_h2, 2)
WAVE_RESIDENT(wave_resident_h2, resident_h2, 4)
