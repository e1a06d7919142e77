// Where the K2K sender's reservation goes (issue 12: `cuda_bench --only k2k` with
// BENCH_K2K_SPLIT=1 puts ~1,470 cycles of rk_send_to's ~2,300 in rk_k2k_reserve on an
// H200). One sender thread sends to an inbox in device memory, one message at a time,
// through the library's own functions (kernels/ringkernel.cuh), while a consumer warp
// of another block polls the inbox as the persistent kernel's one-message loop does
// (every unit of the next slot, and the `reserve` word, each poll) and frees each slot.
// Modes change one thing at a time. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o /tmp/k2kres notes/cuda_k2k_reserve.cu && /tmp/k2kres
#include "cuda_check.h"
#include "../crates/ringkernel-cuda/kernels/ringkernel.cuh"

struct Probe {
    rk_u64 w[4];
};

// The route entry's two 16-byte halves loaded four ways (modes 9-12).
__device__ __forceinline__ uint4 ld_relaxed_gpu_v4(const void* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ uint4 ld_cg_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// mode 0: the library's route + reserve; 1: the same, the consumer not reading
// `reserve`; 2: the same, no consumer (the inbox is large enough); 3: reserve without
// reading `reserve` first (compare-and-swap from the last index + 1, the head as last
// read); 4: only the compare-and-swap (no match, no shuffles); 5: only the two loads of
// the reservation (reserve, head acquire); 6: the library's with lane 0's hint
// (RkK2kHint) in shared memory, as the runtime keeps it; 7: rk_send_to whole with the
// hint fresh (the route read beside the compare-and-swap); 8: the same, the hint made
// stale before each send (the route read first, then the reservation); 9-12: the
// route's loads and the compare-and-swap issued together, four ways (see there).
__global__ void k2k(RkContext ctx, RkInbox* ib, unsigned char* slots, rk_u64 cap, int reps, int mode,
                    long long* out, volatile int* stop) {
    const int lane = threadIdx.x % 32;
    if (blockIdx.x == 1) {
        // The consumer: one warp.
        if (mode == 2) return;
        const rk_u32 U = rk_units_per_slot(128);
        const rk_u64 sb = (rk_u64)U * RK_UNIT_BYTES;
        rk_u64 head = 0;
        while (!*stop) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if ((rk_u32)lane < U) v = rk_ld_volatile_v4(slots + (head & (cap - 1)) * sb + lane * RK_UNIT_BYTES);
            rk_u64 r = 0;
            if (mode != 1 && lane == 31) r = *(volatile const rk_u64*)&ib->reserve;
            const rk_u32 used = rk_units_used(sizeof(Probe));
            const bool complete = __ballot_sync(0xffffffffu, (rk_u32)lane < used && v.w != rk_stamp_of(head)) == 0u;
            r = __shfl_sync(0xffffffffu, r, 31);
            if (complete) {
                head++;
                if (lane == 0) rk_st_release_gpu(&ib->head, head);
            }
            if (r == 0x5555555555ull) out[15] = 1;
        }
        return;
    }
    if (threadIdx.x != 0) return;
    long long s_route = 0, s_res = 0, s_wr = 0;
    rk_u64 guess = 0, head_seen = 0;
    __shared__ RkK2kHint hint;
    hint = RkK2kHint();
    Probe p = {{1, 2, 3, 4}};
    union {
        RkMessageHeader h;
        rk_u32 w[16];
    } u;
    for (int i = 0; i < 16; i++) u.w[i] = i;
    ctx.k2k_hint = &hint;
    for (int r = 0; r < reps; r++) {
        if (mode == 7 || mode == 8) {
            // rk_send_to whole (route, reservation, header, stores): with the hint fresh
            // its route is read beside the compare-and-swap; mode 8 makes the hint stale
            // before each send (route, then reservation).
            if (mode == 8) hint.seen_ns = 0;
            const long long a = clock64();
            const int sent = rk_send_to(&ctx, 0, 0x42, &p, sizeof(Probe));
            const long long b = clock64();
            if (sent != RK_K2K_DELIVERED) {
                out[13]++;
                r--;
                continue;
            }
            if (r >= 16) s_res += b - a;
            out[11] = hint.dest1;
            const long long w = clock64();
            while (clock64() - w < 3000) {
            }
            continue;
        }
        const long long c0 = clock64();
        RkK2kDest d;
        if (!rk_k2k_route(&ctx, 0, sizeof(Probe), &d)) {
            out[14] = -1;
            break;
        }
        const long long c1 = clock64();
        rk_u64 idx = 0;
        if (mode <= 2 || mode == 6) {
            if (rk_k2k_reserve<true>(d, 1u, &idx, mode == 6 ? &hint : nullptr) == 0u) {
                out[13]++;
                r--;
                continue;
            }
        } else if (mode == 3) {
            // From the last index + 1, the head as last read (re-read only when full).
            for (;;) {
                if (guess - head_seen >= d.cap) head_seen = rk_k2k_ld_acquire(&ib->head);
                if (guess - head_seen >= d.cap) continue;
                const rk_u64 seen = rk_k2k_cas(&ib->reserve, guess, guess + 1);
                if (seen == guess) break;
                guess = seen;
            }
            idx = guess;
            guess++;
        } else if (mode == 4) {
            idx = rk_k2k_cas(&ib->reserve, guess, guess + 1);
            guess++;
        } else if (mode >= 9) {
            // The route's two loads and the compare-and-swap issued together (9: volatile
            // loads first, as rk_send_to's hinted path; 10: the swap first; 11: the loads
            // relaxed at GPU scope; 12: weak loads through L2, .cg), timed until both
            // results are used.
            const unsigned char* e = (const unsigned char*)&ctx.routes[0];
            uint4 a, b;
            if (mode == 10) {
                idx = rk_k2k_cas(&ib->reserve, guess, guess + 1);
                a = rk_ld_volatile_v4(e);
                b = rk_ld_volatile_v4(e + 16);
            } else {
                if (mode == 9) {
                    a = rk_ld_volatile_v4(e);
                    b = rk_ld_volatile_v4(e + 16);
                } else if (mode == 11) {
                    a = ld_relaxed_gpu_v4(e);
                    b = ld_relaxed_gpu_v4(e + 16);
                } else {
                    a = ld_cg_v4(e);
                    b = ld_cg_v4(e + 16);
                }
                idx = rk_k2k_cas(&ib->reserve, guess, guess + 1);
            }
            if (a.x + b.y == 0x55555u) out[12] = 1;
            guess++;
        } else {
            idx = *(volatile rk_u64*)&ib->reserve + rk_k2k_ld_acquire(&ib->head);
            if (idx == 0x5555555555ull) out[12] = 1;
            idx = guess++;
            // keep the inbox consistent for the consumer: reserve by plain store
            *(volatile rk_u64*)&ib->reserve = guess;
        }
        if (idx == 0x5555555555ull) out[12] = 1;
        const long long c2 = clock64();
        rk_k2k_write(d, idx, u.w, (const unsigned char*)&p, sizeof(Probe));
        const long long c3 = clock64();
        if (r >= 16) {
            s_route += c1 - c0;
            s_res += c2 - c1;
            s_wr += c3 - c2;
        }
        const long long w = clock64();
        while (clock64() - w < 3000) {
        }
    }
    const int n = reps - 16;
    out[0] = s_route / n;
    out[1] = s_res / n;
    out[2] = s_wr / n;
    *stop = 1;
}

