// persistent.cu: the persistent-kernel template. Compiled by NVRTC after
// ringkernel.cuh and the user's handler source (which defines `handle`).
//
// WORK LAYOUT
// A kernel is `gridDim.x` blocks. Each block is split into two groups of whole warps:
// the host group (threads [0, host_threads)) serves the host input lanes, the inbox
// group (the rest, when there is one) the K2K inbox. A block of one warp has one group
// that serves both sources in turns. Both sources are rings of stamped slots (host
// lanes in mapped host memory, the inbox in device memory), and every group runs the
// same round:
//
//   plan      its leader (the group's first thread) decides what to read: the window
//             of slots the producer announced (host: the lane tails; inbox: its
//             `reserve`), or, when nothing is announced, the next slot speculatively;
//   read      the group loads the window's units and stages the slots in shared memory
//             (of a window, the units its source's last window used; a longer message
//             waits for the next round, which reads whole slots); the leader loads the
//             announcements (and, in block 0, the command line) in the same round trip;
//   decide    the leader takes the longest complete prefix (the rest of a claimed window
//             stays claimed for the next round), applies a command, reserves
//             the clock range, the message indices and the output slots;
//   handle    one thread per message (or the leader alone for serial handlers);
//   reply     replies are written to the output ring as stamped units, then a fence
//             that pushes them out of the GPU at once (measured: it saves ~0.9 us of a
//             round trip); no index store on the reply path.
//
// State the groups share (clock, message indices, output reservations, lifecycle) is an
// RkShared: in shared memory for one block (single-writer fields, a few atomics, no
// locks), in device memory for several blocks, where claims of one source take a lock
// and are numbered (tickets) so output is reserved in claim order and replies leave
// each source in input order however many blocks work on it.

#ifndef RK_HANDLER_SERIAL
#define RK_HANDLER_SERIAL 0
#endif
/* Cycles between the two snapshots of the next host slot that each poll of warp 0's
 * one-message loop reads (see there): about half a PCIe read's round trip.
 * What an H200 does with them (notes/cuda_inorder.cu, BENCHMARKS.md "H200 runs of
 * 2026-11-29, 08:36-09:38 UTC"): a warp's loads of mapped host memory are answered one
 * after the other, so the second snapshot samples host memory about a round trip after
 * the first however soon it is issued; and while one is in flight every later memory
 * operation of the warp (shared memory included) waits for it, so, by those measurements
 * in isolation, a request the first snapshot finds is taken only when the second is
 * back. A bulk copy as the second snapshot has neither effect, and made the round trip
 * no faster (notes/cuda-poll-second-bulk.patch). */
#ifndef RK_POLL_STAGGER_CYCLES
#define RK_POLL_STAGGER_CYCLES 1500
#endif
/* Units each thread of a group loads before it stages any, in a group round's read:
 * the loads of a window are in flight together (8 rather than 4 took the read of 216
 * 128-byte slots from 6.5 to 5.4 us on an H100, and streaming 1.05-1.10x). */
#ifndef RK_READ_UNROLL
#define RK_READ_UNROLL 8
#endif
/* A handler source may define RK_PROFILE_INBOX 1: the round profile
 * (LaunchParams::profile) then records block 0's inbox rounds instead of its host rounds. */
#ifndef RK_PROFILE_INBOX
#define RK_PROFILE_INBOX 0
#endif
/* The runtime defines RK_PROFILE 1 when it keeps a round profile
 * (RINGKERNEL_CUDA_PROFILE). Without it the profile's code is compiled out: one lane
 * runs the one-message loop's take, handler and reply as a serial chain, where every
 * instruction adds to the round trip (compiling the profile out took ~0.17 us off it
 * on an H100). */
#ifndef RK_PROFILE
#define RK_PROFILE 0
#endif

/* At most 512 threads a block (the runtime refuses more): with 1024 the compiler would
 * have to fit every thread in 64 registers, and the loop's state would spill to local
 * memory on the critical path. */
#define RK_MAX_BLOCK 512
#define RK_SRC_HOST 0u
#define RK_SRC_INBOX 1u
#define RK_MODE_NONE 0u
#define RK_MODE_SPEC 1u
#define RK_MODE_CLAIMED 2u
#define RK_NO_UNIT 0xFFFFFFFFu
/* Bytes the host reserves in dynamic shared memory for RkShared and each RkGroup
 * (ringkernel-cuda's runtime.rs mirrors these). */
#define RK_SHARED_BYTES 256u
#define RK_GROUP_BYTES 512u
/* ... and for an RkK2kHint a warp. */
#define RK_HINT_BYTES (RK_MAX_BLOCK / 32u * 64u)

/* Kernel-wide state. All-zero is the initial state. Index [s] is per source. */
struct RkShared {
    rk_u64 hlc;                      /* packed HLC time of the kernel's clock */
    rk_u64 taken;                    /* messages taken (every source): message index base */
    rk_u64 out_tail;                 /* output slots handed out */
    rk_u64 out_promised;             /* out_tail + slots claimed batches may still need */
    rk_u64 out_head_seen;            /* the host's output head, as last read */
    rk_u64 processed[2];
    rk_u64 dropped[2];
    rk_u64 lane_claimed[RK_LANES];   /* host lanes: next index to claim */
    rk_u64 lane_known[RK_LANES];     /* host lanes: tail as last announced */
    rk_u64 inbox_claimed;
    rk_u64 inbox_known;              /* the inbox's `reserve` as last read */
    rk_u64 ticket[2];                /* several blocks: next claim number */
    rk_u64 turn[2];                  /* several blocks: claim whose turn it is to reserve output */
    rk_u32 claim_lock[2];            /* several blocks */
    rk_u32 handler_lock;             /* serial handlers with two groups or blocks */
    rk_u32 active;
    rk_u32 terminating;
    rk_u32 exit;
    rk_u32 busy;                     /* claimed batches not yet finished */
    rk_u32 last_error;
    rk_u32 top_lane;                 /* 1 + highest host lane holding messages; 0: none */
    rk_u32 host_fresh;               /* lane tails read after the last command */
    rk_u32 exited_blocks;
};

/* One group's round (shared memory). */
struct RkGroup {
    rk_u64 first;       /* ring index of the first slot read this round */
    rk_u64 ticket;
    rk_u64 msg_base;    /* message index of the first message taken */
    rk_u64 hlc_base;    /* message m: receive time base + 2m, send time base + 2m + 1 */
    rk_u64 out_base;
    rk_u64 max_ts;      /* largest request time within the drift bound */
    rk_u64 now_ms;
    rk_u64 announced;   /* what the producer announced this round (inbox: its reserve) */
    rk_u32 n;           /* slots read */
    rk_u32 k;           /* messages taken */
    rk_u32 lane;
    rk_u32 mode;
    rk_u32 first_bad;   /* first incomplete slot of the window */
    rk_u32 replies;
    rk_u32 exit;
    rk_u32 pending;     /* the claimed window was incomplete: read it again */
    rk_u32 pending_src; /* its source (a one-group block serves both in turns) */
    rk_u32 fast;        /* this round is warp 0's one-message loop (see below) */
    rk_u32 drift;
    rk_u32 err;
    rk_u32 ru;          /* units read of each slot this round (see the read) */
    rk_u32 need;        /* most units a complete slot of the round used (U: one needed more than ru) */
    rk_u32 warp_rep[32];   /* per warp of the group: which messages replied (ballot) */
    rk_u32 warp_drop[32];  /* per warp: how many were dropped */
    rk_u32 warp_pos[32];   /* per warp: replies of the warps before it */
};

static_assert(sizeof(RkShared) <= RK_SHARED_BYTES, "RkShared outgrew its reservation");
static_assert(sizeof(RkGroup) <= RK_GROUP_BYTES, "RkGroup outgrew its reservation");
static_assert(sizeof(RkK2kHint) * (RK_MAX_BLOCK / 32u) <= RK_HINT_BYTES, "RkK2kHint outgrew its reservation");

/* Fields that both groups of a block use with no barrier between them (the lifecycle
 * flags, `top_lane`, `last_error`, the counters the host group publishes, the inbox
 * group's `inbox_claimed` and its RkGroup's `k`/`pending`, read by the host group's exit
 * check) are accessed only through these: relaxed atomics, as the old volatile accesses
 * were relaxed, which compute-sanitizer's racecheck does not report as hazards (volatile
 * loads and stores look to it like plain ones). A field only its own group's leader
 * touches keeps plain volatile accesses. Works on shared and (several blocks) device
 * memory alike. */
__device__ __forceinline__ rk_u32 rk_xg_ld32(rk_u32* p) { return atomicAdd(p, 0u); }
__device__ __forceinline__ rk_u64 rk_xg_ld64(rk_u64* p) { return atomicAdd((unsigned long long*)p, 0ull); }
__device__ __forceinline__ void rk_xg_st32(rk_u32* p, rk_u32 v) { (void)atomicExch(p, v); }
__device__ __forceinline__ void rk_xg_st64(rk_u64* p, rk_u64 v) { (void)atomicExch((unsigned long long*)p, v); }

