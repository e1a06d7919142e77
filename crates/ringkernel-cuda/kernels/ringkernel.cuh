// ringkernel.cuh: the binary layouts RingKernel shares between the host and CUDA
// devices, and the handler ABI of persistent kernels.
//
// Every struct here mirrors a #[repr(C)] struct of ringkernel-core (or of
// ringkernel-cuda for the CUDA-only ones) field for field. The layout test
// (`layout_matches_rust` in crates/ringkernel-cuda/tests/gpu_smoke.rs) compiles kernels/layout.cu, which
// writes offsetof() of every field, and compares them with the Rust tables.
//
// The file is self-contained (no system headers) so NVRTC compiles it as is.
//
// ---------------------------------------------------------------------------------
// HANDLER ABI
// ---------------------------------------------------------------------------------
//
// A CUDA handler is registered as a GpuHandler whose `cuda` source defines
//
//     __device__ int handle(RkContext* ctx,
//                           const RkMessageHeader* in_hdr, const unsigned char* in_payload,
//                           RkMessageHeader* out_hdr, unsigned char* out_payload,
//                           void* state);
//
// The runtime concatenates this header, the handler source and the persistent template
// (kernels/persistent.cu) and compiles them with NVRTC for the device's architecture.
//
// * It is called once per message, by one thread. `in_hdr`/`in_payload` are a copy of
//   the input slot in device memory (read-only). `out_hdr` is pre-filled as a reply
//   (magic, version, same type_id and payload_len, correlation_id = request's
//   correlation_id, flags = RK_FLAG_REPLY with the kernel's priority in the priority
//   byte, source = this kernel, dest = the request's source (0: the host), timestamp
//   = a fresh HLC tick, node_id = this kernel's clock node id); the handler writes
//   `out_payload` (at most `ctx->max_payload` bytes) and may change
//   `out_hdr->type_id` / `payload_len`.
// * Return 1 to emit the reply into the kernel's output queue, 0 to emit nothing, a
//   negative value to drop the message with that error code (counted in the control
//   block's `dropped`, the code kept in `last_error`).
// * Each call is timed on the device clock (%globaltimer) and reported as the kernel's
//   handler latency. Messages whose slot fails validation (magic, version, length, or
//   the checksum when RK_FLAG_CHECKSUM is set) never reach the handler: they are
//   dropped with RK_ERR_BAD_HEADER / RK_ERR_CHECKSUM.
// * `state` points at the kernel's `state_bytes` of zero-initialised device memory,
//   kept across messages.
// * By default the messages of a batch are handled in parallel, one per thread, and
//   batches from the host lanes and from the K2K inbox are handled at the same time by
//   different warps (replies still leave each source in input order). A handler whose
//   messages depend on each other (through `state`, or by sending K2K messages whose
//   order matters) defines `#define RK_HANDLER_SERIAL 1` before `handle`: messages are
//   then handled one at a time, in order, under a lock shared by every warp.
// * `rk_send_to(ctx, dest_kernel_id, type_id, payload, len)` sends a message to another
//   CUDA kernel of the same runtime on the same GPU, through its device-memory inbox
//   (no host hop), or, in a multi-GPU group (CudaRuntimeGroup), to a kernel on any GPU
//   of the group, writing into that GPU's memory through peer access (NVLink). It
//   returns RK_K2K_DELIVERED, RK_K2K_QUEUE_FULL or RK_K2K_NOT_FOUND. A send to a
//   kernel whose terminate has just begun may still be delivered (the kernel drains
//   it); once that terminate has ended, sends to it return RK_K2K_NOT_FOUND.
//   `rk_send_many_to(ctx, dest, type_id, payloads, len, n)` sends n messages of len
//   bytes each (payload i at payloads + i * len) with one reservation of inbox slots,
//   and returns how many went (a prefix; 0: the inbox is full) or -RK_K2K_NOT_FOUND.
// * `ctx->now` is this kernel's HLC timestamp after merging the request's timestamp
//   (what the CPU backend's `ctx.clock().peek()` returns); its node id is
//   `ctx->node_id`.
// * Priority: the host input is RK_LANES rings, one per priority level (RkLaneTails).
//   Each batch comes from the highest non-empty lane (a batch never mixes lanes; FIFO
//   within a lane), so a HIGH message overtakes any number of waiting LOW ones. The K2K
//   inbox is served beside the host lanes; a message at its head whose priority lane is
//   below the highest host lane holding messages waits until that lane is served.
//   Replies and K2K sends carry the kernel's own priority (`ctx->priority`).
// * Host lanes and the output queue hold *stamped* slots (see "STAMPED SLOTS" below),
//   so the kernel reads a message with one PCIe round trip and publishes a reply
//   without a system fence; handlers see ordinary slots (header + payload) either way.
// ---------------------------------------------------------------------------------

#ifndef RINGKERNEL_CUH
#define RINGKERNEL_CUH

typedef unsigned int rk_u32;
typedef unsigned long long rk_u64;
typedef int rk_i32;