int main() {
    const rk_u64 cap = 1 << 16;
    const rk_u32 U = 128 / 12 + 1;
    RkInbox* ib;
    unsigned char* slots;
    RkRoute* routes;
    long long *out, hout[16];
    int* stop;
    CK(cudaMalloc(&ib, sizeof(RkInbox)));
    CK(cudaMalloc(&slots, cap * U * 16));
    CK(cudaMalloc(&routes, sizeof(RkRoute)));
    CK(cudaMalloc(&out, sizeof(hout)));
    CK(cudaMalloc(&stop, sizeof(int)));
    const char* names[] = {"library route + reserve, consumer polling",
                           "same, the consumer not reading `reserve`",
                           "same, no consumer",
                           "compare-and-swap from the last index (no read first)",
                           "the compare-and-swap alone",
                           "the reservation's two loads alone",
                           "library reserve with lane 0's hint in shared memory",
                           "rk_send_to whole (in `reservation`), hint fresh",
                           "rk_send_to whole (in `reservation`), hint stale",
                           "route loads (volatile) then the CAS, together",
                           "the CAS then the route loads (volatile), together",
                           "route loads (relaxed.gpu) then the CAS, together",
                           "route loads (weak, .cg) then the CAS, together"};
    for (int rep = 0; rep < 2; rep++) {
        for (int mode = 0; mode < 13; mode++) {
            CK(cudaMemset(ib, 0, sizeof(RkInbox)));
            CK(cudaMemset(slots, 0, cap * U * 16));
            CK(cudaMemset(out, 0, sizeof(hout)));
            CK(cudaMemset(stop, 0, sizeof(int)));
            RkRoute r = {};
            r.inbox = (rk_u64)ib;
            r.slots = (rk_u64)slots;
            r.kernel_id = 0;
            r.valid = 1;
            r.capacity = (rk_u32)cap;
            r.slot_size = 128;
            CK(cudaMemcpy(routes, &r, sizeof(r), cudaMemcpyHostToDevice));
            RkContext ctx = {};
            ctx.max_payload = 128 - RK_HEADER_SIZE;
            ctx.routes = routes;
            ctx.route_count = 1;
            k2k<<<2, 32>>>(ctx, ib, slots, cap, 4000, mode, out, stop);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hout, out, sizeof(hout), cudaMemcpyDeviceToHost));
            printf("%-55s route %4lld  reservation %4lld  stores %4lld cycles%s%s\n", names[mode], hout[0], hout[1],
                   hout[2], hout[14] ? "  (no route!)" : "", (mode == 7 || mode == 8) && hout[11] ? "  (hint names the route)" : "");
        }
    }
    return 0;
}
