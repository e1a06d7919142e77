// What a persistent kernel can reach with stamped slots, measured in one run beside the
// flag floor (issue 12). Each experiment is the smallest kernel that does the protocol
// the runtime would do, so the runtime's own figures can be read against it.
//
//   nvcc -O3 -arch=native -std=c++17 -o /tmp/sfloor notes/cuda_stamped_floor.cu -lpthread && /tmp/sfloor
//
// Stamped slots: a logical slot (64-byte message header + payload) is stored as 16-byte
// units, 12 data bytes and a 4-byte stamp (the message's ring index + 1). The writer
// stores each unit with one 16-byte store; a reader whose 16-byte load sees the right
// stamp has that unit's data, so a warp reads a whole slot in one round trip and needs
// no index and no fence.
//
// E1 flag ping-pong (the floor): host writes a word, one device thread echoes it.
// E2 stamped echo, one warp: host writes U units, the warp polls them all at once,
//    checks stamps, echoes U stamped units into a host-memory reply ring; host polls.
//    Variants: + a doorbell word read in the same poll; + full "runtime" work in the
//    warp (header checks, HLC merge, reply header).
//    Mode bit 2: a second snapshot of the slot, STAG cycles after the first (compile
//    with -DSTAG=N, default 1500), as the runtime's one-message loop polls.
// E7 E2 with 1-4 warps polling the same slot, one read at a time each, started a
//    fraction of a read's round trip apart; the warp that finds the message claims it
//    with a compare-and-swap and replies (notes/cuda-two-pollers.patch tried the same
//    in the runtime).
// E9 E2 + runtime work split: 1 or 2 warps poll and stage a complete message in shared
//    memory; warp 0 reads no host memory, waits on shared memory, and replies.
// E3 E2 inside a 256-thread block where warp 0 polls and the block synchronises twice
//    per message (the cost of block-wide structure on the latency path).
// E4 streaming: a producer thread writes stamped 128-byte slots (64-B payload) into a
//    64K-slot ring and a doorbell per batch; a 1024-thread block reads windows sized by
//    the doorbell, writes stamped replies; a consumer thread validates and counts.
//    Beside it: the host->device read and device->host write bandwidth of one block.
// E5 K2K in device memory: one-way latency block A -> block B (device clock), and
//    throughput of 128 sender threads (4 warps, warp-aggregated reservations) into one
//    receiving block.
#ifdef __CUDACC_RTC__
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#endif

#define UNIT 16
#ifndef STAG
#define STAG 1500
#endif
#define RK_STR2(x) #x
#define RK_STR(x) RK_STR2(x)
#define UDATA 12

__device__ __forceinline__ uint4 ldv(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void stv(void* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w) : "memory");
}
__device__ __forceinline__ uint64_t gtimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t ld_acq_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_rel_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

extern "C" __global__ void e1_flag(volatile uint64_t* in, volatile uint64_t* out, uint64_t n) {
  for (uint64_t s = 1; s <= n; s++) {
    while (in[0] != s) {
    }
    out[0] = s;
  }
}

// Minimal HLC work on one lane (same arithmetic as ringkernel.cuh).
__device__ __forceinline__ uint64_t hlc_merge(uint64_t st, uint64_t remote, uint64_t pt) {
  uint64_t l = st >> 20, c = st & 0xFFFFF, ml = remote >> 20, mc = remote & 0xFFFFF;
  uint64_t nl = l > ml ? l : ml;
  if (pt > nl) nl = pt;
  uint64_t nc = (nl == l && nl == ml) ? (c > mc ? c : mc) + 1 : (nl == l ? c + 1 : (nl == ml ? mc + 1 : 0));
  return (nl << 20) | nc;
}

// E2: one warp. mode bit 0: also read a doorbell word each poll; bit 1: runtime work.
// Slot index i lives at units[(i & mask) * U]. Replies go to out (same layout).
extern "C" __global__ void e2_stamped(const uint4* in, uint4* out, const uint32_t* doorbell, int U, uint64_t n,
                                      uint64_t mask, int mode, uint64_t* dev_ns) {
  __shared__ uint4 s[32];
  const int lane = threadIdx.x & 31;
  uint64_t hlc = 0, t_work = 0;
  for (uint64_t i = 0; i < n; i++) {
    const uint32_t want = (uint32_t)(i + 1);
    const uint4* slot = in + (i & mask) * U;
    uint4 v;
    for (;;) {
      uint32_t db = want;
      if ((mode & 1) && lane == 0) db = *(volatile const uint32_t*)doorbell;
      v = lane < U ? ldv(slot + lane) : make_uint4(0, 0, 0, want);
      // mode bit 2: a second snapshot of the slot, issued STAG cycles after the first
      // and used when the first is not complete (the runtime's staggered poll).
      uint4 v2 = v;
      if (mode & 4) {
        const long long c0 = clock64();
        while (clock64() - c0 < STAG) {
        }
        v2 = lane < U ? ldv(slot + lane) : make_uint4(0, 0, 0, want);
      }
      // Header unit 1 holds payload_len (bytes 12..15 of the header = unit 1 word 0).
      uint32_t len = __shfl_sync(0xffffffffu, v.x, 1);
      int used = (int)((64 + len + UDATA - 1) / UDATA);
      if (used > U) used = U;
      // The doorbell only costs its read here (it is always nonzero once sent).
      bool ok = (lane >= used || v.w == want) && db != 0u;
      if (__all_sync(0xffffffffu, ok)) break;
      if (mode & 4) {
        v = v2;
        len = __shfl_sync(0xffffffffu, v.x, 1);
        used = (int)((64 + len + UDATA - 1) / UDATA);
        if (used > U) used = U;
        ok = (lane >= used || v.w == want) && db != 0u;
        if (__all_sync(0xffffffffu, ok)) break;
      }
    }
    uint64_t t0 = gtimer();
    if (mode & 2) {
      // Runtime-like work: stage the slot in shared memory, check the header, merge
      // the clock, build the reply header.
      if (lane < U) s[lane] = v;
      __syncwarp();
      if (lane == 0) {
        uint32_t magic = s[0].x;
        uint64_t ts = ((uint64_t)s[3].x) | ((uint64_t)s[3].y << 32);
        if (magic != 0x474D4B52u) ts = 0;
        hlc = hlc_merge(hlc, ts, t0 / 1000000ull);
        s[0].y = (uint32_t)hlc;
      }
      __syncwarp();
      v = lane < U ? s[lane] : v;
    }
    if (lane < U) {
      v.y += 1;
      v.w = want;
      stv(out + (i & mask) * U + lane, v);
    }
    if (mode & 2) t_work += gtimer() - t0;
  }
  if (lane == 0 && dev_ns) *dev_ns = t_work;
}