__device__ __forceinline__ rk_u64 rk_now_ms(rk_u64 clock_offset_ns) {
    return (rk_globaltimer_ns() + clock_offset_ns) / 1000000ull;
}

/* Named barrier of a group (1: host group, 2: inbox group; 0 is __syncthreads).
 * Immediate ids, so the kernel is known to use three barriers only. */
__device__ __forceinline__ void rk_group_sync(rk_u32 id, rk_u32 threads) {
    if (id == 1u) asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
    else asm volatile("bar.sync 2, %0;" ::"r"(threads) : "memory");
}

__device__ __forceinline__ void rk_lock(rk_u32* l) {
    while (atomicCAS(l, 0u, 1u) != 0u) __nanosleep(32);
    __threadfence();
}
__device__ __forceinline__ void rk_unlock(rk_u32* l) {
    __threadfence();
    atomicExch(l, 0u);
}

/* Reserves 2k consecutive clock values after merging `remote` (0: none): returns the
 * first; message m receives at base + 2m and sends at base + 2m + 1 (packed times add as
 * integers: with the counter in the low bits, a carry out of it is one more millisecond
 * and a counter of 0, as rk_hlc_tick's overflow). `*guess` is the
 * caller's last known value of the clock (a register): the first compare-and-swap tries
 * it, a failed one returns the current value (no separate read of S->hlc, which the
 * other group changes with atomics). */
__device__ rk_u64 rk_hlc_reserve(RkShared* S, rk_u64 remote, rk_u64 pt, rk_u32 k, rk_u64* guess) {
    rk_u64 old = *guess;
    for (;;) {
        const rk_u64 base = rk_hlc_next(old, remote, pt);
        const rk_u64 last = base + (2ull * k - 1ull);
        const rk_u64 seen = atomicCAS((unsigned long long*)&S->hlc, old, last);
        if (seen == old) {
            *guess = last;
            return base;
        }
        old = seen;
    }
}

/* Takes up to `want` output slots of what the host has freed; returns how many. */
__device__ rk_u32 rk_promise_output(RkShared* S, const RkLaunchParams& p, rk_u32 want) {
    const rk_u64 before = atomicAdd((unsigned long long*)&S->out_promised, (unsigned long long)want);
    rk_u64 seen = rk_xg_ld64(&S->out_head_seen);
    if (before + want - seen <= p.out_capacity) return want;
    // The ring looks full: read the host's head (one PCIe round trip), then keep what
    // fits and give the rest back.
    const RkQueueHeader* outq = (const RkQueueHeader*)p.out_queue;
    const rk_u64 h = *(volatile const rk_u64*)&outq->head;
    atomicMax((unsigned long long*)&S->out_head_seen, h);
    seen = h > seen ? h : seen;
    const rk_u64 room = before - seen >= p.out_capacity ? 0ull : p.out_capacity - (before - seen);
    const rk_u32 take = room < want ? (rk_u32)room : want;
    if (take < want) atomicAdd((unsigned long long*)&S->out_promised, (unsigned long long)(-(long long)(want - take)));
    return take;
}

/* The request header's fields that the runtime checks and copies into the reply, loaded
 * from the staged slot all at once. (Checked field by field, each load waited for the
 * branch on the one before it: the handler step of the one-message loop took 0.38 us on
 * an H200, 0.29 us this way. Taking them from the registers the poll read the slot into
 * instead made the round trip ~1 us slower: the poll's code changed shape.) */
struct RkReqFields {
    rk_u32 magic, version, type_id, payload_len, source_kernel, checksum, flags;
    rk_u64 correlation_id;
};

__device__ __forceinline__ RkReqFields rk_req_fields(const RkMessageHeader* ih) {
    RkReqFields f;
    f.magic = ih->magic;
    f.version = ih->version;
    f.type_id = ih->type_id;
    f.payload_len = ih->payload_len;
    f.source_kernel = ih->source_kernel;
    f.checksum = ih->checksum;
    f.flags = ih->flags;
    f.correlation_id = ih->correlation_id;
    return f;
}

/* Runs the handler on staged message `m` of a batch, whose header fields are `f` (the
 * same checks as the host's read path, the context, the prefilled reply); returns the
 * handler's result (1 reply, 0 none, < 0 dropped with that error) and its run time in
 * *lat (device clock). */
__device__ __forceinline__ int rk_run_handler(const RkLaunchParams& p, const RkReqFields& f,
                                              const unsigned char* stage_in, unsigned char* stage_out, rk_u32 stride,
                                              rk_u32 m, rk_u64 msg_index, rk_u64 hlc_base, bool from_inbox,
                                              rk_u32 lane, rk_u32* lat, volatile rk_u32* marks, RkK2kHint* hint) {
    const rk_u32 slot = (rk_u32)p.slot_size;
    const RkMessageHeader* ih = (const RkMessageHeader*)(stage_in + (rk_u64)m * stride);
    RkMessageHeader* oh = (RkMessageHeader*)(stage_out + (rk_u64)m * stride);
    *lat = RK_NO_SAMPLE;
    if (f.magic != RK_MESSAGE_MAGIC || f.version != RK_MESSAGE_VERSION || f.payload_len > slot - RK_HEADER_SIZE)
        return -(int)RK_ERR_BAD_HEADER;
    if ((f.flags & RK_FLAG_CHECKSUM) && rk_fnv1a32((const unsigned char*)(ih + 1), f.payload_len) != f.checksum)
        return -(int)RK_ERR_CHECKSUM;
    const rk_u64 recv_ts = hlc_base + 2ull * m;  // packed times add as integers (rk_hlc_reserve)
    const rk_u64 send_ts = recv_ts + 1ull;
    RkContext ctx;
    ctx.kernel_id = (rk_u32)p.kernel_id;
    ctx.max_payload = slot - RK_HEADER_SIZE;
    ctx.message_index = msg_index;
    ctx.now = recv_ts;
    ctx.routes = (const RkRoute*)p.routes;
    ctx.route_count = p.route_count;
    ctx.slot_size = slot;
    ctx.from_inbox = from_inbox ? 1u : 0u;
    ctx.send_ts = send_ts;
    ctx.correlation_id = f.correlation_id;
    ctx.node_id = p.node_id;
    ctx.priority = (rk_u32)p.priority;
    ctx.lane = from_inbox ? 0u : lane;
    ctx.k2k_hint = hint;
    oh->magic = RK_MESSAGE_MAGIC;
    oh->version = RK_MESSAGE_VERSION;
    oh->type_id = f.type_id;
    oh->payload_len = f.payload_len;
    oh->message_id = ((rk_u64)p.kernel_id << 40) | (msg_index & 0xFFFFFFFFFFull);
    oh->correlation_id = f.correlation_id;
    oh->source_kernel = (rk_u32)p.kernel_id;
    oh->dest_kernel = f.source_kernel;
    oh->timestamp = send_ts;
    oh->checksum = 0;
    oh->flags = RK_FLAG_REPLY | (((rk_u32)p.priority << RK_FLAG_PRIORITY_SHIFT) & RK_FLAG_PRIORITY_MASK);
    oh->node_id = p.node_id;
    if (marks) marks[0] = (rk_u32)clock64();
    const rk_u64 t0 = rk_globaltimer_ns();
    int r = handle(&ctx, ih, (const unsigned char*)(ih + 1), oh, (unsigned char*)(oh + 1), (void*)p.state);
    const rk_u64 dt = rk_globaltimer_ns() - t0;
    if (marks) marks[1] = (rk_u32)clock64();
    *lat = dt < (rk_u64)RK_NO_SAMPLE ? (rk_u32)dt : RK_NO_SAMPLE - 1u;
    if (r == 1 && oh->payload_len > slot - RK_HEADER_SIZE) r = -(int)RK_ERR_HANDLER;
    return r;
}

/* One 64-bit store per message, no fence: the sequence number in the upper half tells
 * the host whether the entry is the one it expects (see ringkernel-cuda's metrics.rs). */
__device__ __forceinline__ void rk_store_latency(const RkLaunchParams& p, rk_u64 msg_index, rk_u32 lat) {
    if (p.latency) ((volatile rk_u64*)p.latency)[msg_index & (p.latency_capacity - 1)] = ((msg_index + 1ull) << 32) | lat;
}

/* Publishes (valid = 1) or withdraws (valid = 0) this kernel's route entry: in its
 * runtime's routing table and, in a multi-GPU group, in every other GPU's table (stores
 * through peer access). The entry's fields are in place before `valid` says so; a fence
 * of system scope orders them for the kernels on other GPUs. */
