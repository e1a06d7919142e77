// rk.stage: a pipeline stage. Stamps stamps[min(hops, 3)], adds 1 to value, increments
// hops; then, if hops < route_len, sends the token on to kernel route[hops] through its
// device inbox (K2K, no host hop; a full inbox is retried, never dropped), else replies
// to the host. Serial, so tokens leave in the order they came.
#define RK_HANDLER_SERIAL 1
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state;
    (void)out_hdr;
    if (in_hdr->type_id != RK_TOKEN_TYPE_ID || in_hdr->payload_len != sizeof(RkToken)) return -(int)RK_ERR_HANDLER;
    RkToken t = *(const RkToken*)in_payload;
    t.stamps[t.hops < 3 ? t.hops : 3] = ctx->now;
    t.value += 1.0;
    t.hops += 1;
    rk_u32 len = t.route_len < 4 ? t.route_len : 4;
    if (t.hops < len) {
        rk_u32 next = t.route[t.hops];
        unsigned int sleep_ns = 32;
        for (;;) {
            int r = rk_send_to(ctx, next, RK_TOKEN_TYPE_ID, &t, sizeof(RkToken));
            if (r == RK_K2K_DELIVERED) return 0;
            if (r == RK_K2K_NOT_FOUND) return -(int)RK_ERR_HANDLER;
            __nanosleep(sleep_ns);
            if (sleep_ns < 4096) sleep_ns *= 2;
        }
    }
    *(RkToken*)out_payload = t;
    return 1;
}