// E3: as E2 (mode 0) inside a block: warp 0 polls, two block barriers per message, the
// reply written by warp 0.
extern "C" __global__ void e3_block(const uint4* in, uint4* out, int U, uint64_t n, uint64_t mask) {
  __shared__ uint4 s[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (uint64_t i = 0; i < n; i++) {
    const uint32_t want = (uint32_t)(i + 1);
    if (warp == 0) {
      const uint4* slot = in + (i & mask) * U;
      uint4 v;
      for (;;) {
        v = lane < U ? ldv(slot + lane) : make_uint4(0, 0, 0, want);
        if (__all_sync(0xffffffffu, lane >= U || v.w == want)) break;
      }
      if (lane < U) s[lane] = v;
    }
    __syncthreads();
    if (warp == 0 && lane < U) {
      uint4 v = s[lane];
      v.y += 1;
      stv(out + (i & mask) * U + lane, v);
    }
    __syncthreads();
  }
}

// E4: streaming. The doorbell is the producer's tail (u64, host memory) and only sizes
// the window; the stamps decide what is there (the longest valid prefix is taken, the
// rest read again next round). `head` (host memory) is the block's progress for the
// producer, `ohead` the host consumer's progress on the reply ring. stats[0] counts
// windows in which a unit the doorbell announced was not there yet (a read of host
// memory that returned older data than a read before it), stats[1] the windows.
// acq: read the doorbell with ld.acquire.sys instead of a volatile load.
extern "C" __global__ void e4_stream(const uint4* in, uint4* out, const uint64_t* doorbell,
                                     volatile uint64_t* head, const volatile uint64_t* ohead, int U,
                                     uint64_t n, uint64_t mask, uint64_t omask, int maxw, int acq,
                                     unsigned long long* stats) {
  __shared__ uint64_t s_avail;
  __shared__ int s_first_bad;
  const int tid = threadIdx.x, nt = blockDim.x;
  uint64_t h = 0, seen_tail = 0, oh_seen = 0;
  unsigned long long stale = 0, windows = 0;
  while (h < n) {
    if (tid == 0) {
      uint64_t t = seen_tail;
      if (t == h) {
        if (acq) {
          asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(t) : "l"(doorbell) : "memory");
        } else {
          t = *(volatile const uint64_t*)doorbell;
        }
        seen_tail = t;
      }
      uint64_t w = t - h;
      if (w > (uint64_t)maxw) w = maxw;
      if (h + w - oh_seen > omask + 1) {
        oh_seen = *ohead;
        if (h + w - oh_seen > omask + 1) w = oh_seen + omask + 1 - h;
      }
      s_avail = w;
      s_first_bad = (int)w;
    }
    __syncthreads();
    const uint64_t w = s_avail;
    if (w == 0) {
      __syncthreads();
      continue;
    }
    // At most 4 units a thread (maxw * U <= 4 * blockDim), kept in registers.
    const uint64_t total = w * (uint64_t)U;
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      uint64_t u = (uint64_t)k * nt + tid;
      if (u < total) v[k] = ldv(in + ((h + u / U) & mask) * U + u % U);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
      uint64_t u = (uint64_t)k * nt + tid;
      if (u < total && v[k].w != (uint32_t)(h + u / U + 1)) atomicMin(&s_first_bad, (int)(u / U));
    }
    __syncthreads();
    const uint64_t took = (uint64_t)s_first_bad;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      uint64_t u = (uint64_t)k * nt + tid;
      if (u < took * U) {
        v[k].y += 1;
        stv(out + ((h + u / U) & omask) * U + u % U, v[k]);
      }
    }
    __syncthreads();
    windows++;
    if (took < w) stale++;
    h += took;
    if (tid == 0 && took) *head = h;
  }
  if (tid == 0) {
    stats[0] = stale;
    stats[1] = windows;
  }
}

// Bandwidth of one block: read `bytes` of host memory (16-B loads, 4 in flight per
// thread), or write them.
extern "C" __global__ void e4_bw(uint4* p, uint64_t units, int write, uint64_t* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  const int tid = threadIdx.x + blockIdx.x * blockDim.x, nt = blockDim.x * gridDim.x;
  for (uint64_t base = 0; base < units; base += 4ull * nt) {
    if (write) {
#pragma unroll
      for (int k = 0; k < 4; k++) {
        uint64_t u = base + (uint64_t)k * nt + tid;
        if (u < units) stv(p + u, make_uint4(u, 1, 2, 3));
      }
    } else {
      uint4 v[4];
#pragma unroll
      for (int k = 0; k < 4; k++) {
        uint64_t u = base + (uint64_t)k * nt + tid;
        v[k] = u < units ? ldv(p + u) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int k = 0; k < 4; k++) acc.x ^= v[k].x ^ v[k].w;
    }
  }
  if (acc.x == 0x12345678u) sink[0] = acc.x;
}