#define RK_MESSAGE_MAGIC 0x474D4B52u /* "RKMG" little-endian */
#define RK_MESSAGE_VERSION 1u
#define RK_HEADER_SIZE 64u

#define RK_FLAG_CHECKSUM (1u << 0)
#define RK_FLAG_REPLY (1u << 1)
#define RK_FLAG_K2K (1u << 2)
#define RK_FLAG_PUBSUB (1u << 3)
#define RK_FLAG_RKYV (1u << 4)
/* The priority of a message (core::priority) lives in bits 8..15 of `flags`. */
#define RK_FLAG_PRIORITY_SHIFT 8u
#define RK_FLAG_PRIORITY_MASK (0xFFu << RK_FLAG_PRIORITY_SHIFT)

/* Input lanes of a persistent kernel: one per priority level (core::priority::LANES);
 * a priority p goes to lane p >> 6 (LOW 0, NORMAL 64, HIGH 128, CRITICAL 192). */
#define RK_LANES 4u
#define RK_LANE_SHIFT 6u

#define RK_CMD_NONE 0u
#define RK_CMD_ACTIVATE 1u
#define RK_CMD_DEACTIVATE 2u
#define RK_CMD_TERMINATE 3u

#define RK_STATE_CREATED 0u
#define RK_STATE_LAUNCHED 1u
#define RK_STATE_ACTIVE 2u
#define RK_STATE_DEACTIVATED 3u
#define RK_STATE_TERMINATING 4u
#define RK_STATE_TERMINATED 5u

#define RK_K2K_DELIVERED 0
#define RK_K2K_QUEUE_FULL 1
#define RK_K2K_NOT_FOUND 2

/* Error codes a kernel writes into ControlBlock.last_error. */
#define RK_ERR_BAD_HEADER 1u
#define RK_ERR_CLOCK_DRIFT 2u
#define RK_ERR_HANDLER 3u
#define RK_ERR_CHECKSUM 4u

/* Latency value of a latency-ring entry for a message no handler ran on
 * (ringkernel-cuda's metrics::NO_SAMPLE). */
#define RK_NO_SAMPLE 0xFFFFFFFFu

#define RK_HLC_LOGICAL_BITS 20
#define RK_HLC_LOGICAL_MASK ((1ull << RK_HLC_LOGICAL_BITS) - 1ull)

/* core::message::MessageHeader (64 bytes). */
struct __align__(8) RkMessageHeader {
    rk_u32 magic;
    rk_u32 version;
    rk_u32 type_id;
    rk_u32 payload_len;
    rk_u64 message_id;
    rk_u64 correlation_id;
    rk_u32 source_kernel;
    rk_u32 dest_kernel;
    rk_u64 timestamp;
    rk_u32 checksum;
    rk_u32 flags;      /* flag bits in the low byte, the priority in bits 8..15 */
    rk_u64 node_id;    /* node id of the clock that stamped `timestamp` */
};
/* The message's HLC timestamp is the pair (`timestamp`, `node_id`): the same two u64 as
 * core's HlcTimestamp { time, node }, where `time` is packed l << 20 | c (physical ms,
 * logical counter; see rk_hlc_pack) and `node` is the stamping clock's node id
 * (core's kernel_node_id: node number << 32 | kernel id). Timestamps order by time,
 * then node, so two clocks never produce equal ones. A kernel's clock state (the
 * control block's `hlc`, RkContext's `now` / `send_ts`) is the packed time only: its
 * node id is the kernel's (RkContext::node_id). */

/* core::control::ControlBlock (128 bytes): line 0 host-written, line 1 device-written. */
struct __align__(128) RkControlBlock {
    /* host line */
    rk_u32 command;
    rk_u32 command_seq;
    rk_u32 kernel_id;
    rk_u32 slot_size;
    rk_u64 input_tail;
    rk_u64 output_head;
    rk_u32 input_capacity;
    rk_u32 output_capacity;
    rk_u64 max_drift_ms;
    rk_u32 host_reserved[4];
    /* device line */
    rk_u32 state;
    rk_u32 command_ack;
    rk_u64 input_head;
    rk_u64 output_tail;
    rk_u64 processed;
    rk_u64 dropped;
    rk_u64 hlc;
    rk_u32 last_error;
    rk_u32 heartbeat;
    rk_u32 device_reserved[2];
};

/* core::queue::QueueHeader (128 bytes): producer line, then consumer line. */
struct __align__(64) RkQueueHeader {
    rk_u64 tail;
    rk_u32 capacity;
    rk_u32 slot_size;
    rk_u32 mask;
    rk_u32 producer_reserved[11];
    rk_u64 head;
    rk_u32 consumer_reserved[14];
};

/* What the kernel polls on the host (ringkernel-cuda's LaneTails, 128 bytes, mapped
 * host memory, written by the host only). Lane l's ring (an RkQueueHeader + stamped
 * slots) is where the host writes its messages; after publishing them it stores the low
 * 32 bits of the ring's new tail into `tail[l]` (release). The host also mirrors the
 * control block's command and command_seq here. The kernel reads the line with two
 * 16-byte loads per round, in the round trip that reads the slots: four lanes and the
 * command cost what one queue did. The device never writes this 128-byte line (on the
 * GPU a read of a host line it has written waits for those writes to drain, measured at
 * microseconds; so the control block, whose other half the device writes, is not
 * polled). A lane never holds more than its capacity (< 2^32) messages, so
 * `tail[l] - (u32)head` is its exact depth. */
