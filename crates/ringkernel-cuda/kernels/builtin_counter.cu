// rk.counter: a pub/sub subscriber. Counts the tokens it has seen (in its 8-byte state)
// and replies with the token whose value is the count so far and hops + 1. Serial, so
// counts follow arrival order.
#define RK_HANDLER_SERIAL 1
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)out_hdr;
    if (in_hdr->type_id != RK_TOKEN_TYPE_ID || in_hdr->payload_len != sizeof(RkToken)) return -(int)RK_ERR_HANDLER;
    rk_u64* count = (rk_u64*)state;
    *count += 1;
    RkToken t = *(const RkToken*)in_payload;
    t.stamps[t.hops < 3 ? t.hops : 3] = ctx->now;
    t.value = (double)*count;
    t.hops += 1;
    *(RkToken*)out_payload = t;
    return 1;
}