// E5a: K2K latency. Block 0 sends message i (U units with its send time) into block 1's
// inbox (device memory, stamped), then waits for block 1's ack word; block 1 polls with
// one warp and records globaltimer - send time.
extern "C" __global__ void e5_latency(uint4* inbox, uint64_t* ack, int U, uint64_t n, uint64_t* lat_ns) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x >= 32) return;
  for (uint64_t i = 0; i < n; i++) {
    const uint32_t want = (uint32_t)(i + 1);
    uint4* slot = inbox + (i & 63) * U;
    if (blockIdx.x == 0) {
      uint64_t t = gtimer();
      if (lane < U) stv(slot + lane, make_uint4((uint32_t)t, (uint32_t)(t >> 32), lane, want));
      if (lane == 0)
        while (ld_acq_gpu(ack) != i + 1) {
        }
      __syncwarp();
    } else {
      uint4 v;
      for (;;) {
        v = lane < U ? ldv(slot + lane) : make_uint4(0, 0, 0, want);
        if (__all_sync(0xffffffffu, lane >= U || v.w == want)) break;
      }
      if (lane == 0) {
        uint64_t sent = (uint64_t)v.x | ((uint64_t)v.y << 32);
        lat_ns[i] = gtimer() - sent;
        st_rel_gpu(ack, i + 1);
      }
      __syncwarp();
    }
  }
}

// E5b: K2K throughput. Blocks 0..S-1 hold the senders (threads < 32*SW): each sender
// thread sends `per` messages; a warp reserves its slots with one CAS on `reserve`
// (as many as fit), writes them stamped, retries the rest. Block S receives: reads
// windows of ready slots, counts them, publishes `head`.
extern "C" __global__ void e5_tput(uint4* inbox, uint64_t* reserve, uint64_t* head, int U, uint64_t per,
                                   int senders_per_block, uint64_t cap, uint64_t* done) {
  const int tid = threadIdx.x, lane = tid & 31;
  const uint64_t mask = cap - 1;
  if (blockIdx.x + 1 < gridDim.x) {
    if (tid >= senders_per_block) return;
    uint64_t left = per;
    while (__any_sync(0xffffffffu, left > 0)) {
      const unsigned want_mask = __ballot_sync(0xffffffffu, left > 0);
      const int want = __popc(want_mask);
      uint64_t base = 0;
      int got = 0;
      if (lane == 0) {
        uint64_t idx = *(volatile uint64_t*)reserve;
        for (;;) {
          uint64_t hd = ld_acq_gpu(head);
          uint64_t room = cap - (idx - hd);
          got = room < (uint64_t)want ? (int)room : want;
          if (got == 0) break;
          uint64_t seen = atomicCAS((unsigned long long*)reserve, idx, idx + got);
          if (seen == idx) break;
          idx = seen;
        }
        base = idx;
      }
      got = __shfl_sync(0xffffffffu, got, 0);
      base = __shfl_sync(0xffffffffu, base, 0);
      const int rank = __popc(want_mask & ((1u << lane) - 1));
      if (left > 0 && rank < got) {
        const uint64_t idx = base + rank;
        uint4* slot = inbox + (idx & mask) * U;
        const uint64_t t = gtimer();
        for (int j = 0; j < U; j++)
          stv(slot + j, make_uint4((uint32_t)t, (uint32_t)(t >> 32), j, (uint32_t)(idx + 1)));
        left--;
      }
      if (got == 0) __nanosleep(32);
    }
  } else {
    __shared__ int s_first_bad;
    const uint64_t total = per * senders_per_block * (gridDim.x - 1);
    uint64_t h = 0;
    const int per_round = blockDim.x / U;  // slots checked per round, one unit a thread
    while (h < total) {
      // Thread t checks unit t % U of slot h + t / U; the round takes the longest
      // prefix of whole slots.
      bool ok = true;
      const int m = tid / U, j = tid % U;
      if (m < per_round) {
        uint4 v = ldv(inbox + ((h + m) & mask) * U + j);
        ok = v.w == (uint32_t)(h + m + 1);
      }
      if (tid == 0) s_first_bad = per_round;
      __syncthreads();
      if (m < per_round && !ok) atomicMin(&s_first_bad, m);
      __syncthreads();
      const int took = s_first_bad;
      h += took;
      if (tid == 0 && took) st_rel_gpu(head, h);
      __syncthreads();
    }
    if (tid == 0) *done = h;
  }
}