struct __align__(128) RkLaneTails {
    rk_u32 tail[4];
    rk_u32 command;
    rk_u32 command_seq;
    rk_u32 reserved[26];
};

/* A K2K inbox in device memory (ringkernel-cuda's DeviceInbox, 128 bytes), followed by
 * `capacity` stamped slots (see "stamped slots" below: units of 12 data bytes and a
 * stamp). Any number of producers (other kernels' warps) reserve indices with a CAS on
 * `reserve` (one per group of lanes sending together) and write their slots' units; the
 * one consumer (the owning kernel) takes slots in index order once their units carry
 * their stamps, and advances `head` (which producers read for room). */
struct __align__(64) RkInbox {
    rk_u64 reserve;
    rk_u32 capacity;
    rk_u32 slot_size;
    rk_u32 mask;
    rk_u32 producer_reserved[11];
    rk_u64 head;
    rk_u32 consumer_reserved[14];
};

/* Device routing table entry (ringkernel-cuda's DeviceRoute, 32 bytes), indexed by
 * kernel id. `valid` is 1 while the kernel accepts K2K messages. The inbox's shape is
 * repeated here, so a sender learns everything from the entry: two 16-byte loads in
 * one round trip, and no dependent read of the inbox before its reservation. */
struct __align__(16) RkRoute {
    rk_u64 inbox;      /* device address of the RkInbox */
    rk_u64 slots;      /* device address of its first stamped slot */
    rk_u32 kernel_id;
    rk_u32 valid;
    rk_u32 capacity;   /* the inbox's slots (a power of two) */
    rk_u32 slot_size;  /* bytes of a message in them (header included) */
};

/* Everything a persistent kernel is launched with (ringkernel-cuda's LaunchParams;
 * passed by value as the only kernel parameter). All fields are 8 bytes wide. */
struct __align__(8) RkLaunchParams {
    rk_u64 control;        /* RkControlBlock*, mapped host memory */
    rk_u64 in_queue;       /* RkQueueHeader* of input lane 0 (mapped host memory), stamped slots follow */
    rk_u64 out_queue;      /* RkQueueHeader*, mapped host memory, stamped slots follow */
    rk_u64 inbox;          /* RkInbox*, device memory */
    rk_u64 inbox_slots;    /* the inbox's stamped slots */
    rk_u64 routes;         /* RkRoute[route_count], device memory */
    rk_u64 route_count;
    rk_u64 stage;          /* the groups' staging slots in device memory; 0: in dynamic shared memory */
    rk_u64 shared;         /* RkShared in device memory (grid_size > 1); 0: in shared memory */
    rk_u64 state;          /* handler state, device memory */
    rk_u64 clock_offset_ns;/* host UNIX time in ns at launch (device maps %globaltimer onto it) */
    rk_u64 kernel_id;
    rk_u64 slot_size;
    rk_u64 in_capacity;
    rk_u64 out_capacity;
    rk_u64 inbox_capacity;
    rk_u64 max_drift_ms;
    rk_u64 latency;        /* rk_u64[latency_capacity] latency ring, mapped host memory (0: none) */
    rk_u64 latency_capacity;
    rk_u64 lane_tails;     /* RkLaneTails*, mapped host memory */
    rk_u64 lane_stride;    /* lane l's RkQueueHeader is at in_queue + l * lane_stride */
    rk_u64 node_id;        /* node id of this kernel's clock (core's kernel_node_id) */
    rk_u64 priority;       /* the kernel's priority (LaunchOptions::priority, 0..255) */
    rk_u64 host_threads;   /* threads of a block serving the host lanes (the rest: the K2K inbox) */
    rk_u64 host_window;    /* most host messages one group takes per round */
    rk_u64 inbox_window;   /* most inbox messages one group takes per round */
    rk_u64 stage_stride;   /* bytes between staged slots (units * 12, rounded up to 16) */
    rk_u64 profile;        /* rk_u64[profile_capacity * 16 + 1] round profile, mapped host memory (0: off) */
    rk_u64 profile_capacity;
    rk_u64 peer_routes;    /* rk_u64[peer_route_count]: other GPUs' routing tables (multi-GPU group); 0: none */
    rk_u64 peer_route_count;
};

/* K2K senders that read a kernel's route as valid may still reserve a slot in its inbox
 * for this long (ns, device clock) after the kernel starts terminating: its drain waits
 * that long before it reads the inbox's `reserve` for the last time, so every such
 * reservation is drained. */
#define RK_K2K_GRACE_NS 1000000ull
/* How long (ns) lane 0's hint may reserve before the route it was taken from is read
 * again (rk_send_to reads it beside the reservation instead): half the grace, so the
 * inbox the hint names is still its kernel's, with its drain still to come. */
