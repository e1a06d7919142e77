// A CPU emulation of cuda_wave.cu's wave_resident_R and wave_resident_h2_R kernels, for tests/cuda_emu.rs: every
// CUDA thread an OS thread, a barrier per block, the PTX volatile 64-bit loads and stores
// as relaxed atomics. kernel_emu.inc is the kernel source with those three substitutions,
// written by the test. Usage: emu R nx ny steps1 steps2 h2 (two launches, the stamps going
// on; h2 = 1: the two-cell-halo kernel);
// exit status 0 when both fields equal a plain C++ reference bit for bit.
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
struct dim3 { int x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::vector<std::unique_ptr<std::barrier<>>> bars;
std::vector<std::vector<float>> shm;
inline void __syncthreads() { bars[blockIdx.x]->arrive_and_wait(); }
inline float* shared_for_block(int b) { return shm[b].data(); }
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(a, b)
#define __restrict__
inline float __ldcg(const float* p) { return *p; }
inline void __nanosleep(unsigned) {}
inline void __threadfence() {}
inline unsigned atomicExch(unsigned* p, unsigned v) { unsigned o = *p; *p = v; return o; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
#include "kernel_emu.inc"

template <typename F>
void launch(int blocks, F f) {
  gridDim.x = blocks; blockDim.x = 32; blockDim.y = 16;
  bars.clear(); shm.assign(blocks, std::vector<float>(300 * 40));
  for (int b = 0; b < blocks; b++) bars.emplace_back(new std::barrier<>(512));
  std::vector<std::thread> ts;
  for (int b = 0; b < blocks; b++)
    for (int ty = 0; ty < 16; ty++)
      for (int tx = 0; tx < 32; tx++)
        ts.emplace_back([=] { blockIdx.x = b; threadIdx.x = tx; threadIdx.y = ty; f(); });
  for (auto& t : ts) t.join();
}

int main(int argc, char** argv) {
  int R = atoi(argv[1]), nx = atoi(argv[2]), ny = atoi(argv[3]);
  int s1 = atoi(argv[4]), s2 = atoi(argv[5]), h2 = argc > 6 ? atoi(argv[6]) : 0;
  int TH = 16 * R, HALO = h2 ? 6 * 32 + 6 * TH : 64 + 2 * TH;
  int tx_ = (nx + 31) / 32, ty_ = (ny + TH - 1) / TH, tiles = tx_ * ty_;
  int st = nx + 2;
  std::vector<float> prev((ny + 2) * st, 0.f), cur((ny + 2) * st, 0.f);
  srand(7);
  for (int y = 1; y <= ny; y++)
    for (int x = 1; x <= nx; x++) { cur[y * st + x] = rand() / (float)RAND_MAX - 0.5f; prev[y * st + x] = rand() / (float)RAND_MAX - 0.5f; }
  std::vector<float> rp = prev, rc = cur;
  std::vector<unsigned long long> halo((size_t)tiles * 2 * HALO, 0);
  float c2 = 0.25f;
  unsigned base = 0;
  for (int steps : {s1, s2}) {
    auto run = [&] {
      float* P = prev.data(); float* C = cur.data(); unsigned long long* H = halo.data();
      if (h2) {
        switch (R) {
          case 1: wave_resident_h2_1(P, C, H, nx, ny, c2, base, steps, tx_); break;
          case 2: wave_resident_h2_2(P, C, H, nx, ny, c2, base, steps, tx_); break;
          case 4: wave_resident_h2_4(P, C, H, nx, ny, c2, base, steps, tx_); break;
          default: printf("R must be 1, 2 or 4 with h2\n"); exit(2);
        }
        return;
      }
      switch (R) {
        case 1: wave_resident_1(P, C, H, nx, ny, c2, base, steps, tx_); break;
        case 2: wave_resident_2(P, C, H, nx, ny, c2, base, steps, tx_); break;
        case 4: wave_resident_4(P, C, H, nx, ny, c2, base, steps, tx_); break;
        case 8: wave_resident_8(P, C, H, nx, ny, c2, base, steps, tx_); break;
        case 16: wave_resident_16(P, C, H, nx, ny, c2, base, steps, tx_); break;
        default: printf("R must be 1, 2, 4, 8 or 16\n"); exit(2);
      }
    };
    launch(tiles, run);
    base += steps;
  }
  for (int k = 0; k < s1 + s2; k++) {  // reference, as the CPU engine: p <- update(u, p); swap
    for (int y = 1; y <= ny; y++)
      for (int x = 1; x <= nx; x++) {
        int i = y * st + x; float c = rc[i];
        float lap = rc[i - 1] + rc[i + 1] + rc[i - st] + rc[i + st] - 4.0f * c;
        rp[i] = (2.0f * c + c2 * lap) - rp[i];
      }
    std::swap(rp, rc);
  }
  double err = 0, mx = 0;
  for (size_t i = 0; i < cur.size(); i++) { err = fmax(err, fabs(cur[i] - rc[i])); err = fmax(err, fabs(prev[i] - rp[i])); mx = fmax(mx, fabs(rc[i])); }
  printf("R=%d%s %dx%d tiles %d steps %d+%d: max err %g of %g\n", R, h2 ? " h2" : "", nx, ny, tiles, s1, s2, err,
         mx);
  return err == 0 ? 0 : 1;
}