// E6: E2 (22 units, one warp) plus what the runtime does beside the reply, one at a
// time: bit 0 a latency-ring store, bit 1 six counter stores to a control line, bit 2
// membar.cta after them, bit 3 membar.gl after them, bit 4 two extra 16-byte loads
// (lane tails, command line) in every poll, bit 5 a shared-memory lock + smem atomics
// around a decide step.
extern "C" __global__ void e6_side(const uint4* in, uint4* out, uint64_t* lat, uint64_t* cbp, const uint4* extra,
                                   int U, uint64_t n, uint64_t mask, int bits) {
  __shared__ unsigned s_lock;
  __shared__ unsigned long long s_cnt[8];
  const int lane = threadIdx.x & 31;
  if (lane == 0) { s_lock = 0; for (int i = 0; i < 8; i++) s_cnt[i] = 0; }
  __syncwarp();
  for (uint64_t i = 0; i < n; i++) {
    const uint32_t want = (uint32_t)(i + 1);
    const uint4* slot = in + (i & mask) * U;
    uint4 v;
    for (;;) {
      uint4 e0 = make_uint4(1, 1, 1, 1), e1 = make_uint4(1, 1, 1, 1);
      if ((bits & 16) && lane == 0) { e0 = ldv(extra); e1 = ldv(extra + 8); }
      v = lane < U ? ldv(slot + lane) : make_uint4(0, 0, 0, want);
      bool ok = (lane >= U || v.w == want) && (e0.x | e1.x) != 0xFFFFFFFFu;
      if (__all_sync(0xffffffffu, ok)) break;
    }
    if ((bits & 32) && lane == 0) {
      while (atomicCAS(&s_lock, 0u, 1u) != 0u) {}
      __threadfence_block();
      for (int j = 0; j < 8; j++) atomicAdd(&s_cnt[j], 1ull);
      __threadfence_block();
      atomicExch(&s_lock, 0u);
    }
    __syncwarp();
    if (lane < U) {
      v.y += 1;
      v.w = want;
      stv(out + (i & mask) * U + lane, v);
    }
    if (lane == 0) {
      if (bits & 1) ((volatile uint64_t*)lat)[i & 4095] = (i << 32) | 7;
      if (bits & 2) for (int j = 0; j < 6; j++) ((volatile uint64_t*)cbp)[2 + j] = i + j;
      if (bits & 4) __threadfence_block();
      if (bits & 8) __threadfence();
    }
    __syncwarp();
  }
}

// E8: E2 (22 units, one warp) in conditions closer to the runtime's: `in`/`out` rings
// of `mask + 1` slots, optionally a latency-ring store per message (`lat`, 32K
// entries, advancing), `prof` stores per poll (advancing through a 4-MB ring), and the
// two announcement loads per poll.
extern "C" __global__ void e8_env(const uint4* in, uint4* out, uint64_t* lat, uint64_t* prof, const uint4* extra,
                                  int U, uint64_t n, uint64_t mask, int prof_stores, int extra_loads) {
  const int lane = threadIdx.x & 31;
  uint64_t polls = 0;
  for (uint64_t i = 0; i < n; i++) {
    const uint32_t want = (uint32_t)(i + 1);
    const uint4* slot = in + (i & mask) * U;
    uint4 v;
    for (;;) {
      uint4 e0 = make_uint4(1, 1, 1, 1), e1 = make_uint4(1, 1, 1, 1);
      if (extra_loads && lane == 0) { e0 = ldv(extra); e1 = ldv(extra + 8); }
      v = lane < U ? ldv(slot + lane) : make_uint4(0, 0, 0, want);
      bool ok = (lane >= U || v.w == want) && (e0.x | e1.x) != 0xFFFFFFFFu;
      if (lane == 0) {
        for (int j = 0; j < prof_stores; j++) ((volatile uint64_t*)prof)[(polls * 8 + j) & ((1 << 19) - 1)] = polls;
        polls++;
      }
      if (__all_sync(0xffffffffu, ok)) break;
    }
    if (lane < U) {
      v.y += 1;
      v.w = want;
      stv(out + (i & mask) * U + lane, v);
    }
    if (lat && lane == 0) ((volatile uint64_t*)lat)[i & 32767] = (i << 32) | 7;
    __syncwarp();
  }
}


// E7: E2 (mode 0) with `warps` warps polling the same slot, each a single load at a
// time; warp w starts w * `stag` cycles late, so their loads are spread over a read's
// round trip. The warp whose load finds the message complete claims it (a
// compare-and-swap of the shared next index) and replies; the others go on to the next.
extern "C" __global__ void e7_warps(const uint4* in, uint4* out, int U, uint64_t n, uint64_t mask, int stag) {
  __shared__ unsigned long long s_next;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) s_next = 0;
  __syncthreads();
  {
    const long long c0 = clock64();
    while (clock64() - c0 < (long long)warp * stag) {
    }
  }
  for (;;) {
    const uint64_t i = *(volatile unsigned long long*)&s_next;
    if (i >= n) break;
    const uint32_t want = (uint32_t)(i + 1);
    const uint4* slot = in + (i & mask) * U;
    uint4 v = lane < U ? ldv(slot + lane) : make_uint4(0, 0, 0, want);
    const bool ok = lane >= U || v.w == want;
    if (__all_sync(0xffffffffu, ok)) {
      unsigned long long won = 0;
      if (lane == 0) won = atomicCAS(&s_next, (unsigned long long)i, (unsigned long long)(i + 1)) == i;
      won = __shfl_sync(0xffffffffu, won, 0);
      if (won && lane < U) {
        v.y += 1;
        v.w = want;
        stv(out + (i & mask) * U + lane, v);
      }
    }
    __syncwarp();
  }
}