#define RK_K2K_HINT_FRESH_NS (RK_K2K_GRACE_NS / 2u)

/* What lane 0 of a warp learned from its last K2K reservation (rk_k2k_reserve): the
 * inbox, the index after the slots it took, and the consumer's head as it last read it
 * (with acquire). Its next reservation into the same inbox tries the compare-and-swap
 * from there, with no read of the inbox first: in isolation 561 cycles against 1,058 on
 * an H200 (notes/cuda_k2k_reserve.cu); a wrong guess costs one more compare-and-swap,
 * which returns the right index. The runtime keeps one per warp in shared memory; lane 0
 * is its only reader and writer, so the head it holds was acquired by the same thread
 * that writes the slots. An inbox's address names one inbox for the life of the kernel
 * (the runtime's pool never hands an inbox's memory out again while it lives).
 *
 * rk_send_to also keeps the route it reserved through: the destination's id (plus one;
 * 0: none), the inbox's slots and shape, and when (device clock, read before the route)
 * the route was last seen valid. Within RK_K2K_HINT_FRESH_NS of that, lane 0 sending
 * alone issues the compare-and-swap beside the route's read instead of after it. */
struct RkK2kHint {
    rk_u64 inbox;
    rk_u64 next;
    rk_u64 head;
    rk_u64 seen_ns;
    rk_u64 slots;
    rk_u64 cap;
    rk_u32 dest1;
    rk_u32 slot_size;
    rk_u64 pad;
};

/* What a handler sees (device-only; not shared with the host). */

struct RkContext {
    rk_u32 kernel_id;
    rk_u32 max_payload;
    rk_u64 message_index; /* position among all messages taken (every lane and the inbox) */
    rk_u64 now;           /* HLC after merging the request */
    const RkRoute* routes;
    rk_u64 route_count;
    rk_u32 slot_size;
    rk_u32 from_inbox;    /* 1 when the message came through the K2K inbox */
    rk_u64 send_ts;       /* HLC timestamp to put on messages this handler sends */
    rk_u64 correlation_id;/* the request's correlation id (carried by replies and K2K sends) */
    rk_u64 node_id;       /* node id of this kernel's clock (stamped next to send_ts) */
    rk_u32 priority;      /* the kernel's priority (carried by replies and K2K sends) */
    rk_u32 lane;          /* input lane the message came from (0..3); inbox messages: 0 */
    RkK2kHint* k2k_hint;  /* the calling warp's (lane 0 uses it; may be null) */
};

/* ---- memory-order helpers (system scope: the host is the other party) ---- */

