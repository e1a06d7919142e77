// rk.echo: replies with value * 2, hops + 1 and its HLC stamp in stamps[min(hops, 3)].
// The reply is built in place in out_payload: a token copied into a local variable and
// indexed by hops would live in local memory (stack stores and loads on the latency
// path of every round trip).
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state;
    (void)out_hdr;
    if (in_hdr->type_id != RK_TOKEN_TYPE_ID || in_hdr->payload_len != sizeof(RkToken)) return -(int)RK_ERR_HANDLER;
    const RkToken* in = (const RkToken*)in_payload;
    RkToken* t = (RkToken*)out_payload;
    *t = *in;
    const rk_u32 hops = in->hops;
    t->stamps[hops < 3 ? hops : 3] = ctx->now;
    t->value = in->value * 2.0;
    t->hops = hops + 1;
    return 1;
}