// E9: `pollers` warps (1 or 2, started `stag` cycles apart) read the slot one read at a
// time; the first to find it complete stages it in shared memory and publishes it (a
// compare-and-swap of the count staged; both stage the same bytes). Warp 0 reads no host
// memory: it waits on shared memory, does E2's runtime work on the staged copy (header
// check, clock merge, reply header) and replies. Two staging slots; a poller waits while
// both are full.
extern "C" __global__ void e9_staged(const uint4* in, uint4* out, int U, uint64_t n, uint64_t mask, int stag,
                                     int atomics) {
  __shared__ uint4 s_slot[2][32];
  __shared__ unsigned s_pub;   // messages staged so far
  __shared__ unsigned s_used;  // messages warp 0 has answered
  // `atomics`: warp 0 also takes the runtime's three 64-bit shared-memory atomics a
  // message (message index, clock compare-and-swap, output slot; the reply goes to
  // the slot the last one returns).
  __shared__ unsigned long long s_taken, s_hlc, s_out;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    s_pub = 0;
    s_used = 0;
    s_taken = 0;
    s_hlc = 0;
    s_out = 0;
  }
  __syncthreads();
  if (warp == 0) {
    uint64_t hlc = 0;
    for (uint64_t i = 0; i < n; i++) {
      while (*(volatile unsigned*)&s_pub <= (unsigned)i) {
      }
      __threadfence_block();
      const uint32_t want = (uint32_t)(i + 1);
      uint4* st = s_slot[i & 1];
      if (lane == 0) {
        const uint32_t magic = st[0].x;
        uint64_t ts = ((uint64_t)st[3].x) | ((uint64_t)st[3].y << 32);
        if (magic != 0x474D4B52u) ts = 0;
        hlc = hlc_merge(hlc, ts, gtimer() / 1000000ull);
        if (atomics) {
          const unsigned long long m = atomicAdd(&s_taken, 1ull);
          const unsigned long long old = *(volatile unsigned long long*)&s_hlc;
          hlc = atomicCAS(&s_hlc, old, hlc_merge(old, ts, m)) == old ? hlc : hlc + 1;
        }
        st[0].y = (uint32_t)hlc;
      }
      uint64_t oi = i;
      if (atomics) {
        unsigned long long o = 0;
        if (lane == 0) o = atomicAdd(&s_out, 1ull);
        oi = __shfl_sync(0xffffffffu, o, 0);
      }
      __syncwarp();
      if (lane < U) {
        uint4 v = st[lane];
        v.y += 1;
        v.w = want;
        stv(out + (oi & mask) * U + lane, v);
      }
      __syncwarp();
      __threadfence_block();
      if (lane == 0) *(volatile unsigned*)&s_used = (unsigned)(i + 1);
    }
    return;
  }
  {
    const long long c0 = clock64();
    while (clock64() - c0 < (long long)(warp - 1) * stag) {
    }
  }
  for (;;) {
    const unsigned i = __shfl_sync(0xffffffffu, *(volatile unsigned*)&s_pub, 0);
    if (i >= n) break;
    const unsigned used = __shfl_sync(0xffffffffu, *(volatile unsigned*)&s_used, 0);
    if (i - used >= 2u) continue;  // both staging slots full
    const uint32_t want = i + 1;
    const uint4* slot = in + (i & mask) * U;
    const uint4 v = lane < U ? ldv(slot + lane) : make_uint4(0, 0, 0, want);
    // (A poller whose read took so long that the message was answered meanwhile must
    // not stage it over a newer one: checked again before staging.)
    const bool complete = __all_sync(0xffffffffu, lane >= U || v.w == want);
    const bool fresh = __shfl_sync(0xffffffffu, (int)(*(volatile unsigned*)&s_pub == i), 0) != 0;
    if (complete && fresh) {
      if (lane < U) s_slot[i & 1][lane] = v;
      __syncwarp();
      __threadfence_block();
      if (lane == 0) atomicCAS(&s_pub, i, i + 1);
    }
    __syncwarp();
  }
}