__device__ __forceinline__ rk_u64 rk_ld_acquire_sys(const rk_u64* p) {
    rk_u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ rk_u32 rk_ld_acquire_sys32(const rk_u32* p) {
    rk_u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
/* Four consecutive 32-bit words (16-byte aligned) with one acquire load: one memory
 * transaction (one PCIe read for mapped host memory); each word is read atomically. */
__device__ __forceinline__ uint4 rk_ld_acquire_sys_v4(const rk_u32* p) {
    uint4 v;
    asm volatile("ld.acquire.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ void rk_st_release_sys(rk_u64* p, rk_u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void rk_st_release_sys32(rk_u32* p, rk_u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ rk_u64 rk_ld_acquire_gpu(const rk_u64* p) {
    rk_u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void rk_st_release_gpu(rk_u64* p, rk_u64 v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/* K2K memory scope. Kernels of a multi-GPU runtime group (ringkernel-cuda's
 * CudaRuntimeGroup) are compiled with RK_K2K_SYSTEM 1: their inboxes are also written by
 * kernels on other GPUs (peer access), so the inbox's reservation (CAS), its head and the
 * loads of both use system scope there. A runtime on one GPU keeps GPU scope. The stamped
 * units themselves are st.volatile / ld.volatile (relaxed, system scope) either way. */
#ifndef RK_K2K_SYSTEM
#define RK_K2K_SYSTEM 0
#endif
__device__ __forceinline__ rk_u64 rk_k2k_ld_acquire(const rk_u64* p) {
#if RK_K2K_SYSTEM
    return rk_ld_acquire_sys(p);
#else
    return rk_ld_acquire_gpu(p);
#endif
}
__device__ __forceinline__ void rk_k2k_st_release(rk_u64* p, rk_u64 v) {
#if RK_K2K_SYSTEM
    rk_st_release_sys(p, v);
#else
    rk_st_release_gpu(p, v);
#endif
}
__device__ __forceinline__ rk_u64 rk_k2k_cas(rk_u64* p, rk_u64 expected, rk_u64 desired) {
#if RK_K2K_SYSTEM
    return atomicCAS_system((unsigned long long*)p, expected, desired);
#else
    return atomicCAS((unsigned long long*)p, expected, desired);
#endif
}
__device__ __forceinline__ rk_u64 rk_globaltimer_ns() {
    rk_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* FNV-1a over `len` bytes (core::message::fnv1a32), for flagged checksums. */
__device__ __forceinline__ rk_u32 rk_fnv1a32(const unsigned char* p, rk_u32 len) {
    rk_u32 h = 0x811c9dc5u;
    for (rk_u32 i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x01000193u;
    }
    return h;
}

/* ---- hybrid logical clock (same packing as ringkernel-core's hlc.rs: 44 | 20) ---- */

__device__ __forceinline__ rk_u64 rk_hlc_pack(rk_u64 l, rk_u64 c) {
    return (l << RK_HLC_LOGICAL_BITS) | (c & RK_HLC_LOGICAL_MASK);
}

/* The merge of rk_hlc_update (with no drift bound) or, for remote 0, rk_hlc_tick, in
 * closed form on packed times: the later of the two times plus one (a carry out of the
 * counter is the next millisecond with counter 0, as both do), unless the physical
 * clock is past both (then its millisecond, counter 0). A few instructions where the
 * field-by-field merge is a chain of 64-bit compares (~450 cycles on an H100, on the
 * persistent kernel's latency path). The lib test `hlc_next_matches_the_merge` checks
 * it against both. */
__device__ __forceinline__ rk_u64 rk_hlc_next(rk_u64 state, rk_u64 remote, rk_u64 pt_ms) {
    const rk_u64 later = remote > state ? remote : state;
    return pt_ms > (later >> RK_HLC_LOGICAL_BITS) ? (pt_ms << RK_HLC_LOGICAL_BITS) : later + 1ull;
}

/* Local / send event. */
__device__ __forceinline__ rk_u64 rk_hlc_tick(rk_u64 state, rk_u64 pt_ms) {
    rk_u64 l = state >> RK_HLC_LOGICAL_BITS, c = state & RK_HLC_LOGICAL_MASK;
    if (pt_ms > l) return rk_hlc_pack(pt_ms, 0);
    if (c + 1 > RK_HLC_LOGICAL_MASK) return rk_hlc_pack(l + 1, 0);
    return rk_hlc_pack(l, c + 1);
}

/* Receive event (Kulkarni et al. 2014) on packed times. Returns 0 (and leaves *state
 * alone) when the remote timestamp is more than max_drift_ms ahead of the physical
 * clock. The remote node id plays no part: it only breaks ties between equal packed
 * times, and the merged time is a fresh local one, greater than both inputs (as core's
 * HlcClock::update, which also takes the time alone). */
__device__ __forceinline__ int rk_hlc_update(rk_u64* state, rk_u64 remote, rk_u64 pt_ms, rk_u64 max_drift_ms) {
    rk_u64 l = *state >> RK_HLC_LOGICAL_BITS, c = *state & RK_HLC_LOGICAL_MASK;
    rk_u64 ml = remote >> RK_HLC_LOGICAL_BITS, mc = remote & RK_HLC_LOGICAL_MASK;
    if (ml > pt_ms && ml - pt_ms > max_drift_ms) return 0;
    rk_u64 nl = l > ml ? l : ml;
    if (pt_ms > nl) nl = pt_ms;
    rk_u64 nc;
    if (nl == l && nl == ml) nc = (c > mc ? c : mc) + 1;
    else if (nl == l) nc = c + 1;
    else if (nl == ml) nc = mc + 1;
    else nc = 0;
    if (nc > RK_HLC_LOGICAL_MASK) { nl += 1; nc = 0; }
    *state = rk_hlc_pack(nl, nc);
    return 1;
}

/* ---- stamped slots (core's queue::stamped) ----
 * A ring of stamped slots stores each logical slot (64-byte header + payload,
 * slot_size bytes) as units of 16 bytes: 12 bytes of the slot, then a 4-byte stamp,
 * the low 32 bits of the message's ring index plus one. A unit whose 16-byte load
 * shows the expected stamp holds that message's bytes (the writer stores the data
 * before the stamp, and a 16-byte aligned load is one snapshot of its cache line), so
 * a reader takes a whole message with one round trip and no index: it reads every
 * unit at once and checks the stamps of the units that the header's payload_len says
 * are used. Writers on the device store each unit (data and stamp) with one 16-byte
 * store and need no fence. */
#define RK_UNIT_BYTES 16u
#define RK_UNIT_DATA 12u

__device__ __forceinline__ rk_u32 rk_units_per_slot(rk_u32 slot_size) {
    return (slot_size + RK_UNIT_DATA - 1) / RK_UNIT_DATA;
}
/* Units a message of payload_len bytes uses (its header's included). */
__device__ __forceinline__ rk_u32 rk_units_used(rk_u32 payload_len) {
    return (RK_HEADER_SIZE + payload_len + RK_UNIT_DATA - 1) / RK_UNIT_DATA;
}
__device__ __forceinline__ rk_u32 rk_stamp_of(rk_u64 index) {
    return (rk_u32)index + 1u;
}
/* 16-byte loads and stores that bypass the caches (host memory, other kernels). */
__device__ __forceinline__ uint4 rk_ld_volatile_v4(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ void rk_st_volatile_v4(void* p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
}

/* ---- K2K send into another kernel's device inbox ---- */

/* Word `w` (4 bytes at byte 4w) of the message `header ++ payload[0..len]`, zero past
 * its end. */
__device__ __forceinline__ rk_u32 rk_message_word(const rk_u32* header, const unsigned char* payload, rk_u32 len,
                                                  rk_u32 w) {
    if (w < RK_HEADER_SIZE / 4u) return header[w];
    const rk_u32 off = w * 4u - RK_HEADER_SIZE;
    if (off >= len) return 0u;
    if (off + 4u <= len && (((unsigned long long)(payload + off)) & 3ull) == 0) return *(const rk_u32*)(payload + off);
    rk_u32 v = 0;
    for (rk_u32 b = 0; b < 4u && off + b < len; b++) v |= (rk_u32)payload[off + b] << (8u * b);
    return v;
}

/* Where K2K messages to one kernel go: its inbox and slots, and the inbox's shape (all
 * from its route entry). */
struct RkK2kDest {
    RkInbox* ib;
    unsigned char* slots;
    rk_u64 cap;
    rk_u64 slot_bytes;  /* bytes of a stamped slot */
    rk_u32 slot_size;   /* the slot's size (header and payload) */
};

/* Whether a message of `len` payload bytes may go to kernel `dest` at all: it fits this
 * kernel's slots and `dest` has an entry in the routing table. */
__device__ __forceinline__ bool rk_k2k_routable(const RkContext* ctx, rk_u32 dest, rk_u32 len) {
    return len <= ctx->max_payload && (rk_u64)dest < ctx->route_count;
}

/* Loads kernel `dest`'s route entry (rk_k2k_routable first): both halves in flight
 * together (one round trip, where the inbox's shape used to be a second, dependent
 * one). */
__device__ __forceinline__ void rk_k2k_route_load(const RkContext* ctx, rk_u32 dest, uint4* a, uint4* b) {
    *a = rk_ld_volatile_v4(&ctx->routes[dest]);
    *b = rk_ld_volatile_v4((const unsigned char*)&ctx->routes[dest] + 16);
}

/* Kernel `dest`'s inbox from its route entry (a, b) for a message of `len` payload
 * bytes; false when the kernel does not accept K2K messages now or the message does not
 * fit its slots. */
__device__ __forceinline__ bool rk_k2k_route_from(uint4 a, uint4 b, rk_u32 dest, rk_u32 len, RkK2kDest* d) {
    if (b.y != 1u || b.x != dest) return false;
    d->ib = (RkInbox*)((rk_u64)a.x | ((rk_u64)a.y << 32));
    d->slots = (unsigned char*)((rk_u64)a.z | ((rk_u64)a.w << 32));
    const rk_u32 slot_size = b.w;
    d->slot_size = slot_size;
    d->cap = b.z;
    d->slot_bytes = (rk_u64)rk_units_per_slot(slot_size) * RK_UNIT_BYTES;
    return len <= slot_size - RK_HEADER_SIZE;
}

/* Kernel `dest`'s inbox for a message of `len` payload bytes; false when it does not
 * exist, does not accept K2K messages now, or the message does not fit its slots (or
 * this kernel's). */
__device__ __forceinline__ bool rk_k2k_route(const RkContext* ctx, rk_u32 dest, rk_u32 len, RkK2kDest* d) {
    if (!rk_k2k_routable(ctx, dest, len)) return false;
    uint4 a, b;
    rk_k2k_route_load(ctx, dest, &a, &b);
    return rk_k2k_route_from(a, b, dest, len, d);
}

/* The inbox a warp's hint names (rk_send_to's route: the hint's `dest1` set). */
__device__ __forceinline__ RkK2kDest rk_k2k_hint_dest(const RkK2kHint* h) {
    RkK2kDest d;
    d.ib = (RkInbox*)h->inbox;
    d.slots = (unsigned char*)h->slots;
    d.cap = h->cap;
    d.slot_size = h->slot_size;
    d.slot_bytes = (rk_u64)rk_units_per_slot(h->slot_size) * RK_UNIT_BYTES;
    return d;
}

/* Records in lane 0's hint the route to kernel `dest` it just reserved through (`d`,
 * the hint's inbox), seen valid at device time `t` or later. */
__device__ __forceinline__ void rk_k2k_hint_keep(RkK2kHint* h, rk_u32 dest, rk_u64 t, const RkK2kDest& d) {
    h->dest1 = dest + 1u;
    h->seen_ns = t;
    h->slots = (rk_u64)d.slots;
    h->cap = d.cap;
    h->slot_size = d.slot_size;
}

/* The reservation itself, made by one thread for `total` slots: the compare-and-swap on
 * the inbox's `reserve`. Returns how many it got (fewer when the inbox is full, 0 when
 * it is) and their first index in *base. With `h` (lane 0's RkK2kHint) it starts from
 * the hint when the hint names this inbox, and updates it. */
__device__ __forceinline__ rk_u32 rk_k2k_claim(const RkK2kDest& d, rk_u32 total, RkK2kHint* h, rk_u64* base) {
    RkInbox* ib = d.ib;
    // The reservation and the consumer's head are read together (one round trip), or,
    // when lane 0 last reserved in this inbox, taken from its hint (no read). A head read
    // earlier is still a safe bound on the room (the consumer only moves it forward), so
    // a lost race retries the compare-and-swap with the value it returned and reads the
    // head again only when that bound says full.
    rk_u64 idx, head;
    bool fresh;
    if (h && h->inbox == (rk_u64)ib) {
        idx = h->next;
        head = h->head;
        fresh = false;
    } else {
        idx = *(volatile rk_u64*)&ib->reserve;
        head = rk_k2k_ld_acquire(&ib->head);
        fresh = true;
    }
    rk_u32 got;
    for (;;) {
        // An index behind the head (a guess that others overtook, or `reserve` read
        // before a later head) is not the index: the swap from the head returns it.
        if (idx < head) idx = head;
        rk_u64 room = idx - head >= d.cap ? 0ull : d.cap - (idx - head);
        if (room < (rk_u64)total && !fresh) {
            head = rk_k2k_ld_acquire(&ib->head);
            room = idx - head >= d.cap ? 0ull : d.cap - (idx - head);
        }
        got = room < (rk_u64)total ? (rk_u32)room : total;
        if (got == 0) break;
        const rk_u64 seen = rk_k2k_cas(&ib->reserve, idx, idx + got);
        if (seen == idx) break;
        idx = seen;
        fresh = false;
    }
    *base = idx;
    if (h) {
        // A hint for another inbox no longer describes rk_send_to's route.
        if (h->inbox != (rk_u64)ib) h->dest1 = 0u;
        h->inbox = (rk_u64)ib;
        h->next = idx + got;
        h->head = head;
    }
    return got;
}

/* Lanes of the calling warp that send to the same inbox at the same time reserve their
 * slots together: one CAS on the inbox's `reserve` for the group, `want` slots for this
 * lane, in lane order (ONE: every lane of the group wants one). Returns how many of them
 * this lane got (a prefix; fewer when the inbox is full) and their first index in
 * *first. `hint` is the warp's RkK2kHint (null: none); a group that lane 0 leads uses
 * and updates it. */
template <bool ONE>
__device__ __forceinline__ rk_u32 rk_k2k_reserve(const RkK2kDest& d, rk_u32 want, rk_u64* first, RkK2kHint* hint) {
    const unsigned active = __activemask();
    const int lane = (int)(threadIdx.x & 31u);
    if (active == (1u << lane)) {
        // Alone in the warp (a handler run by one lane, as the one-message loop runs
        // them): a group of one, so no match and no shuffles.
        return rk_k2k_claim(d, want, lane == 0 ? hint : nullptr, first);
    }
    const unsigned peers = __match_any_sync(active, (unsigned long long)d.ib);
    const int leader = __ffs(peers) - 1;
    // This lane's offset among the group's slots: the wants of the peers before it
    // (counted from the group's mask when every peer wants one, as in rk_send_to).
    rk_u32 before, total;
    if (ONE) {
        before = (rk_u32)__popc(peers & ((1u << lane) - 1u));
        total = (rk_u32)__popc(peers);
    } else {
        before = 0;
        total = 0;
        for (unsigned m = peers; m; m &= m - 1u) {
            const int l = __ffs(m) - 1;
            const rk_u32 w = __shfl_sync(peers, want, l);
            if (l < lane) before += w;
            total += w;
        }
    }
    rk_u64 base = 0;
    rk_u32 got = 0;
    if (lane == leader) got = rk_k2k_claim(d, total, leader == 0 ? hint : nullptr, &base);
    base = __shfl_sync(peers, base, leader);
    got = __shfl_sync(peers, got, leader);
    *first = base + before;
    return got <= before ? 0u : (got - before < want ? got - before : want);
}

/* Writes message `idx` of the inbox: the header `hw` (16 words) and `len` payload bytes
 * as stamped units, each with one 16-byte store: no fence, and the receiver takes it
 * with one read. */
__device__ __forceinline__ void rk_k2k_write(const RkK2kDest& d, rk_u64 idx, const rk_u32* hw,
                                             const unsigned char* pl, rk_u32 len) {
    unsigned char* slot = d.slots + (idx & (d.cap - 1)) * d.slot_bytes;
    const rk_u32 units = rk_units_used(len);
    const rk_u32 stamp = rk_stamp_of(idx);
    for (rk_u32 k = 0; k < units; k++) {
        const rk_u32 w = k * 3u;
        rk_st_volatile_v4(slot + k * RK_UNIT_BYTES,
                          make_uint4(rk_message_word(hw, pl, len, w), rk_message_word(hw, pl, len, w + 1),
                                     rk_message_word(hw, pl, len, w + 2), stamp));
    }
}

/* The header of a K2K message this handler sends. */
__device__ __forceinline__ void rk_k2k_header(const RkContext* ctx, RkMessageHeader* h, rk_u32 dest, rk_u32 type_id,
                                              rk_u32 len) {
    h->magic = RK_MESSAGE_MAGIC;
    h->version = RK_MESSAGE_VERSION;
    h->type_id = type_id;
    h->payload_len = len;
    h->message_id = ((rk_u64)ctx->kernel_id << 40) | (ctx->message_index & 0xFFFFFFFFFFull);
    h->correlation_id = ctx->correlation_id;
    h->source_kernel = ctx->kernel_id;
    h->dest_kernel = dest;
    h->timestamp = ctx->send_ts;
    h->checksum = 0;
    h->flags = RK_FLAG_K2K | ((ctx->priority << RK_FLAG_PRIORITY_SHIFT) & RK_FLAG_PRIORITY_MASK);
    h->node_id = ctx->node_id;
}

/* Sends one message (see the contract above). A lane whose slot did not fit gets
 * RK_K2K_QUEUE_FULL (nothing was written for it). */
__device__ inline int rk_send_to(RkContext* ctx, rk_u32 dest, rk_u32 type_id, const void* payload, rk_u32 len) {
    if (!rk_k2k_routable(ctx, dest, len)) return RK_K2K_NOT_FOUND;
    RkK2kHint* const h = ctx->k2k_hint;
    const bool alone0 = h && (threadIdx.x & 31u) == 0u && __activemask() == 1u;
    // Read before the route: the route is valid at this time or later.
    const rk_u64 t = alone0 ? rk_globaltimer_ns() : 0ull;
    // The route entry, in flight while the hint is looked at.
    uint4 a, b;
    rk_k2k_route_load(ctx, dest, &a, &b);
    RkK2kDest d;
    rk_u64 idx;
    union {
        RkMessageHeader h;
        rk_u32 w[16];
    } u;
    if (alone0 && h->dest1 == dest + 1u && len + RK_HEADER_SIZE <= h->slot_size &&
        t - h->seen_ns < RK_K2K_HINT_FRESH_NS) {
        // The route was valid under RK_K2K_HINT_FRESH_NS ago, so its kernel has not
        // finished terminating and the hint's inbox is still its own: the compare-and-swap
        // from the hint goes out while the route is read again, not after (one round trip
        // to L2 instead of two).
        RkInbox* const ib = (RkInbox*)h->inbox;
        idx = h->next;
        const rk_u64 head = h->head;
        const bool room = idx >= head && idx - head < h->cap;
        const rk_u64 seen = room ? rk_k2k_cas(&ib->reserve, idx, idx + 1u) : ~idx;
        const bool live = b.y == 1u && b.x == dest;
        const bool valid = live && ((rk_u64)a.x | ((rk_u64)a.y << 32)) == h->inbox;
        if (seen == idx) {
            // The slot is ours, and the kernel drains it even if the route went invalid
            // meanwhile (it is within its grace): the message goes.
            h->next = idx + 1u;
            if (valid) {
                h->seen_ns = t;
            } else {
                h->dest1 = 0u;
            }
            d = rk_k2k_hint_dest(h);
            rk_k2k_header(ctx, &u.h, dest, type_id, len);
            rk_k2k_write(d, idx, u.w, (const unsigned char*)payload, len);
            return RK_K2K_DELIVERED;
        }
        // Another sender moved `reserve` (or the hint saw no room): the ordinary
        // reservation below, from what the compare-and-swap saw.
        h->dest1 = 0u;
        if (room && valid) h->next = seen;
    }
    if (!rk_k2k_route_from(a, b, dest, len, &d)) return RK_K2K_NOT_FOUND;
    if (rk_k2k_reserve<true>(d, 1u, &idx, h) == 0u) return RK_K2K_QUEUE_FULL;
    // Lane 0 alone reserved through this route, which was valid at `t` or later.
    if (alone0) rk_k2k_hint_keep(h, dest, t, d);
    rk_k2k_header(ctx, &u.h, dest, type_id, len);
    rk_k2k_write(d, idx, u.w, (const unsigned char*)payload, len);
    return RK_K2K_DELIVERED;
}

/* Sends `n` messages of `len` payload bytes each, the i-th at `payloads + i * len`, in
 * order, with one reservation (warp-aggregated as in rk_send_to) for all of them.
 * Returns how many were delivered, a prefix (0 when the inbox is full: the caller sends
 * the rest later), or -RK_K2K_NOT_FOUND. */
__device__ inline int rk_send_many_to(RkContext* ctx, rk_u32 dest, rk_u32 type_id, const void* payloads, rk_u32 len,
                                      rk_u32 n) {
    RkK2kDest d;
    if (!rk_k2k_route(ctx, dest, len, &d)) return -(int)RK_K2K_NOT_FOUND;
    rk_u64 idx;
    const rk_u32 got = rk_k2k_reserve<false>(d, n, &idx, ctx->k2k_hint);
    union {
        RkMessageHeader h;
        rk_u32 w[16];
    } u;
    rk_k2k_header(ctx, &u.h, dest, type_id, len);
    for (rk_u32 i = 0; i < got; i++)
        rk_k2k_write(d, idx + i, u.w, (const unsigned char*)payloads + (rk_u64)i * len, len);
    return (int)got;
}

#endif /* RINGKERNEL_CUH */
