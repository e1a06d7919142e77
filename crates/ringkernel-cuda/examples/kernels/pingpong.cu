// xgpu.pingpong: a ball bounces between two kernels through their K2K inboxes (on one GPU
// or across GPUs), for the one-way K2K latency of examples/multi_gpu_bench.rs.
//
// A host message PingStart {peer, rounds} starts a ball: t0 = this kernel's device clock,
// left = 2 * rounds hops, sent to `peer`. A kernel that receives the ball (from its inbox)
// takes one off `left` and sends it back to the sender while hops remain; the last hop
// (an even number of them, so back at the origin) replies to the host with PingDone
// {hops, elapsed ns on the origin's own clock}: one-way latency = elapsed / hops, with no
// clock shared between GPUs. A full inbox is retried, never dropped.
struct PingStart {
    unsigned peer;
    unsigned rounds;
};
struct PingBall {
    unsigned long long t0;
    unsigned left;
    unsigned hops;
};
struct PingDone {
    unsigned long long hops;
    unsigned long long elapsed_ns;
};
#define PING_BALL_TYPE 0x4B02u
#define PING_DONE_TYPE 0x4B03u

__device__ int ping_send(RkContext* ctx, unsigned dest, const PingBall* b) {
    unsigned sleep_ns = 32;
    for (;;) {
        int r = rk_send_to(ctx, dest, PING_BALL_TYPE, b, sizeof(PingBall));
        if (r == RK_K2K_DELIVERED) return 0;
        if (r == RK_K2K_NOT_FOUND) return -(int)RK_ERR_HANDLER;
        __nanosleep(sleep_ns);
        if (sleep_ns < 1024) sleep_ns *= 2;
    }
}

__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state;
    if (!ctx->from_inbox) {
        if (in_hdr->payload_len != sizeof(PingStart)) return -(int)RK_ERR_HANDLER;
        const PingStart s = *(const PingStart*)in_payload;
        if (s.rounds == 0) return -(int)RK_ERR_HANDLER;
        PingBall b;
        b.t0 = rk_globaltimer_ns();
        b.left = 2u * s.rounds;
        b.hops = 0;
        return ping_send(ctx, s.peer, &b);
    }
    if (in_hdr->payload_len != sizeof(PingBall)) return -(int)RK_ERR_HANDLER;
    PingBall b = *(const PingBall*)in_payload;
    b.left -= 1u;
    b.hops += 1u;
    if (b.left == 0u) {
        PingDone* d = (PingDone*)out_payload;
        d->hops = b.hops;
        d->elapsed_ns = rk_globaltimer_ns() - b.t0;
        out_hdr->type_id = PING_DONE_TYPE;
        out_hdr->payload_len = sizeof(PingDone);
        return 1;
    }
    return ping_send(ctx, in_hdr->source_kernel, &b);
}