__device__ void rk_publish_route(const RkLaunchParams& p, rk_u32 valid) {
    if (p.kernel_id >= p.route_count) return;
    const rk_u64 tables = 1ull + p.peer_route_count;
    for (rk_u64 t = 0; valid && t < tables; t++) {
        RkRoute* r = (RkRoute*)(t == 0 ? p.routes : ((const rk_u64*)p.peer_routes)[t - 1]) + p.kernel_id;
        r->inbox = p.inbox;
        r->slots = p.inbox_slots;
        r->kernel_id = (rk_u32)p.kernel_id;
        r->capacity = (rk_u32)p.inbox_capacity;
        r->slot_size = (rk_u32)p.slot_size;
    }
    if (valid) {
        if (p.peer_route_count) __threadfence_system();
        else __threadfence();
    }
    for (rk_u64 t = 0; t < tables; t++) {
        RkRoute* r = (RkRoute*)(t == 0 ? p.routes : ((const rk_u64*)p.peer_routes)[t - 1]) + p.kernel_id;
        *(volatile rk_u32*)&r->valid = valid;
    }
    if (p.peer_route_count) __threadfence_system();
    else __threadfence();
}

/* The counters, for the host's metrics (posted stores: an acknowledged command orders
 * them before the ack). */
__device__ void rk_mirror_counters(RkControlBlock* cb, RkShared* S) {
    rk_u64 in_head = 0;
#pragma unroll
    for (int l = 0; l < (int)RK_LANES; l++) in_head += *(volatile rk_u64*)&S->lane_claimed[l];
    cb->input_head = in_head;
    cb->output_tail = rk_xg_ld64(&S->out_tail);
    cb->processed = rk_xg_ld64(&S->processed[0]) + rk_xg_ld64(&S->processed[1]);
    cb->dropped = rk_xg_ld64(&S->dropped[0]) + rk_xg_ld64(&S->dropped[1]);
    cb->hlc = rk_xg_ld64(&S->hlc);
    cb->last_error = rk_xg_ld32(&S->last_error);
}

/* SM clock readings (low 32 bits) at the steps of a profiled one-message take: the
 * host gets the 17 differences (RoundProfile::marks, TAKE_MARKS in runtime.rs names
 * them). In shared memory: as registers they made the loop spill. */
#define RK_MARKS 18
#if RK_PROFILE
__shared__ rk_u32 rk_marks[RK_MARKS];
#else
#define rk_marks ((rk_u32*)nullptr)
#endif

