// persistent.cu: the persistent-kernel template. Compiled by NVRTC after
// ringkernel.cuh and the user's handler source (which defines `handle`).
//
// One block per kernel. Thread 0 owns the control logic (commands, queue indices,
// HLC); all threads copy message slots in and out with 16-byte loads/stores and, unless
// the handler is serial, run the handler on one message each.
//
// Host memory (mapped): control block, the input lanes' tails (RkLaneTails) and rings
// (one per priority level; the host produces), output queue (device produces), latency
// ring (one entry per message: the handler's run time on %globaltimer, see
// ringkernel-cuda's metrics.rs). Device memory: the K2K inbox (other kernels produce),
// scratch copies of the slots being handled, handler state.
//
// Each batch comes from one source: the highest non-empty input lane, or the K2K
// inbox (taken in turns with the host lanes so neither starves). Replies leave in the
// order of the batch.

#ifndef RK_HANDLER_SERIAL
#define RK_HANDLER_SERIAL 0
#endif

#define RK_MAX_BLOCK 1024

__device__ __forceinline__ rk_u64 rk_now_ms(rk_u64 clock_offset_ns) {
    return (rk_globaltimer_ns() + clock_offset_ns) / 1000000ull;
}

extern "C" __global__ void __launch_bounds__(RK_MAX_BLOCK) rk_persistent(RkLaunchParams p) {
    RkControlBlock* cb = (RkControlBlock*)p.control;
    const rk_u32* lane_tails = (const rk_u32*)p.lane_tails;
    RkQueueHeader* outq = (RkQueueHeader*)p.out_queue;
    unsigned char* out_slots = (unsigned char*)(outq + 1);
    RkInbox* inbox = (RkInbox*)p.inbox;
    unsigned char* inbox_slots = (unsigned char*)p.inbox_slots;
    rk_u64* inbox_ready = (rk_u64*)p.inbox_ready;
    unsigned char* scratch_in = (unsigned char*)p.scratch_in;
    unsigned char* scratch_out = (unsigned char*)p.scratch_out;
    const rk_u32 slot = (rk_u32)p.slot_size;
    const rk_u32 tid = threadIdx.x;
    const rk_u32 nthreads = blockDim.x;
    // p.clock_offset_ns is the host's UNIX time (ns) at launch; the difference to
    // %globaltimer now maps device time to UNIX time (off by the launch latency).
    const rk_u64 clock_off = p.clock_offset_ns - rk_globaltimer_ns();

    __shared__ rk_u32 s_n;          // messages in this batch
    __shared__ rk_u32 s_src;        // 0: host input lane s_lane, 1: K2K inbox
    __shared__ rk_u32 s_lane;       // input lane of the batch (s_src == 0)
    __shared__ rk_u32 s_exit;
    __shared__ rk_u64 s_first;      // index of the first message of the batch
    __shared__ rk_u64 s_sample;     // messages taken before this batch (latency ring index)
    __shared__ rk_u64 s_out_tail;
    __shared__ rk_u64 s_inbox_head;
    __shared__ rk_u32 s_warp_ready[RK_MAX_BLOCK / 32];
    __shared__ rk_u64 s_recv_ts[RK_MAX_BLOCK];
    __shared__ rk_u64 s_send_ts[RK_MAX_BLOCK];
    __shared__ int s_result[RK_MAX_BLOCK];
    __shared__ rk_u32 s_pos[RK_MAX_BLOCK];

    // Thread 0's private view.
    rk_u32 state = RK_STATE_LAUNCHED;
    rk_u32 ack = 0;
    bool terminating = false;
    // Per input lane: messages taken (the ring's head) and the tail's low 32 bits as last
    // read. Indexed with constants only (unrolled loops), so they stay in registers.
    rk_u64 lane_head[RK_LANES];
    rk_u32 lane_tail[RK_LANES];
#pragma unroll
    for (int l = 0; l < (int)RK_LANES; l++) {
        lane_head[l] = 0;
        lane_tail[l] = 0;
    }
    rk_u32 cur_lane = 0;  // lane of the current batch
    // in_taken: messages taken from all host lanes (the control block's input_head).
    rk_u64 in_taken = 0, out_tail = 0, out_head_seen = 0, inbox_head = 0;
    // processed: handler ran and succeeded; dropped: refused or corrupt (the host's
    // metrics semantics); taken: every message taken (the latency ring's index).
    rk_u64 hlc = 0, processed = 0, dropped = 0, taken = 0;
    rk_u32 batch_dropped = 0;
    rk_u32 last_error = 0, heartbeat = 0, backoff = 0, idle_rounds = 0;
    bool prefer_inbox = false;
    bool mirrors_dirty = false;
    const rk_u32 nwarps = (nthreads + 31) / 32;

    RkRoute* my_route = p.kernel_id < p.route_count ? (RkRoute*)p.routes + p.kernel_id : (RkRoute*)0;
    if (tid == 0) {
        // Publish this kernel's inbox in the device routing table (the table belongs to
        // the device: the host never copies into it while kernels run).
        if (my_route) {
            my_route->inbox = p.inbox;
            my_route->slots = p.inbox_slots;
            my_route->ready = p.inbox_ready;
            my_route->kernel_id = (rk_u32)p.kernel_id;
            __threadfence();
            *(volatile rk_u32*)&my_route->valid = 1u;
        }
        hlc = rk_hlc_tick(0, rk_now_ms(clock_off));
        cb->hlc = hlc;
        cb->input_head = 0;
        cb->output_tail = 0;
        s_lane = 0;
        s_inbox_head = 0;
        __threadfence_system();
        rk_st_release_sys32(&cb->state, RK_STATE_LAUNCHED);
    }
    __syncthreads();

    for (;;) {
        // ---- inbox: every thread checks one ready word, in parallel (device memory,
        // off the host round trip; also while inactive, so the first round after an
        // activate already sees what K2K senders left, and can rank it by priority) ----
        {
            const rk_u64 ih = s_inbox_head;
            bool ready = false;
            if (tid < p.inbox_capacity) {
                const rk_u64 idx = ih + tid;
                ready = *(volatile const rk_u64*)&inbox_ready[idx & (p.inbox_capacity - 1)] == idx + 1;
            }
            // Lanes that exist in this warp (the last warp may be partial).
            const rk_u32 lanes = nthreads - (tid & ~31u) >= 32u ? 32u : nthreads - (tid & ~31u);
            const unsigned mask = lanes == 32u ? 0xffffffffu : ((1u << lanes) - 1u);
            const unsigned ballot = __ballot_sync(mask, ready);
            if ((tid & 31) == 0) s_warp_ready[tid / 32] = ballot == mask ? lanes : (rk_u32)(__ffs(~ballot) - 1);
        }
        if (tid == 0) {
            // The command word (relaxed) and every input lane's tail (one 16-byte
            // acquire load, see RkLaneTails), issued back to back so their PCIe round
            // trips overlap: the same two reads per poll as with a single input queue.
            rk_u32 seq = *(volatile const rk_u32*)&cb->command_seq;
            const uint4 tails = rk_ld_acquire_sys_v4(lane_tails);
            lane_tail[0] = tails.x;
            lane_tail[1] = tails.y;
            lane_tail[2] = tails.z;
            lane_tail[3] = tails.w;
            if (seq != ack) {
                __threadfence_system();  // acquire for the command word
                rk_u32 cmd = *(volatile rk_u32*)&cb->command;
                if (cmd == RK_CMD_ACTIVATE) state = RK_STATE_ACTIVE;
                else if (cmd == RK_CMD_DEACTIVATE) state = RK_STATE_DEACTIVATED;
                else if (cmd == RK_CMD_TERMINATE) {
                    terminating = true;
                    // From now on K2K senders get NOT_FOUND; what is already in the
                    // inbox is still drained (when active).
                    if (my_route) {
                        *(volatile rk_u32*)&my_route->valid = 0u;
                        __threadfence();
                    }
                }
                ack = seq;
                cb->state = terminating ? RK_STATE_TERMINATING : state;
                __threadfence_system();
                rk_st_release_sys32(&cb->command_ack, ack);
                // Read the tails again, after the command: the tails above may have been
                // read before messages the host sent ahead of the command (the two loads
                // are not ordered), and an activated kernel must see every message sent
                // before `activate` to take the highest lane first. Commands only: the
                // message path keeps its two reads per poll.
                const uint4 after = rk_ld_acquire_sys_v4(lane_tails);
                lane_tail[0] = after.x;
                lane_tail[1] = after.y;
                lane_tail[2] = after.z;
                lane_tail[3] = after.w;
            }
        }
        __syncthreads();  // s_warp_ready complete
        if (tid == 0) {
            rk_u32 n = 0, src = 0;
            s_exit = 0;
            if (state == RK_STATE_ACTIVE) {
                // The highest non-empty lane; its depth is exact in 32 bits (a lane
                // holds at most in_capacity < 2^32 messages).
                rk_u64 avail_in = 0;
                rk_u32 lane = 0;
#pragma unroll
                for (int l = 0; l < (int)RK_LANES; l++) {
                    const rk_u32 d = lane_tail[l] - (rk_u32)lane_head[l];
                    if (d != 0u) {
                        avail_in = d;
                        lane = (rk_u32)l;
                    }
                }
                rk_u64 avail_box = 0;
                for (rk_u32 w = 0; w < nwarps; w++) {
                    avail_box += s_warp_ready[w];
                    if (s_warp_ready[w] != 32u) break;
                }
                if (avail_box > p.inbox_capacity) avail_box = p.inbox_capacity;
                if (avail_box > nthreads) avail_box = nthreads;
                rk_u64 free_out = p.out_capacity - (out_tail - out_head_seen);
                if (free_out < nthreads && free_out < avail_in + avail_box) {
                    out_head_seen = rk_ld_acquire_sys(&outq->head);
                    free_out = p.out_capacity - (out_tail - out_head_seen);
                }
                // Both sources waiting: the one whose next message has the higher
                // priority lane goes first (the inbox is one FIFO lane, ranked by the
                // message at its head); on a tie, alternate so neither starves.
                bool use_box = avail_box > 0 && (avail_in == 0 || prefer_inbox);
                if (avail_box > 0 && avail_in > 0) {
                    __threadfence();  // acquire: the head slot after its ready word
                    const RkMessageHeader* bh = (const RkMessageHeader*)(inbox_slots +
                        (inbox_head & (p.inbox_capacity - 1)) * (rk_u64)slot);
                    const rk_u32 box_lane =
                        ((*(volatile const rk_u32*)&bh->flags & RK_FLAG_PRIORITY_MASK) >>
                         RK_FLAG_PRIORITY_SHIFT) >> RK_LANE_SHIFT;
                    if (box_lane != lane) use_box = box_lane > lane;
                }
                rk_u64 avail = use_box ? avail_box : avail_in;
                src = use_box ? 1 : 0;
                cur_lane = lane;
                prefer_inbox = !use_box;
                rk_u64 m = avail < free_out ? avail : free_out;
                if (m > nthreads) m = nthreads;
                n = (rk_u32)m;
                if (terminating && avail_in == 0 && avail_box == 0) s_exit = 1;
                if (n && use_box) __threadfence();  // acquire: slot data after the ready words
            } else if (terminating) {
                s_exit = 1;  // not active: leave the queued messages to the host
            }
            s_n = n;
            s_src = src;
            s_lane = cur_lane;
            rk_u64 lane_first = 0;
#pragma unroll
            for (int l = 0; l < (int)RK_LANES; l++) {
                if ((rk_u32)l == cur_lane) lane_first = lane_head[l];
            }
            s_first = src ? inbox_head : lane_first;
            s_sample = taken;
            s_out_tail = out_tail;
            heartbeat++;
            if (n == 0 && !s_exit && mirrors_dirty) {
                // First idle round after work: publish the clock (kept off the hot path).
                cb->hlc = hlc;
                mirrors_dirty = false;
            }
            if (n == 0 && !s_exit) {
                // Busy-poll for a while after the last message (a poll is one PCIe
                // round trip anyway), then back off with __nanosleep up to 4 us.
                if ((heartbeat & 1023u) == 0) cb->heartbeat = heartbeat;
                if (++idle_rounds > 4096) {
                    backoff = backoff == 0 ? 64 : (backoff < 4096 ? backoff * 2 : 4096);
                    __nanosleep(backoff);
                }
            } else {
                backoff = 0;
                idle_rounds = 0;
            }
        }
        __syncthreads();
        if (s_exit) break;
        const rk_u32 n = s_n;
        if (n == 0) continue;
        const rk_u32 src = s_src;
        const rk_u64 first = s_first;

        // ---- copy the batch into device scratch (16-byte loads, all threads; up to
        // eight loads in flight per thread before their stores) ----
        {
            const rk_u32 vec_per_slot = slot / 16;
            const rk_u32 total = n * vec_per_slot;
            const unsigned char* ring =
                src == 0 ? (const unsigned char*)(p.in_queue + (rk_u64)s_lane * p.lane_stride + sizeof(RkQueueHeader))
                         : inbox_slots;
            const rk_u64 cap_mask = (src == 0 ? p.in_capacity : p.inbox_capacity) - 1;
            for (rk_u32 base = 0; base < total; base += 8 * nthreads) {
                uint4 v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const rk_u32 i = base + u * nthreads + tid;
                    if (i < total) {
                        const rk_u32 m = i / vec_per_slot, w = i % vec_per_slot;
                        v[u] = __ldcv((const uint4*)(ring + ((first + m) & cap_mask) * slot) + w);
                    }
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const rk_u32 i = base + u * nthreads + tid;
                    if (i < total) ((uint4*)scratch_in)[i] = v[u];
                }
            }
        }
        __syncthreads();

        // ---- clocks: merge each request, tick for each reply (thread 0, in order) ----
        if (tid == 0) {
            rk_u64 pt = rk_now_ms(clock_off);
            for (rk_u32 m = 0; m < n; m++) {
                const RkMessageHeader* h = (const RkMessageHeader*)(scratch_in + (rk_u64)m * slot);
                if (!rk_hlc_update(&hlc, h->timestamp, pt, p.max_drift_ms)) {
                    hlc = rk_hlc_tick(hlc, pt);
                    last_error = RK_ERR_CLOCK_DRIFT;
                }
                s_recv_ts[m] = hlc;
                hlc = rk_hlc_tick(hlc, pt);
                s_send_ts[m] = hlc;
            }
        }
        __syncthreads();

        // ---- run the handler ----
#if RK_HANDLER_SERIAL
        if (tid == 0) {
            for (rk_u32 m = 0; m < n; m++) {
#else
        for (rk_u32 m = tid; m < n; m += nthreads) {
            {
#endif
                const RkMessageHeader* ih = (const RkMessageHeader*)(scratch_in + (rk_u64)m * slot);
                RkMessageHeader* oh = (RkMessageHeader*)(scratch_out + (rk_u64)m * slot);
                int r;
                rk_u32 lat = RK_NO_SAMPLE;
                // The same checks as the host's read path (core's slot rings).
                if (ih->magic != RK_MESSAGE_MAGIC || ih->version != RK_MESSAGE_VERSION ||
                    ih->payload_len > slot - RK_HEADER_SIZE) {
                    r = -(int)RK_ERR_BAD_HEADER;
                } else if ((ih->flags & RK_FLAG_CHECKSUM) &&
                           rk_fnv1a32((const unsigned char*)(ih + 1), ih->payload_len) != ih->checksum) {
                    r = -(int)RK_ERR_CHECKSUM;
                } else {
                    RkContext ctx;
                    ctx.kernel_id = (rk_u32)p.kernel_id;
                    ctx.max_payload = slot - RK_HEADER_SIZE;
                    ctx.message_index = s_sample + m;
                    ctx.now = s_recv_ts[m];
                    ctx.routes = (const RkRoute*)p.routes;
                    ctx.route_count = p.route_count;
                    ctx.slot_size = slot;
                    ctx.from_inbox = src;
                    ctx.send_ts = s_send_ts[m];
                    ctx.correlation_id = ih->correlation_id;
                    ctx.node_id = p.node_id;
                    ctx.priority = (rk_u32)p.priority;
                    ctx.lane = src == 0 ? s_lane : 0u;
                    oh->magic = RK_MESSAGE_MAGIC;
                    oh->version = RK_MESSAGE_VERSION;
                    oh->type_id = ih->type_id;
                    oh->payload_len = ih->payload_len;
                    oh->message_id = ((rk_u64)p.kernel_id << 40) | ((s_sample + m) & 0xFFFFFFFFFFull);
                    oh->correlation_id = ih->correlation_id;
                    oh->source_kernel = (rk_u32)p.kernel_id;
                    oh->dest_kernel = ih->source_kernel;
                    oh->timestamp = s_send_ts[m];
                    oh->checksum = 0;
                    oh->flags = RK_FLAG_REPLY | (((rk_u32)p.priority << RK_FLAG_PRIORITY_SHIFT) & RK_FLAG_PRIORITY_MASK);
                    oh->node_id = p.node_id;
                    const rk_u64 t0 = rk_globaltimer_ns();
                    r = handle(&ctx, ih, (const unsigned char*)(ih + 1), oh, (unsigned char*)(oh + 1), (void*)p.state);
                    const rk_u64 dt = rk_globaltimer_ns() - t0;
                    lat = dt < (rk_u64)RK_NO_SAMPLE ? (rk_u32)dt : RK_NO_SAMPLE - 1u;
                    if (r == 1 && oh->payload_len > slot - RK_HEADER_SIZE) r = -(int)RK_ERR_HANDLER;
                }
                s_result[m] = r;
                if (p.latency) {
                    // One 64-bit store per message (coalesced across the warp), no fence:
                    // the sequence number in the upper half tells the host whether the
                    // entry is the one it expects (see ringkernel-cuda's metrics.rs).
                    const rk_u64 idx = s_sample + m;
                    ((volatile rk_u64*)p.latency)[idx & (p.latency_capacity - 1)] = ((idx + 1ull) << 32) | lat;
                }
            }
        }
        __syncthreads();

        // ---- compact replies (in input order) and count ----
        if (tid == 0) {
            rk_u32 pos = 0;
            batch_dropped = 0;
            for (rk_u32 m = 0; m < n; m++) {
                int r = s_result[m];
                s_pos[m] = pos;
                if (r == 1) pos++;
                else if (r < 0) { batch_dropped++; last_error = (rk_u32)(-r); }
            }
            dropped += batch_dropped;
            s_n = pos;  // replies this batch
        }
        __syncthreads();
        const rk_u32 replies = s_n;
        {
            const rk_u32 vec_per_slot = slot / 16;
            const rk_u32 total = n * vec_per_slot;
            const rk_u64 base = s_out_tail;
            for (rk_u32 v = tid; v < total; v += nthreads) {
                rk_u32 m = v / vec_per_slot, w = v % vec_per_slot;
                if (s_result[m] != 1) continue;
                rk_u64 idx = base + s_pos[m];
                uint4* d = (uint4*)(out_slots + (idx & (p.out_capacity - 1)) * slot) + w;
                *d = ((const uint4*)(scratch_out + (rk_u64)m * slot))[w];
            }
        }
        __syncthreads();
        if (tid == 0) {
            out_tail += replies;
            processed += n - batch_dropped;
            taken += n;
            // Counters for the host's metrics, written before the release below so a
            // host that has seen a reply also sees the counts that include it.
            cb->processed = processed;
            cb->dropped = dropped;
            cb->last_error = last_error;
            cb->output_tail = out_tail;
            if (src == 0) in_taken += n;
            cb->input_head = in_taken;
            // The barrier orders every thread's slot stores before this release store
            // (release is cumulative), so one system fence publishes the whole batch.
            if (replies) rk_st_release_sys(&outq->tail, out_tail);
            // The slots were fully read before the barrier: a relaxed store frees them.
            if (src == 0) {
                RkQueueHeader* laneq = (RkQueueHeader*)(p.in_queue + (rk_u64)cur_lane * p.lane_stride);
                rk_u64 head = 0;
#pragma unroll
                for (int l = 0; l < (int)RK_LANES; l++) {
                    if ((rk_u32)l == cur_lane) {
                        lane_head[l] += n;
                        head = lane_head[l];
                    }
                }
                *(volatile rk_u64*)&laneq->head = head;
            } else {
                inbox_head += n;
                s_inbox_head = inbox_head;
                rk_st_release_gpu(&inbox->head, inbox_head);
            }
            mirrors_dirty = true;
        }
        __syncthreads();  // s_inbox_head for the next round
        // The next round's thread-0 reads come after this round's writes in program
        // order; the other threads wait at the barrier at the top of the loop.
    }

    if (tid == 0) {
        if (my_route) {
            *(volatile rk_u32*)&my_route->valid = 0u;
            __threadfence();
        }
        cb->input_head = in_taken;
        cb->output_tail = out_tail;
        cb->processed = processed;
        cb->dropped = dropped;
        cb->hlc = hlc;
        cb->last_error = last_error;
        cb->heartbeat = heartbeat;
        __threadfence_system();
        rk_st_release_sys32(&cb->state, RK_STATE_TERMINATED);
    }
}