#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>
#include <emmintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e = (x);                                                         \
    if (e != cudaSuccess) {                                                      \
      printf("CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__);     \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static void report(const char* name, std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  printf("%-64s p50 %6.2f us  p99 %6.2f us  (n=%zu)\n", name, v[v.size() / 2], v[v.size() * 99 / 100], v.size());
}
template <typename T>
static T* mapped(size_t bytes, T** dptr) {
  T* h;
  CK(cudaHostAlloc((void**)&h, bytes, cudaHostAllocMapped));
  memset((void*)h, 0, bytes);
  CK(cudaHostGetDevicePointer((void**)dptr, h, 0));
  return h;
}

// Host writes message i (U units) into slot i & mask: 16-byte stores, data then stamp in
// one store. Unit 1 word 0 carries the payload length so the reader knows `used`.
static inline void host_write(uint4* ring, uint64_t i, uint64_t mask, int U, uint32_t len) {
  uint4* slot = ring + (i & mask) * U;
  for (int u = 0; u < U; u++) {
    uint32_t w0 = u == 0 ? 0x474D4B52u : (u == 1 ? len : (uint32_t)(i * 7 + u));
    __m128i v = _mm_set_epi32((int)(uint32_t)(i + 1), (int)(uint32_t)u, (int)(uint32_t)i, (int)w0);
    _mm_store_si128((__m128i*)(slot + u), v);
  }
}
static inline bool host_poll(const uint4* ring, uint64_t i, uint64_t mask, int U) {
  const uint4* slot = ring + (i & mask) * U;
  for (int u = 0; u < U; u++) {
    __m128i v = _mm_load_si128((const __m128i*)(slot + u));
    if ((uint32_t)_mm_cvtsi128_si32(_mm_shuffle_epi32(v, 3)) != (uint32_t)(i + 1)) return false;
  }
  return true;
}

// The host side of E7 and E9: N messages one at a time through the U-unit slots of `hin`,
// each reply's data checked (unit 2, word 1 = i + 1); the round trips after the first
// 1,000, in microseconds.
static std::vector<double> ping_pong_checked(const char* tag, uint4* hin, uint4* hout, int U, uint64_t N,
                                             uint64_t mask) {
  std::vector<double> v;
  const uint32_t len = (uint32_t)(U * 12 - 64);
  for (uint64_t i = 0; i < N; i++) {
    double t0 = now_us();
    host_write(hin, i, mask, U, len);
    while (!host_poll(hout, i, mask, U)) {
    }
    double t1 = now_us();
    const uint32_t ry = ((volatile uint4*)hout)[(i & mask) * U + 2].y;
    if (ry != (uint32_t)i + 1) {
      printf("%s bad reply data at %llu: %u\n", tag, (unsigned long long)i, ry);
      exit(1);
    }
    if (i >= 1000) v.push_back(t1 - t0);
  }
  return v;
}

int main(int argc, char** argv) {
  const uint64_t N = argc > 1 ? atoll(argv[1]) : 30000;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  CK(cudaSetDeviceFlags(cudaDeviceMapHost));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // ---- E1 ----
  {
    uint64_t *din, *dout;
    uint64_t* hin = mapped<uint64_t>(4096, &din);
    uint64_t* hout = mapped<uint64_t>(4096, &dout);
    e1_flag<<<1, 1, 0, st>>>(din, dout, N);
    CK(cudaGetLastError());
    std::vector<double> v;
    volatile uint64_t *vin = hin, *vout = hout;
    for (uint64_t s = 1; s <= N; s++) {
      double t0 = now_us();
      vin[0] = s;
      while (vout[0] != s) {
      }
      double t1 = now_us();
      if (s > 1000) v.push_back(t1 - t0);
    }
    CK(cudaStreamSynchronize(st));
    report("E1 flag ping-pong (floor)", v);
  }

  // ---- E2 / E3 ----
  const uint64_t MASK = 1023;
  struct V {
    int U, mode, block;
    const char* name;
  } vars[] = {{6, 0, 0, "E2 stamped echo, 6 units (96 B), one warp"},
              {22, 0, 0, "E2 stamped echo, 22 units (256-B slot), one warp"},
              {22, 1, 0, "E2 + doorbell read in the same poll"},
              {22, 2, 0, "E2 + runtime work (stage, checks, HLC, reply header)"},
              {22, 4, 0, "E2 + staggered double poll (" RK_STR(STAG) " cycles apart)"},
              {22, 6, 0, "E2 + staggered double poll + runtime work"},
              {22, 0, 0, "E2 stamped echo, 22 units (again)"},
              {22, 6, 0, "E2 + staggered double poll + runtime work (again)"},
              {22, 2, 0, "E2 + runtime work (again)"},
              {22, 0, 1, "E3 22 units in a 256-thread block, 2 barriers/msg"}};
  for (auto& var : vars) {
    uint4 *din, *dout;
    uint32_t* ddb;
    uint64_t* dns;
    uint4* hin = mapped<uint4>((MASK + 1) * 32 * 16, &din);
    uint4* hout = mapped<uint4>((MASK + 1) * 32 * 16, &dout);
    uint32_t* hdb = mapped<uint32_t>(4096, &ddb);
    uint64_t* hns = mapped<uint64_t>(64, &dns);
    if (var.block)
      e3_block<<<1, 256, 0, st>>>(din, dout, var.U, N, MASK);
    else
      e2_stamped<<<1, 32, 0, st>>>(din, dout, ddb, var.U, N, MASK, var.mode, dns);
    CK(cudaGetLastError());
    std::vector<double> v;
    const uint32_t len = (uint32_t)(var.U * 12 - 64);
    for (uint64_t i = 0; i < N; i++) {
      double t0 = now_us();
      host_write(hin, i, MASK, var.U, len);
      if (var.mode & 1) ((volatile uint32_t*)hdb)[0] = (uint32_t)(i + 1);
      while (!host_poll(hout, i, MASK, var.U)) {
      }
      double t1 = now_us();
      // The reply's data: word 1 = i + 1 (the kernel added one), word 2 = unit index.
      const uint32_t ry = ((volatile uint4*)hout)[(i & MASK) * var.U + 2].y;
      if (!(var.mode & 2) && ry != (uint32_t)i + 1) {
        printf("bad reply data at %llu: %u\n", (unsigned long long)i, ry);
        exit(1);
      }
      if (i >= 1000) v.push_back(t1 - t0);
    }
    CK(cudaStreamSynchronize(st));
    report(var.name, v);
    if (var.mode & 2) printf("    device time of the runtime work per message: %.3f us\n", hns[0] / 1e3 / N);
    CK(cudaFreeHost(hin));
    CK(cudaFreeHost(hout));
    CK(cudaFreeHost(hdb));
    CK(cudaFreeHost(hns));
  }

  // ---- E7 ----
  for (int warps : {1, 2, 3, 4}) {
    const int U = 22;
    const int stag = warps > 1 ? 2600 / warps : 0;
    uint4 *din, *dout;
    uint4* hin = mapped<uint4>((MASK + 1) * 32 * 16, &din);
    uint4* hout = mapped<uint4>((MASK + 1) * 32 * 16, &dout);
    e7_warps<<<1, 32 * warps, 0, st>>>(din, dout, U, N, MASK, stag);
    CK(cudaGetLastError());
    std::vector<double> v = ping_pong_checked("E7", hin, hout, U, N, MASK);
    CK(cudaStreamSynchronize(st));
    char name[96];
    snprintf(name, sizeof name, "E7 %d warp(s) polling one slot, %d cycles apart", warps, stag);
    report(name, v);
    CK(cudaFreeHost(hin));
    CK(cudaFreeHost(hout));
  }

  // ---- E9 ----
  for (int variant : {1, 2, 3, 4}) {
    const int pollers = variant <= 2 ? variant : variant - 2, atomics = variant > 2;
    const int U = 22;
    const int stag = 1300;
    uint4 *din, *dout;
    uint4* hin = mapped<uint4>((MASK + 1) * 32 * 16, &din);
    uint4* hout = mapped<uint4>((MASK + 1) * 32 * 16, &dout);
    e9_staged<<<1, 32 * (1 + pollers), 0, st>>>(din, dout, U, N, MASK, stag, atomics);
    CK(cudaGetLastError());
    std::vector<double> v = ping_pong_checked("E9", hin, hout, U, N, MASK);
    CK(cudaStreamSynchronize(st));
    char name[96];
    snprintf(name, sizeof name, "E9 %d polling warp(s) staging for a replying warp, + runtime work%s", pollers,
             atomics ? " + 3 atomics" : "");
    report(name, v);
    CK(cudaFreeHost(hin));
    CK(cudaFreeHost(hout));
  }

  // ---- E4 ----
  {
    const int U = 11;  // 128-B logical slot: 64-B header + 64-B payload
    const uint64_t CAP = 1 << 16, M = CAP - 1, TOTAL = 20000000;
    uint4 *din, *dout;
    uint64_t *ddb, *dhead, *dohead;
    uint4* hin = mapped<uint4>(CAP * U * 16, &din);
    uint4* hout = mapped<uint4>(CAP * U * 16, &dout);
    uint64_t* hdb = mapped<uint64_t>(4096, &ddb);
    uint64_t* hhead = mapped<uint64_t>(4096, &dhead);
    uint64_t* hohead = mapped<uint64_t>(4096, &dohead);
    unsigned long long *dstats;
    unsigned long long* hstats = mapped<unsigned long long>(4096, &dstats);
    for (int acq = 0; acq < 2; acq++)
    for (int maxw : {128, 256, 372}) {
      memset((void*)hin, 0, CAP * U * 16);
      memset((void*)hout, 0, CAP * U * 16);
      *(volatile uint64_t*)hdb = 0;
      *(volatile uint64_t*)hhead = 0;
      *(volatile uint64_t*)hohead = 0;
      e4_stream<<<1, 1024, 0, st>>>(din, dout, ddb, dhead, dohead, U, TOTAL, M, M, maxw, acq, dstats);
      CK(cudaGetLastError());
      double t0 = now_us();
      std::thread cons([&] {
        uint64_t got = 0;
        while (got < TOTAL) {
          uint64_t k = 0;
          while (got + k < TOTAL && k < 256 && host_poll(hout, got + k, M, U)) k++;
          got += k;
          if (k) *(volatile uint64_t*)hohead = got;
        }
      });
      uint64_t sent = 0;
      while (sent < TOTAL) {
        uint64_t hd = *(volatile uint64_t*)hhead;
        uint64_t room = CAP - (sent - hd);
        uint64_t k = std::min<uint64_t>(std::min<uint64_t>(room, 256), TOTAL - sent);
        for (uint64_t j = 0; j < k; j++) host_write(hin, sent + j, M, U, 64);
        sent += k;
        if (k) {
          std::atomic_thread_fence(std::memory_order_release);
          *(volatile uint64_t*)hdb = sent;
        }
      }
      cons.join();
      double t1 = now_us();
      CK(cudaStreamSynchronize(st));
      printf("E4 streaming 128-B stamped slots, 1 block of 1024, window %3d, doorbell %s: %6.2f M msgs/s; "
             "windows with a unit not there yet: %llu of %llu\n",
             maxw, acq ? "ld.acquire.sys" : "volatile", TOTAL / (t1 - t0), hstats[0], hstats[1]);
    }
    // Bandwidth of one block and of the whole GPU, over the same mapped memory.
    uint64_t* dsink;
    CK(cudaMalloc(&dsink, 64));
    const uint64_t units = CAP * U;
    for (int grid : {1, prop.multiProcessorCount}) {
      for (int wr = 0; wr < 2; wr++) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        e4_bw<<<grid, 1024, 0, st>>>(din, units, wr, dsink);
        CK(cudaEventRecord(a, st));
        for (int r = 0; r < 5; r++) e4_bw<<<grid, 1024, 0, st>>>(din, units, wr, dsink);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        printf("E4 %s host memory, %3d block(s) of 1024: %6.2f GB/s\n", wr ? "write" : "read ", grid,
               5.0 * units * 16 / (ms * 1e6));
      }
    }
  }

  // ---- E5 ----
  {
    const int U = 6;
    const uint64_t n = 20000;
    uint4* inbox;
    uint64_t *ack, *lat, *hlat;
    CK(cudaMalloc(&inbox, 64 * U * 16));
    CK(cudaMemset(inbox, 0, 64 * U * 16));
    CK(cudaMalloc(&ack, 64));
    CK(cudaMemset(ack, 0, 64));
    CK(cudaMalloc(&lat, n * 8));
    e5_latency<<<2, 32, 0, st>>>(inbox, ack, U, n, lat);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));
    hlat = (uint64_t*)malloc(n * 8);
    CK(cudaMemcpy(hlat, lat, n * 8, cudaMemcpyDeviceToHost));
    std::vector<double> v;
    for (uint64_t i = 1000; i < n; i++) v.push_back(hlat[i] / 1e3);
    report("E5 K2K one-way, device memory, stamped 96-B slot (device clock)", v);

    const uint64_t CAP = 1 << 14, per = 20000;
    uint4* box;
    uint64_t *res, *head, *done;
    CK(cudaMalloc(&box, CAP * U * 16));
    for (int spb : {32, 128}) {
      const int blocks = 128 / spb;
      CK(cudaMemset(box, 0, CAP * U * 16));
      CK(cudaMalloc(&res, 64));
      CK(cudaMemset(res, 0, 64));
      CK(cudaMalloc(&head, 64));
      CK(cudaMemset(head, 0, 64));
      CK(cudaMalloc(&done, 64));
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      CK(cudaEventRecord(a, st));
      e5_tput<<<blocks + 1, 1024, 0, st>>>(box, res, head, U, per, spb, CAP, done);
      CK(cudaGetLastError());
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      uint64_t got;
      CK(cudaMemcpy(&got, done, 8, cudaMemcpyDeviceToHost));
      printf("%-64s %7.1f M msgs/s (%llu msgs, %d sender blocks)\n", "E5 K2K 128 senders -> 1 receiving block",
             got / (ms * 1e3), (unsigned long long)got, blocks);
    }
  }
  // ---- E6 ----
  {
    const uint64_t M6 = 1023;
    const int U = 22;
    uint4 *din, *dout, *dextra;
    uint64_t *dlat, *dcb;
    uint4* hin = mapped<uint4>((M6 + 1) * U * 16, &din);
    uint4* hout = mapped<uint4>((M6 + 1) * U * 16, &dout);
    uint64_t* hlat = mapped<uint64_t>(4096 * 8, &dlat);
    uint64_t* hcb = mapped<uint64_t>(4096, &dcb);
    uint4* hextra = mapped<uint4>(4096, &dextra);
    (void)hlat; (void)hcb; (void)hextra;
    struct { int bits; const char* name; } v6[] = {{0, "E6 baseline (E2, 22 units)"},
      {1, "E6 + latency-ring store"}, {2, "E6 + 6 counter stores"}, {6, "E6 + counters + membar.cta"},
      {10, "E6 + counters + membar.gl"}, {16, "E6 + 2 extra loads per poll"}, {32, "E6 + smem lock/atomics"},
      {1 | 2 | 4 | 16 | 32, "E6 all but membar.gl"}};
    for (auto& v : v6) {
      memset((void*)hin, 0, (M6 + 1) * U * 16);
      memset((void*)hout, 0, (M6 + 1) * U * 16);
      e6_side<<<1, 32, 0, st>>>(din, dout, dlat, dcb, dextra, U, N, M6, v.bits);
      CK(cudaGetLastError());
      std::vector<double> t;
      for (uint64_t i = 0; i < N; i++) {
        double t0 = now_us();
        host_write(hin, i, M6, U, (uint32_t)(U * 12 - 64));
        while (!host_poll(hout, i, M6, U)) {
        }
        double t1 = now_us();
        if (i >= 1000) t.push_back(t1 - t0);
      }
      CK(cudaStreamSynchronize(st));
      report(v.name, t);
    }
  }
  // ---- E8 ----
  {
    const int U = 22;
    struct { uint64_t slots; int one_block, lat, prof, extra, pump; const char* name; } v8[] = {
      {1024, 0, 0, 0, 0, 0, "E8 1024-slot rings, separate allocations"},
      {4096, 0, 0, 0, 0, 0, "E8 4096-slot rings (1.4 MB each)"},
      {4096, 0, 1, 0, 0, 0, "E8 4096 + latency ring"},
      {4096, 1, 1, 0, 1, 0, "E8 4096 in one 8-MB DEVICEMAP|PORTABLE block + lat + 2 loads"},
      {4096, 1, 1, 9, 1, 0, "E8 as above + 9 profile stores per poll"},
      {1024, 1, 1, 0, 1, 0, "E8 1024 in one block + lat + 2 loads"},
      {4096, 1, 1, 0, 1, 1, "E8 4096 one block + lat + loads + a host thread watching"}};
    for (auto& v : v8) {
      uint4 *hin, *hout, *din, *dout, *dextra;
      uint64_t *hlat, *dlat, *hprof, *dprof;
      const size_t ring = v.slots * U * 16;
      void* block = nullptr;
      if (v.one_block) {
        CK(cudaHostAlloc(&block, 8 << 20, cudaHostAllocMapped | cudaHostAllocPortable));
        memset(block, 0, 8 << 20);
        char* b = (char*)block;
        hin = (uint4*)(b + 4096);
        hout = (uint4*)(b + 4096 + ring);
        hlat = (uint64_t*)(b + 4096 + 2 * ring);
        hprof = nullptr;
        CK(cudaHostGetDevicePointer((void**)&din, hin, 0));
        CK(cudaHostGetDevicePointer((void**)&dout, hout, 0));
        CK(cudaHostGetDevicePointer((void**)&dlat, hlat, 0));
        CK(cudaHostGetDevicePointer((void**)&dextra, b, 0));
      } else {
        hin = mapped<uint4>(ring, &din);
        hout = mapped<uint4>(ring, &dout);
        hlat = mapped<uint64_t>(32768 * 8, &dlat);
        mapped<uint4>(4096, &dextra);
      }
      hprof = mapped<uint64_t>(4 << 20, &dprof);
      (void)hprof;
      e8_env<<<1, 32, 0, st>>>(din, dout, v.lat ? dlat : nullptr, dprof, dextra, U, N, v.slots - 1, v.prof, v.extra);
      CK(cudaGetLastError());
      std::vector<double> t;
      std::atomic<uint64_t> at{0};
      std::atomic<bool> stop{false};
      std::thread watcher;
      if (v.pump)
        watcher = std::thread([&] {
          // Like the runtime's pump: spin on the next reply's first unit and the
          // latency ring, lines the device writes.
          uint64_t sum = 0;
          while (!stop.load(std::memory_order_relaxed)) {
            const uint64_t i = at.load(std::memory_order_relaxed);
            sum += ((volatile uint32_t*)(hout + (i & (v.slots - 1)) * U))[3];
            sum += ((volatile uint64_t*)hlat)[i & 32767];
          }
          if (sum == 42) printf(" ");
        });
      for (uint64_t i = 0; i < N; i++) {
        at.store(i, std::memory_order_relaxed);
        double t0 = now_us();
        host_write(hin, i, v.slots - 1, U, (uint32_t)(U * 12 - 64));
        while (!host_poll(hout, i, v.slots - 1, U)) {
        }
        double t1 = now_us();
        if (i >= 1000) t.push_back(t1 - t0);
      }
      stop = true;
      if (watcher.joinable()) watcher.join();
      CK(cudaStreamSynchronize(st));
      report(v.name, t);
    }
  }
  printf("done\n");
  return 0;
}
#endif