extern "C" __global__ void __launch_bounds__(RK_MAX_BLOCK) rk_persistent(RkLaunchParams p) {
    extern __shared__ __align__(16) unsigned char rk_smem[];
    RkControlBlock* cb = (RkControlBlock*)p.control;
    const rk_u32* lane_tails = (const rk_u32*)p.lane_tails;
    RkQueueHeader* outq = (RkQueueHeader*)p.out_queue;
    unsigned char* out_units = (unsigned char*)(outq + 1);
    RkInbox* inbox = (RkInbox*)p.inbox;
    const rk_u32 slot = (rk_u32)p.slot_size;
    const rk_u32 U = rk_units_per_slot(slot);
    const rk_u64 slot_units_bytes = (rk_u64)U * RK_UNIT_BYTES;
    const rk_u32 stride = (rk_u32)p.stage_stride;
    const rk_u32 tid = threadIdx.x;
    const rk_u32 nthreads = blockDim.x;
    const rk_u32 host_threads = (rk_u32)p.host_threads;
    const bool two_groups = host_threads < nthreads;
    const rk_u32 grp = tid < host_threads ? 0u : 1u;
    const rk_u32 gt = grp == 0 ? tid : tid - host_threads;
    const rk_u32 gsize = grp == 0 ? host_threads : nthreads - host_threads;
    const rk_u32 bar_id = 1u + grp;
    const rk_u32 W0 = (rk_u32)p.host_window, W1 = (rk_u32)p.inbox_window;
    const rk_u32 W = grp == 0 ? W0 : W1;
    const bool multi = p.shared != 0;  // several blocks: RkShared in device memory
    const bool block0 = blockIdx.x == 0;
    const bool profiling = RK_PROFILE && p.profile != 0;
    const rk_u64 pcap = p.profile_capacity;
    // p.clock_offset_ns is the host's UNIX time (ns) at launch; the difference to
    // %globaltimer now maps device time to UNIX time (off by the launch latency).
    const rk_u64 clock_off = p.clock_offset_ns - rk_globaltimer_ns();

    // ---- shared memory: RkShared | group 0 | group 1 | per-slot arrays | staging ----
    unsigned char* sp = rk_smem;
    RkShared* S = multi ? (RkShared*)p.shared : (RkShared*)sp;
    sp += RK_SHARED_BYTES;
    RkGroup* groups = (RkGroup*)sp;
    sp += 2 * RK_GROUP_BYTES;
    // This warp's K2K hint (see RkK2kHint).
    RkK2kHint* const k2k_hint = (RkK2kHint*)sp + (threadIdx.x >> 5);
    unsigned char* const hints = sp;
    sp += RK_HINT_BYTES;
    rk_u32* bad_all = (rk_u32*)sp;  // per slot: first unit whose stamp was wrong
    int* result_all = (int*)(bad_all + W0 + W1);
    sp += (((W0 + W1) * 8u) + 15u) & ~15u;
    unsigned char* stage = p.stage ? (unsigned char*)p.stage + (rk_u64)blockIdx.x * (W0 + W1) * stride * 2ull : sp;
    RkGroup* g = &groups[grp];
    rk_u32* bad = bad_all + (grp ? W0 : 0u);
    int* result = result_all + (grp ? W0 : 0u);
    unsigned char* stage_in = stage + (grp ? (rk_u64)W0 * stride * 2ull : 0ull);
    unsigned char* stage_out = stage_in + (rk_u64)W * stride;

    if (!multi) {
        for (rk_u32 i = tid; i < RK_SHARED_BYTES / 4; i += nthreads) ((rk_u32*)S)[i] = 0u;
    }
    for (rk_u32 i = tid; i < 2 * RK_GROUP_BYTES / 4; i += nthreads) ((rk_u32*)groups)[i] = 0u;
    for (rk_u32 i = tid; i < RK_HINT_BYTES / 4; i += nthreads) ((rk_u32*)hints)[i] = 0u;
    for (rk_u32 i = tid; i < W0 + W1; i += nthreads) bad_all[i] = RK_NO_UNIT;
    __syncthreads();
    if (block0 && tid == 0) {
        // Publish this kernel's inbox in the device routing table(s) (the tables belong
        // to the devices: the host never copies into them while kernels run).
        rk_publish_route(p, 1u);
        atomicMax((unsigned long long*)&S->hlc, rk_hlc_tick(0, rk_now_ms(clock_off)));
        cb->hlc = *(volatile rk_u64*)&S->hlc;
        cb->input_head = 0;
        cb->output_tail = 0;
        __threadfence_system();
        rk_st_release_sys32(&cb->state, RK_STATE_LAUNCHED);
    }
    __syncthreads();

    // The leader's private state.
    rk_u32 cur_lane = 1;  // lane polled speculatively (NORMAL until a message says otherwise)
    rk_u32 ack = 0, acked = 0, heartbeat = 0, idle = 0, backoff = 0;
    // Units a claimed window reads of each slot, per source: what the slots of the last
    // such round used (messages of one kind use the same few units of a large slot).
    rk_u32 ru_next[2] = {U, U};
    bool fresh_wait = false;   // the next host round only reads the lane tails
    bool cmd_seen = false;     // the one-message loop saw a command: a group round applies it
    rk_u64 terminate_at = 0;   // device time of the terminate command
    rk_u64 mirrored = ~0ull;   // counters as last written to the control block
    rk_u64 hlc_guess = 0;      // the clock as this leader last set it (rk_hlc_reserve)
    rk_u64 prof_n = 0;
    rk_u32 round = 0;

    for (;;) {
        // A one-group block alternates between the sources, except that an incomplete
        // claimed window is read again first.
        const rk_u32 src = grp == 1      ? RK_SRC_INBOX
                           : two_groups  ? RK_SRC_HOST
                           : g->pending  ? g->pending_src
                           : (round & 1u) ? RK_SRC_INBOX
                                          : RK_SRC_HOST;
        round++;
        const bool host_src = src == RK_SRC_HOST;
        const bool cmd_leader = block0 && gt == 0 && host_src;
        const bool cmd_leader_warp = block0 && host_src;  // warp 0 of block 0's host group
        // The leader whose rounds the profile records: block 0's host group, or with
        // RK_PROFILE_INBOX its inbox group.
        const bool prof_me = profiling && block0 && gt == 0 && (RK_PROFILE_INBOX ? !host_src : host_src);
        // Optional profile of block 0's host rounds (LaunchParams::profile): the device
        // time after each phase, for the round-trip breakdown of the benchmark.
        rk_u64 prof_t[7] = {0, 0, 0, 0, 0, 0, 0};
        rk_u64 prof_r[3] = {0, 0, 0};  // inside the read: announcements in, own unit staged, tails done
        const long long prof_clk = prof_me ? clock64() : 0;
#define RK_PROF(i) \
    if (prof_me) prof_t[i] = rk_globaltimer_ns()
        RK_PROF(0);

        // ================= plan =================
        if (gt == 0) {
            g->exit = rk_xg_ld32(&S->exit);
            g->mode = RK_MODE_NONE;
            rk_xg_st32(&g->k, 0u);
            g->max_ts = 0;
            g->drift = 0;
            g->err = 0;
            g->now_ms = rk_now_ms(clock_off);
            const bool active = rk_xg_ld32(&S->active) != 0;
            const bool fresh = rk_xg_ld32(&S->host_fresh) != 0;
            if (g->pending) {
                // Our claimed window was not complete last round: read it again.
                g->mode = RK_MODE_CLAIMED;
                rk_xg_st32(&g->pending, 0u);
            } else if (active && fresh && !(host_src && fresh_wait)) {
                rk_u64* claimed_p;
                rk_u64* known_p;
                if (host_src) {
                    const rk_u32 top = *(volatile rk_u32*)&S->top_lane;
                    g->lane = top ? top - 1u : cur_lane;
                    claimed_p = &S->lane_claimed[g->lane];
                    known_p = &S->lane_known[g->lane];
                } else {
                    claimed_p = &S->inbox_claimed;
                    known_p = &S->inbox_known;
                }
                if (!multi) {
                    const rk_u64 claimed = *(volatile rk_u64*)claimed_p;
                    const rk_u64 known = *(volatile rk_u64*)known_p;
                    rk_u32 want = known > claimed ? (rk_u32)(known - claimed < W ? known - claimed : W) : 0u;
                    if (want) want = rk_promise_output(S, p, want);
                    if (want) {
                        // Announced: claim the window now (its slots are written or being
                        // written; the stamps say when).
                        g->mode = RK_MODE_CLAIMED;
                        g->first = claimed;
                        g->n = want;
                        rk_xg_st64(claimed_p, claimed + want);
                    } else if (known <= claimed) {
                        g->mode = RK_MODE_SPEC;
                        g->first = claimed;
                        g->n = 1;
                    }
                } else if (*(volatile rk_u64*)known_p > *(volatile rk_u64*)claimed_p) {
                    // Several blocks: claims are numbered under the claim lock, which
                    // every block's rounds contend for, so it covers only the claim and
                    // its ticket. The output slots and the busy count are taken before
                    // (a whole window's worth) and what the claim did not use goes back
                    // after.
                    const rk_u32 promised = rk_promise_output(S, p, W);
                    atomicAdd(&S->busy, 1u);
                    rk_lock(&S->claim_lock[src]);
                    const rk_u64 claimed = *(volatile rk_u64*)claimed_p;
                    const rk_u64 known = *(volatile rk_u64*)known_p;
                    rk_u32 want = known > claimed ? (rk_u32)(known - claimed < W ? known - claimed : W) : 0u;
                    if (want > promised) want = promised;
                    if (want) {
                        g->mode = RK_MODE_CLAIMED;
                        g->first = claimed;
                        g->n = want;
                        rk_xg_st64(claimed_p, claimed + want);
                        g->ticket = S->ticket[src];
                        *(volatile rk_u64*)&S->ticket[src] = g->ticket + 1;
                    }
                    rk_unlock(&S->claim_lock[src]);
                    if (promised > want)
                        atomicAdd((unsigned long long*)&S->out_promised, (unsigned long long)(-(long long)(promised - want)));
                    if (!want) atomicSub(&S->busy, 1u);
                } else if (block0) {
                    // Nothing announced beyond the claims: block 0 alone reads the next
                    // slot speculatively (decide claims it under the lock if complete).
                    g->mode = RK_MODE_SPEC;
                    g->first = *(volatile rk_u64*)claimed_p;
                    g->n = 1;
                }
                if (host_src) cur_lane = g->lane;
            }
            g->first_bad = g->mode == RK_MODE_NONE ? 0u : g->n;
            g->ru = g->mode == RK_MODE_CLAIMED && g->n > 1u ? ru_next[src] : U;
            g->need = 0u;
            // Nothing announced beyond what is claimed: warp 0 alone polls one slot at a
            // time (registers, warp votes, no group barriers) until a backlog, a command
            // or a state change hands the round back to the group.
            g->fast = g->mode == RK_MODE_SPEC && !multi && U <= 32u && !(host_src && cmd_seen) &&
                      !rk_xg_ld32(&S->terminating);
        }
        rk_group_sync(bar_id, gsize);
        RK_PROF(1);
        if (g->exit) break;
        // 32-bit loads of what is used (a wider load would also cover g->k, which the
        // leader writes in this barrier interval).
        const rk_u32 mode = *(volatile rk_u32*)&g->mode;
        const rk_u32 n = mode == RK_MODE_NONE ? 0u : *(volatile rk_u32*)&g->n;
        const rk_u64 first = g->first;

        // ================= warp 0's one-message loop =================
        // The latency path: poll the next slot (one round trip), and when it is
        // complete handle it right there and write the reply, with the group's other
        // warps waiting at the end-of-round barrier. The lane tails (and, block 0, the
        // command) are read every fourth poll by lanes that hold no unit (a read of those
        // host-written lines in the same instruction stream as the slot's units slowed
        // the poll by ~2 us on an H100).
        if (g->fast) {
            if (gt < 32u) {
                // One block only (see the plan): RkShared is at the start of shared memory.
                // Said so, the compiler emits shared-memory atomics; through the generic
                // pointer each one first tried the global path (ATOM.E, then a fallback).
                RkShared* const S = (RkShared*)rk_smem;
                const rk_u32 lane_id = gt;
                const rk_u32 ann0 = U <= 30u ? 31u : 0u, ann1 = U <= 30u ? 30u : 0u;
                rk_u32 L = g->lane;
                rk_u64 claimed = first;
                // Lane 0's view (registers): what the producer announced for this source,
                // and output slots promised ahead (taken 16 at a time, the rest given back
                // when the loop ends). Every lane reads the announcement, lane 0 alone
                // uses it and writes it below: the __syncwarp orders the other lanes' reads
                // before that write (without it, compute-sanitizer's racecheck reported a
                // warp-level hazard; reading it on lane 0 alone instead made the host
                // round trip 0.05-0.09 us slower on an H200, in four of four pairs).
                rk_u64 known = host_src ? *(volatile rk_u64*)&S->lane_known[L] : *(volatile rk_u64*)&S->inbox_known;
                __syncwarp();
                rk_u32 credit = 0;
                // Lane 0: the physical clock (ms), read in each poll while the warp waits
                // for host memory or the inbox (see there).
                rk_u64 now_pre = 0;
                // Lane 0: S->processed[src], of which it is the only writer in one block
                // (a group serves one source, or one group both; see below).
                rk_u64 processed = *(volatile rk_u64*)&S->processed[src];
                for (rk_u32 it = 0;; it++) {
                    claimed = __shfl_sync(0xffffffffu, claimed, 0);  // lane 0 advances it
                    rk_u64 pf[5] = {0, 0, 0, 0, 0};
                    // Inside the take (lane 0, profiled): decided to take it, output
                    // credit in hand, message index taken and the clock's swap issued
                    // (its check is in the staging's span).
                    rk_u64 pt[3] = {0, 0, 0};
                    // The take's cycle marks (rk_marks; lane 0 of a profiled warp).
                    volatile rk_u32* const mk = rk_marks;
                    if (prof_me && lane_id == 0) {
#pragma unroll
                        for (int i = 0; i < RK_MARKS; i++) mk[i] = 0;
                    }
#define RK_MARK(i) \
    if (prof_me) mk[i] = (rk_u32)clock64()
                    if (prof_me) pf[0] = rk_globaltimer_ns();
                    const unsigned char* ring;
                    rk_u64 mask;
                    if (host_src) {
                        ring = (const unsigned char*)(p.in_queue + (rk_u64)L * p.lane_stride + sizeof(RkQueueHeader));
                        mask = p.in_capacity - 1;
                    } else {
                        ring = (const unsigned char*)p.inbox_slots;
                        mask = p.inbox_capacity - 1;
                    }
                    const bool ann = !host_src || (it & 3u) == 0;
                    uint4 v = make_uint4(0, 0, 0, 0), a0 = make_uint4(0, 0, 0, 0), a1 = make_uint4(0, 0, 0, 0);
                    if (lane_id < U) v = rk_ld_volatile_v4(ring + (claimed & mask) * slot_units_bytes + lane_id * RK_UNIT_BYTES);
                    if (ann && host_src) {
                        if (lane_id == ann0) a0 = rk_ld_volatile_v4(lane_tails);
                        if (cmd_leader_warp && lane_id == ann1) a1 = rk_ld_volatile_v4(lane_tails + 4);
                    } else if (ann && lane_id == ann0) {
                        const rk_u64 r = *(volatile const rk_u64*)&inbox->reserve;
                        a0 = make_uint4((rk_u32)r, (rk_u32)(r >> 32), 0, 0);
                    }
                    // The inbox: the take's physical time, read while the slot's load is
                    // in flight (the host lane reads it in the stagger wait below).
                    if (!host_src && lane_id == 0) now_pre = rk_now_ms(clock_off);
                    if (host_src) {
                        // A second snapshot of the host slot, issued RK_POLL_STAGGER_CYCLES
                        // after the first and taken when the first is not complete. On an
                        // H100 this took ~0.9 us off the round trip (a third snapshot made
                        // it slower). Keep the shape: a branch with the second check in it
                        // is what was measured; a select compiled differently and measured
                        // ~0.5 us slower.
                        const long long c0 = clock64();
                        // The take's physical time, read while the warp waits anyway (a
                        // microsecond old at most: the clock counts milliseconds).
                        if (lane_id == 0) now_pre = rk_now_ms(clock_off);
                        while (clock64() - c0 < RK_POLL_STAGGER_CYCLES) {
                        }
                        uint4 v2 = make_uint4(0, 0, 0, 0);
                        if (lane_id < U) v2 = rk_ld_volatile_v4(ring + (claimed & mask) * slot_units_bytes + lane_id * RK_UNIT_BYTES);
                        const rk_u32 st = rk_stamp_of(claimed);
                        rk_u32 len1 = __shfl_sync(0xffffffffu, v.x, 1);
                        rk_u32 used1 = len1 <= slot - RK_HEADER_SIZE ? rk_units_used(len1) : U;
                        const bool ok = __ballot_sync(0xffffffffu, lane_id < used1 && v.w != st) == 0u;
                        if (!ok) {
                            v = v2;
                            len1 = __shfl_sync(0xffffffffu, v.x, 1);
                            used1 = len1 <= slot - RK_HEADER_SIZE ? rk_units_used(len1) : U;
                            (void)__ballot_sync(0xffffffffu, lane_id < used1 && v.w != st);
                        }
                    }
                    // Complete when every unit the header's payload_len says is used carries
                    // this message's stamp.
                    const rk_u32 len = __shfl_sync(0xffffffffu, v.x, 1);
                    const rk_u32 used = len <= slot - RK_HEADER_SIZE ? rk_units_used(len) : U;
                    const bool complete =
                        __ballot_sync(0xffffffffu, lane_id < used && v.w != rk_stamp_of(claimed)) == 0u;
                    // The announcements, to lane 0.
                    a0.x = __shfl_sync(0xffffffffu, a0.x, ann0);
                    a0.y = __shfl_sync(0xffffffffu, a0.y, ann0);
                    a0.z = __shfl_sync(0xffffffffu, a0.z, ann0);
                    a0.w = __shfl_sync(0xffffffffu, a0.w, ann0);
                    const rk_u32 cmd_seq = __shfl_sync(0xffffffffu, a1.y, ann1);
                    // The header's flags (bytes 52..55: unit 4) and timestamp (40..47: unit 3).
                    const rk_u32 hflags = __shfl_sync(0xffffffffu, v.y, 4);
                    const rk_u64 hts = (rk_u64)__shfl_sync(0xffffffffu, v.y, 3) |
                                       ((rk_u64)__shfl_sync(0xffffffffu, v.z, 3) << 32);
                    if (prof_me) pf[1] = rk_globaltimer_ns();
                    RK_MARK(0);
                    // ---- decide (lane 0): 0 poll again, 1 take it, 2 hand back ----
                    int action = 0;
                    rk_u64 msg = 0, hlc = 0;
                    // The clock's compare-and-swap is issued in the take and its result
                    // looked at after the staging (see there): what it saw, and the
                    // remote timestamp a retry merges (it expected `hlc_guess`, and a retry
                    // merges `now_pre` too: neither changes in between).
                    rk_u64 hlc_seen = 0, hlc_remote = 0;
                    if (lane_id == 0) {
                        // Leave for group rounds when the state changes (the host loop of
                        // block 0 sees every change as a command; the inbox loop looks at
                        // the state every 16th poll), and now and then anyway (their
                        // bookkeeping: exit checks, heartbeat).
                        if ((it & 4095u) == 4095u) action = 2;
                        if (!host_src && (it & 15u) == 0 &&
                            (!rk_xg_ld32(&S->active) || rk_xg_ld32(&S->exit) || rk_xg_ld32(&S->terminating)))
                            action = 2;
                        // The host group's leader is the only writer of top_lane.
                        rk_u32 top = host_src ? *(volatile rk_u32*)&S->top_lane : rk_xg_ld32(&S->top_lane);
                        rk_u64 known_l = known;
                        if (action == 0 && ann && host_src) {
                            if (cmd_leader && cmd_seq != ack) {
                                action = 2;  // a group round applies it
                                cmd_seen = true;
                            }
                            const rk_u32 tails[4] = {a0.x, a0.y, a0.z, a0.w};
                            top = 0;
#pragma unroll
                            for (int l = 0; l < (int)RK_LANES; l++) {
                                const rk_u64 c = *(volatile rk_u64*)&S->lane_claimed[l];
                                const int ahead = (int)(tails[l] - (rk_u32)c);
                                rk_u64 known = *(volatile rk_u64*)&S->lane_known[l];
                                if (ahead > 0 && c + (rk_u64)ahead > known) {
                                    known = c + (rk_u64)ahead;
                                    *(volatile rk_u64*)&S->lane_known[l] = known;
                                }
                                if (known > c) top = (rk_u32)l + 1u;
                                if ((rk_u32)l == L) known_l = known;
                            }
                            if (*(volatile rk_u32*)&S->top_lane != top) rk_xg_st32(&S->top_lane, top);
                            known = known_l;
                        } else if (action == 0 && ann) {
                            const rk_u64 r = (rk_u64)a0.x | ((rk_u64)a0.y << 32);
                            if (r > known) {
                                known = r;
                                *(volatile rk_u64*)&S->inbox_known = r;
                            }
                        }
                        if (action == 0) {
                            if (host_src && top > L + 1u) action = 2;  // a higher lane waits: the group round picks it
                            if (known > claimed + 1u) action = 2;      // a backlog: windows, in group rounds
                        }
                        if (action == 0 && complete) {
                            if (prof_me) pt[0] = rk_globaltimer_ns();
                            RK_MARK(1);
                            bool go = true;
                            if (!host_src) {
                                // An inbox message whose priority lane is below the highest
                                // host lane holding messages waits for that lane.
                                const rk_u32 box_lane =
                                    ((hflags & RK_FLAG_PRIORITY_MASK) >> RK_FLAG_PRIORITY_SHIFT) >> RK_LANE_SHIFT;
                                go = top <= box_lane + 1u;
                            }
                            if (go && credit == 0) credit = rk_promise_output(S, p, 16);
                            if (prof_me) pt[1] = rk_globaltimer_ns();
                            RK_MARK(2);
                            if (go && credit > 0) {
                                action = 1;
                                credit--;
                                claimed++;
                                if (known < claimed) known = claimed;
                                if (host_src) {
                                    *(volatile rk_u64*)&S->lane_claimed[L] = claimed;
                                    *(volatile rk_u64*)&S->lane_known[L] = known;
                                } else {
                                    // (`inbox_claimed` is stored after the reply: see there.)
                                    *(volatile rk_u64*)&S->inbox_known = known;
                                }
                                RK_MARK(3);
                                const rk_u64 now = now_pre;
                                const bool drift = (hts >> RK_HLC_LOGICAL_BITS) > now + p.max_drift_ms;
                                // The clock first: its compare-and-swap (against the value
                                // this leader last set) is in flight during the message
                                // index and the staging, and only then is its result
                                // checked (below). Waiting for it here cost the round
                                // trip ~0.15 us on an H200.
                                hlc_remote = drift ? 0ull : hts;
                                hlc = rk_hlc_next(hlc_guess, hlc_remote, now);
                                hlc_seen = atomicCAS((unsigned long long*)&S->hlc, hlc_guess, hlc + 1ull);
                                RK_MARK(4);
                                msg = atomicAdd((unsigned long long*)&S->taken, 1ull);
                                RK_MARK(5);
                                if (drift) rk_xg_st32(&S->last_error, RK_ERR_CLOCK_DRIFT);
                                RK_MARK(6);
                                if (prof_me) pt[2] = rk_globaltimer_ns();
                            } else if (go) {
                                action = 2;  // the output is full: the group round waits for room
                            }
                        }
                        if (!two_groups && it >= 16u) action = action == 1 ? 1 : 2;  // the other source's turn
                    }
                    action = __shfl_sync(0xffffffffu, action, 0);
                    RK_MARK(7);
                    // One compare on the way to the take (two compares compiled to a
                    // jump table through constant memory and an indirect branch).
                    if (__builtin_expect(action != 1, 1)) {
                        if (action == 2) break;
                        if (lane_id == 0 && ++idle > (host_src ? 4096u : 65536u)) {
                            const rk_u32 most = host_src ? 1024u : 256u;
                            backoff = backoff == 0 ? 32 : (backoff < most ? backoff * 2 : most);
                            __nanosleep(backoff);
                        }
                        if (cmd_leader && lane_id == 0 && idle == 8u) {
                            // Settled after work: publish the counters (not per message).
                            rk_mirror_counters(cb, S);
                        }
                        __syncwarp();
                        continue;
                    }
                    // ---- take it: stage, handle, reply ----
                    if (lane_id < U) {
                        rk_u32* d = (rk_u32*)(stage_in + lane_id * RK_UNIT_DATA);
                        d[0] = v.x;
                        d[1] = v.y;
                        d[2] = v.z;
                    }
                    __syncwarp();
                    int r = 0;
                    if (lane_id == 0) {
                        // The clock's compare-and-swap: kept when it saw what it expected;
                        // else the other group moved the clock, and the reservation is made
                        // again from what it saw.
                        if (hlc_seen == hlc_guess) {
                            hlc_guess = hlc + 1ull;
                        } else {
                            hlc_guess = hlc_seen;
                            hlc = rk_hlc_reserve(S, hlc_remote, now_pre, 1, &hlc_guess);
                        }
                        RK_MARK(8);
                        if (prof_me) pf[2] = rk_globaltimer_ns();
                        rk_u32 lat;
                        const RkReqFields hf = rk_req_fields((const RkMessageHeader*)stage_in);
                        RK_MARK(9);
#if RK_HANDLER_SERIAL
                        if (two_groups) rk_lock(&S->handler_lock);
#endif
                        r = rk_run_handler(p, hf, stage_in, stage_out, stride, 0, msg, hlc, !host_src, L, &lat,
                                           prof_me ? mk + 10 : nullptr, k2k_hint);
#if RK_HANDLER_SERIAL
                        if (two_groups) rk_unlock(&S->handler_lock);
#endif
                        if (prof_me) pf[3] = rk_globaltimer_ns();
                        rk_store_latency(p, msg, lat);
                        RK_MARK(12);
                    }
                    r = __shfl_sync(0xffffffffu, r, 0);
                    RK_MARK(13);
                    rk_u64 out_idx = 0;
                    if (lane_id == 0) {
                        if (r == 1) {
                            out_idx = atomicAdd((unsigned long long*)&S->out_tail, 1ull);
                        } else {
                            credit++;  // no reply: the promised slot stays for the next one
                            if (r < 0) {
                                atomicAdd((unsigned long long*)&S->dropped[src], 1ull);
                                rk_xg_st32(&S->last_error, (rk_u32)(-r));
                            }
                        }
                        RK_MARK(14);
                    }
                    __syncwarp();
                    if (r == 1) {
                        out_idx = __shfl_sync(0xffffffffu, out_idx, 0);
                        RK_MARK(15);
                        const RkMessageHeader* oh = (const RkMessageHeader*)stage_out;
                        if (lane_id < rk_units_used(oh->payload_len)) {
                            const rk_u32* w = (const rk_u32*)(stage_out + lane_id * RK_UNIT_DATA);
                            rk_st_volatile_v4(out_units + (out_idx & (p.out_capacity - 1)) * slot_units_bytes +
                                                  lane_id * RK_UNIT_BYTES,
                                              make_uint4(w[0], w[1], w[2], rk_stamp_of(out_idx)));
                            // No fence here (unlike group rounds): the stamps make each
                            // unit whole on its own, and with the staggered poll above a
                            // fence only held the warp: ~0.3 us a round trip on an H100.
                        }
                        RK_MARK(16);
                    }
                    if (lane_id == 0) {
                        // One block: this leader is the only writer of processed[src] (a
                        // group serves one source, or one group both), so it counts in a
                        // register and stores the count (no read, no compare-and-swap
                        // loop), after the reply (nothing on its way waits for it).
                        if (r >= 0) rk_xg_st64(&S->processed[src], ++processed);
                        // The slot was read in full: free it.
                        if (host_src) {
                            RkQueueHeader* laneq = (RkQueueHeader*)(p.in_queue + (rk_u64)L * p.lane_stride);
                            *(volatile rk_u64*)&laneq->head = claimed;
                        } else {
                            // The claim, for the host group's exit check (the only other
                            // reader while this loop runs; group rounds read it after the
                            // loop ends). Stored here, not in the take: the warp's
                            // shared-memory atomics go one after another, so this exchange
                            // held up the clock's swap and the message index behind it.
                            rk_xg_st64(&S->inbox_claimed, claimed);
                            rk_k2k_st_release(&inbox->head, claimed);
                        }
                        if (r == 1) *(volatile rk_u64*)&outq->tail = out_idx + 1;  // a hint for the host
                        if (host_src) cur_lane = L;
                        idle = 0;
                        backoff = 0;
                        RK_MARK(17);
                        if (prof_me) {
                            pf[4] = rk_globaltimer_ns();
                            rk_u64* e = (rk_u64*)p.profile + (prof_n & (pcap - 1)) * 16u;
#pragma unroll
                            for (int i = 0; i < 5; i++) ((volatile rk_u64*)e)[i] = pf[i];
                            ((volatile rk_u64*)e)[5] = 0;
                            ((volatile rk_u64*)e)[6] = 0;
                            ((volatile rk_u64*)e)[7] = ((rk_u64)3 << 16) | 1u;
#pragma unroll
                            for (int i = 0; i < 3; i++) ((volatile rk_u64*)e)[8 + i] = pt[i];
                            // Cycles between consecutive marks, 16 bits each (saturated), four a word.
#pragma unroll
                            for (int w = 0; w < (RK_MARKS + 2) / 4; w++) {
                                rk_u64 x = 0;
#pragma unroll
                                for (int j = 0; j < 4; j++) {
                                    const int i = 1 + w * 4 + j;
                                    if (i < RK_MARKS) {
                                        const rk_u32 d = mk[i] && mk[i - 1] ? mk[i] - mk[i - 1] : 0u;
                                        x |= (rk_u64)(d < 0xFFFFu ? d : 0xFFFFu) << (16 * j);
                                    }
                                }
                                ((volatile rk_u64*)e)[11 + w] = x;
                            }
                            prof_n++;
                            *(volatile rk_u64*)((rk_u64*)p.profile + pcap * 16u) = prof_n;
                        }
                    }
                    __syncwarp();
                }
                if (lane_id == 0) {
                    // (g->k is still 0 from the plan.) Unused promises go back.
                    if (credit) atomicAdd((unsigned long long*)&S->out_promised, (unsigned long long)(-(long long)credit));
                }
            }
            rk_group_sync(bar_id, gsize);
            continue;
        }

        // ================= read =================
        uint4 db = make_uint4(0, 0, 0, 0), cmd = make_uint4(0, 0, 0, 0);
        rk_u64 reserve = 0;
        if (gt == 0) {
            // The announcements (and, block 0, the command line) in the same round trip
            // as the slots.
            if (host_src) {
                db = rk_ld_volatile_v4(lane_tails);
                if (cmd_leader) cmd = rk_ld_volatile_v4(lane_tails + 4);  // command, command_seq
            } else if (!multi || block0) {
                // With several blocks only block 0 reads the inbox's `reserve` (the others
                // see it through S->inbox_known): K2K senders CAS that word, and every
                // block polling it slowed them down.
                reserve = *(volatile const rk_u64*)&inbox->reserve;
            }
        }
        {
            const unsigned char* ring;
            rk_u64 mask;
            if (host_src) {
                ring = (const unsigned char*)(p.in_queue + (rk_u64)g->lane * p.lane_stride + sizeof(RkQueueHeader));
                mask = p.in_capacity - 1;
            } else {
                ring = (const unsigned char*)p.inbox_slots;
                mask = p.inbox_capacity - 1;
            }
            // The first `ru` units of each slot (all of them but in windows, where the
            // last window's slots say how many are used; a slot that uses more is
            // taken by the next round, which reads whole slots).
            const rk_u32 ru = *(volatile rk_u32*)&g->ru;
            const rk_u32 total = n * ru;
            bool stale = false;
            for (rk_u32 base = gt; base < total; base += RK_READ_UNROLL * gsize) {
                uint4 v[RK_READ_UNROLL];
#pragma unroll
                for (int j = 0; j < RK_READ_UNROLL; j++) {
                    const rk_u32 u = base + (rk_u32)j * gsize;
                    if (u < total) {
                        const rk_u32 m = u / ru, w = u - m * ru;
                        v[j] = rk_ld_volatile_v4(ring + ((first + m) & mask) * slot_units_bytes + w * RK_UNIT_BYTES);
                    }
                }
#pragma unroll
                for (int j = 0; j < RK_READ_UNROLL; j++) {
                    const rk_u32 u = base + (rk_u32)j * gsize;
                    if (u < total) {
                        const rk_u32 m = u / ru, w = u - m * ru;
                        rk_u32* d = (rk_u32*)(stage_in + (rk_u64)m * stride + w * RK_UNIT_DATA);
                        d[0] = v[j].x;
                        d[1] = v[j].y;
                        d[2] = v[j].z;
                        if (v[j].w != rk_stamp_of(first + m)) {
                            // One slot whose units one warp holds: a ballot below.
                            if (n == 1 && U <= 32u) stale = true;
                            else atomicMin(&bad[m], w);
                        }
                    }
                }
            }
            if (prof_me) {
                prof_r[0] = rk_globaltimer_ns();  // own unit staged
                if ((db.x ^ cmd.y) == 0x9E3779B9u) prof_r[2] = 1;  // waits for the announcements
                prof_r[1] = rk_globaltimer_ns();
            }
            if (n == 1 && U <= 32u && gt < 32u) {
                // Warp 0 of the group held the slot's units, one each.
                const unsigned stale_units = __ballot_sync(0xffffffffu, stale);
                if (gt == 0 && stale_units) bad[0] = (rk_u32)(__ffs(stale_units) - 1);
            }
        }
        if (gt == 0) {
            if (host_src) {
                // The lane tails: what each lane holds beyond what is claimed (a tail may be
                // older than a claim made from a stamp: never below the claim).
                if (multi) rk_lock(&S->claim_lock[0]);
                const rk_u32 tails[4] = {db.x, db.y, db.z, db.w};
                rk_u32 top = 0;
#pragma unroll
                for (int l = 0; l < (int)RK_LANES; l++) {
                    const rk_u64 claimed = *(volatile rk_u64*)&S->lane_claimed[l];
                    const int ahead = (int)(tails[l] - (rk_u32)claimed);
                    rk_u64 known = *(volatile rk_u64*)&S->lane_known[l];
                    if (ahead > 0 && claimed + (rk_u64)ahead > known) {
                        known = claimed + (rk_u64)ahead;
                        *(volatile rk_u64*)&S->lane_known[l] = known;
                    }
                    if (known > claimed) top = (rk_u32)l + 1u;
                }
                if (multi) rk_unlock(&S->claim_lock[0]);
                if (*(volatile rk_u32*)&S->top_lane != top) rk_xg_st32(&S->top_lane, top);
                if (prof_me) prof_r[2] = rk_globaltimer_ns();
            } else {
                g->announced = reserve;
            }
        }
        rk_group_sync(bar_id, gsize);
        RK_PROF(2);

        // ================= validate =================
        if (gt < n) {
            const RkMessageHeader* h = (const RkMessageHeader*)(stage_in + (rk_u64)gt * stride);
            const rk_u32 b = bad[gt];
            bool ok = b >= 2u;  // header units 0 and 1 (payload_len) are in
            if (ok) {
                const rk_u32 len = h->payload_len;
                const rk_u32 need = len <= slot - RK_HEADER_SIZE ? rk_units_used(len) : U;
                const rk_u32 ru = *(volatile rk_u32*)&g->ru;
                ok = b >= need && need <= ru;
                if (ok || need > ru) atomicMax(&g->need, need > ru ? U : need);
            }
            if (!ok) atomicMin(&g->first_bad, gt);
            else {
                const rk_u64 ts = h->timestamp;
                if ((ts >> RK_HLC_LOGICAL_BITS) > g->now_ms + p.max_drift_ms) g->drift = 1;
                else atomicMax((unsigned long long*)&g->max_ts, ts);
            }
        }
        rk_group_sync(bar_id, gsize);
        RK_PROF(3);

        // ================= decide (leader) =================
        bool partial = false;  // the leader's: this round takes part of its window
        if (gt == 0) {
            if (g->need) ru_next[src] = g->need;
            rk_u32 k = 0;
            rk_u64* claimed_p = host_src ? &S->lane_claimed[g->lane] : &S->inbox_claimed;
            if (!host_src && g->announced > *(volatile rk_u64*)&S->inbox_known) {
                // It only grows, and claims (under the claim lock) use what they read.
                atomicMax((unsigned long long*)&S->inbox_known, (unsigned long long)g->announced);
            }
            if (mode == RK_MODE_SPEC && g->first_bad > 0) {
                // The speculatively read slot is complete. A host lane waits if a higher
                // lane holds messages; an inbox message waits if its priority lane is
                // below the highest host lane holding messages.
                const rk_u32 top = host_src ? *(volatile rk_u32*)&S->top_lane : rk_xg_ld32(&S->top_lane);
                bool go;
                if (host_src) {
                    go = top <= g->lane + 1u;
                } else {
                    const RkMessageHeader* bh = (const RkMessageHeader*)stage_in;
                    const rk_u32 box_lane =
                        ((bh->flags & RK_FLAG_PRIORITY_MASK) >> RK_FLAG_PRIORITY_SHIFT) >> RK_LANE_SHIFT;
                    go = top <= box_lane + 1u;
                }
                if (go && rk_promise_output(S, p, 1) == 1) {
                    if (multi) rk_lock(&S->claim_lock[src]);
                    if (*(volatile rk_u64*)claimed_p == first) {
                        rk_xg_st64(claimed_p, first + 1);
                        if (multi) {
                            g->ticket = S->ticket[src];
                            *(volatile rk_u64*)&S->ticket[src] = g->ticket + 1;
                            atomicAdd(&S->busy, 1u);
                        }
                        k = 1;
                    } else {
                        atomicAdd((unsigned long long*)&S->out_promised, ~0ull);  // another group took it
                    }
                    if (multi) rk_unlock(&S->claim_lock[src]);
                }
            } else if (mode == RK_MODE_CLAIMED) {
                // The complete prefix is taken now. The rest was announced but is still
                // being written: it stays claimed (and, with several blocks, keeps this
                // claim's turn) and is read again next round.
                k = g->first_bad < n ? g->first_bad : n;
                if (k < n) {
                    partial = true;
                    g->first = first + k;
                    g->n = n - k;
                    rk_xg_st32(&g->pending, 1u);
                    g->pending_src = src;
                }
            }
            if (host_src && fresh_wait) {
                fresh_wait = false;
                rk_xg_st32(&S->host_fresh, 1u);
            }
            // ---- commands (block 0) ----
            if (cmd_leader && cmd.y != ack) {
                __threadfence_system();  // acquire for the command word
                const rk_u32 c = *(volatile const rk_u32*)(lane_tails + 4);
                // The next host round reads the lane tails only, so a lane is chosen from
                // tails read after the command (messages sent before `activate` must be
                // ranked by priority first); cleared before the state changes, so no
                // group claims from older tails. (The host also repeats the last command
                // to have the counters published: applying it again changes nothing.)
                fresh_wait = true;
                rk_xg_st32(&S->host_fresh, 0u);
                __threadfence();
                if (c == RK_CMD_ACTIVATE) rk_xg_st32(&S->active, 1u);
                else if (c == RK_CMD_DEACTIVATE) rk_xg_st32(&S->active, 0u);
                else if (c == RK_CMD_TERMINATE) {
                    if (!rk_xg_ld32(&S->terminating)) terminate_at = rk_globaltimer_ns();
                    rk_xg_st32(&S->terminating, 1u);
                    // From now on K2K senders get NOT_FOUND; what is already in the inbox
                    // is still drained (when active).
                    rk_publish_route(p, 0u);
                }
                ack = cmd.y;
                cmd_seen = false;
                const rk_u32 active = rk_xg_ld32(&S->active);
                cb->state = rk_xg_ld32(&S->terminating) ? RK_STATE_TERMINATING
                            : (active ? RK_STATE_ACTIVE : RK_STATE_DEACTIVATED);
            }
            if (k) {
                g->msg_base = atomicAdd((unsigned long long*)&S->taken, (unsigned long long)k);
                g->hlc_base = rk_hlc_reserve(S, g->max_ts, g->now_ms, k, &hlc_guess);
                if (host_src) cur_lane = g->lane;
                idle = 0;
                backoff = 0;
            }
            rk_xg_st32(&g->k, k);
        }
        rk_group_sync(bar_id, gsize);
        RK_PROF(4);
        const rk_u32 k = g->k;

        if (k) {
            // ================= handle =================
#if RK_HANDLER_SERIAL
            if (gt == 0) {
                if (multi || two_groups) rk_lock(&S->handler_lock);
                for (rk_u32 m = 0; m < k; m++) {
#else
            for (rk_u32 m = gt; m < k; m += gsize) {
                {
#endif
                    rk_u32 lat;
                    const RkReqFields f = rk_req_fields((const RkMessageHeader*)(stage_in + (rk_u64)m * stride));
                    const int r = rk_run_handler(p, f, stage_in, stage_out, stride, m, g->msg_base + m, g->hlc_base,
                                                 !host_src, g->lane, &lat, nullptr, k2k_hint);
                    if (r < 0) g->err = (rk_u32)(-r);
                    result[m] = r;
                    rk_store_latency(p, g->msg_base + m, lat);
                }
            }
#if RK_HANDLER_SERIAL
            if (gt == 0 && (multi || two_groups)) rk_unlock(&S->handler_lock);
#endif
            rk_group_sync(bar_id, gsize);
            RK_PROF(5);

            // ================= place the replies =================
            {
                const int r = gt < k ? result[gt] : 0;
                const unsigned rep = __ballot_sync(0xffffffffu, r == 1);
                const unsigned drp = __ballot_sync(0xffffffffu, r < 0);
                if ((gt & 31u) == 0) {
                    g->warp_rep[gt >> 5] = rep;
                    g->warp_drop[gt >> 5] = (rk_u32)__popc(drp);
                }
                rk_group_sync(bar_id, gsize);
                if (gt == 0) {
                    rk_u32 replies = 0, dropped = 0;
                    const rk_u32 warps = (k + 31u) >> 5;
                    for (rk_u32 w = 0; w < warps; w++) {
                        g->warp_pos[w] = replies;
                        replies += (rk_u32)__popc(g->warp_rep[w]);
                        dropped += g->warp_drop[w];
                    }
                    g->replies = replies;
                    // With several blocks, from the turn wait to the turn store is the
                    // one section that runs a claim at a time: only what must follow
                    // claim order is in it (the output reservation and freeing the slots).
                    if (multi) {
                        // Output in claim order: wait for this claim's turn.
                        while (*(volatile rk_u64*)&S->turn[src] != g->ticket) __nanosleep(32);
                        __threadfence();
                    }
                    g->out_base = replies ? atomicAdd((unsigned long long*)&S->out_tail, (unsigned long long)replies) : 0ull;
                    // The slots were read in full before this point: free them. Host lanes:
                    // a posted store (the producer only needs to learn eventually); the
                    // inbox: a release, K2K senders read it for room.
                    if (host_src) {
                        RkQueueHeader* laneq = (RkQueueHeader*)(p.in_queue + (rk_u64)g->lane * p.lane_stride);
                        *(volatile rk_u64*)&laneq->head = first + k;
                    } else {
                        rk_k2k_st_release(&inbox->head, first + k);
                    }
                    if (replies) *(volatile rk_u64*)&outq->tail = g->out_base + replies;  // a hint for the host
                    if (multi && !partial) {
                        __threadfence();
                        *(volatile rk_u64*)&S->turn[src] = g->ticket + 1;
                    }
                    // Slots promised for messages that did not reply go back.
                    if (k > replies)
                        atomicAdd((unsigned long long*)&S->out_promised, (unsigned long long)(-(long long)(k - replies)));
                    atomicAdd((unsigned long long*)&S->processed[src], (unsigned long long)(k - dropped));
                    if (dropped) atomicAdd((unsigned long long*)&S->dropped[src], (unsigned long long)dropped);
                    if (dropped) rk_xg_st32(&S->last_error, g->err);
                    if (g->drift) rk_xg_st32(&S->last_error, RK_ERR_CLOCK_DRIFT);
                    if (multi && !partial) atomicSub(&S->busy, 1u);
                }
            }
            rk_group_sync(bar_id, gsize);
            RK_PROF(6);

            // ================= write the replies (stamped units) =================
            {
                const rk_u64 out_base = g->out_base;
                const rk_u64 omask = p.out_capacity - 1;
                const rk_u32 total = k * U;
                bool wrote = false;
                for (rk_u32 v = gt; v < total; v += gsize) {
                    const rk_u32 m = v / U, w = v - m * U;
                    if (result[m] != 1) continue;
                    const RkMessageHeader* oh = (const RkMessageHeader*)(stage_out + (rk_u64)m * stride);
                    if (w >= rk_units_used(oh->payload_len)) continue;
                    // Its place among the replies: those of earlier warps, then earlier lanes.
                    const rk_u64 idx = out_base + g->warp_pos[m >> 5] +
                                       (rk_u32)__popc(g->warp_rep[m >> 5] & ((1u << (m & 31u)) - 1u));
                    const rk_u32* s = (const rk_u32*)((const unsigned char*)oh + w * RK_UNIT_DATA);
                    rk_st_volatile_v4(out_units + (idx & omask) * slot_units_bytes + w * RK_UNIT_BYTES,
                                      make_uint4(s[0], s[1], s[2], rk_stamp_of(idx)));
                    wrote = true;
                }
                // Push the replies out of the GPU now rather than when its write path
                // drains (the fence's wait is after the stores have left).
                if (wrote) __threadfence();
            }
        }
        if (prof_me) {
            rk_u64* e = (rk_u64*)p.profile + (prof_n & (pcap - 1)) * 16u;
#pragma unroll
            for (int i = 0; i < 7; i++) ((volatile rk_u64*)e)[i] = prof_t[i];
#pragma unroll
            for (int i = 0; i < 3; i++) ((volatile rk_u64*)e)[8 + i] = prof_r[i];
            // SM cycles the round took so far (upper half), mode and messages taken.
            ((volatile rk_u64*)e)[7] = ((rk_u64)(clock64() - prof_clk) << 32) | ((rk_u64)mode << 16) | k;
            prof_n++;
            *(volatile rk_u64*)((rk_u64*)p.profile + pcap * 16u) = prof_n;
        }
        // Ready for the next round: the per-slot stamp marks.
        if (gt < n) bad[gt] = RK_NO_UNIT;

        // ================= bookkeeping (leader) =================
        if (gt == 0) {
            if (cmd_leader) {
                heartbeat++;
                const rk_u64 processed = rk_xg_ld64(&S->processed[0]) + rk_xg_ld64(&S->processed[1]);
                const rk_u64 dropped = rk_xg_ld64(&S->dropped[0]) + rk_xg_ld64(&S->dropped[1]);
                const rk_u64 taken = rk_xg_ld64(&S->taken);
                const rk_u64 sum = processed + dropped + taken;
                if (sum != mirrored || ack != acked) {
                    mirrored = sum;
                    rk_mirror_counters(cb, S);
                }
                if (ack != acked) {
                    __threadfence_system();
                    rk_st_release_sys32(&cb->command_ack, ack);
                    acked = ack;
                }
                if ((heartbeat & 1023u) == 0) cb->heartbeat = heartbeat;
                // ---- exit: terminating and drained, or terminating while not active ----
                if (rk_xg_ld32(&S->terminating) && !fresh_wait && !g->pending) {
                    const bool active = rk_xg_ld32(&S->active) != 0;
                    // K2K senders that saw the route valid just before the terminate have
                    // RK_K2K_GRACE_NS to finish their reservation.
                    const bool settled = rk_globaltimer_ns() - terminate_at > RK_K2K_GRACE_NS;
                    const bool idle_groups = multi ? rk_xg_ld32(&S->busy) == 0
                                                   : (!two_groups || rk_xg_ld32(&groups[1].k) == 0) &&
                                                         !rk_xg_ld32(&groups[1].pending);
                    const bool drained = rk_xg_ld32(&S->top_lane) == 0 &&
                                         rk_xg_ld64(&S->inbox_claimed) == *(volatile rk_u64*)&inbox->reserve &&
                                         idle_groups;
                    if (!active || (settled && drained)) rk_xg_st32(&S->exit, 1u);
                }
            }
            if (g->k == 0 && !g->pending) {
                // Idle: poll flat out for a while (a poll is a PCIe round trip or an L2
                // read anyway), then back off with __nanosleep, up to 1 us between host
                // polls and 256 ns between inbox polls.
                if (++idle > (host_src ? 4096u : 65536u)) {
                    const rk_u32 most = host_src ? 1024u : 256u;
                    backoff = backoff == 0 ? 32 : (backoff < most ? backoff * 2 : most);
                    __nanosleep(backoff);
                }
            }
        }
        rk_group_sync(bar_id, gsize);
    }

    // ================= exit =================
    __syncthreads();
    if (tid == 0) {
        if (!block0) {
            __threadfence();
            atomicAdd(&S->exited_blocks, 1u);
        } else {
            while (*(volatile rk_u32*)&S->exited_blocks + 1u < gridDim.x) __nanosleep(1000);
            __threadfence();
            rk_publish_route(p, 0u);
            rk_u64 in_head = 0;
            for (int l = 0; l < (int)RK_LANES; l++) in_head += *(volatile rk_u64*)&S->lane_claimed[l];
            cb->input_head = in_head;
            cb->output_tail = *(volatile rk_u64*)&S->out_tail;
            cb->processed = *(volatile rk_u64*)&S->processed[0] + *(volatile rk_u64*)&S->processed[1];
            cb->dropped = *(volatile rk_u64*)&S->dropped[0] + *(volatile rk_u64*)&S->dropped[1];
            cb->hlc = *(volatile rk_u64*)&S->hlc;
            cb->last_error = *(volatile rk_u32*)&S->last_error;
            cb->heartbeat = heartbeat;
            __threadfence_system();
            rk_st_release_sys32(&cb->state, RK_STATE_TERMINATED);
        }
    }
}
