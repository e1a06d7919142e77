// rk.echo: replies with value * 2, hops + 1 and its HLC stamp in stamps[min(hops, 3)].
__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state;
    (void)out_hdr;
    if (in_hdr->type_id != RK_TOKEN_TYPE_ID || in_hdr->payload_len != sizeof(RkToken)) return -(int)RK_ERR_HANDLER;
    RkToken t = *(const RkToken*)in_payload;
    t.stamps[t.hops < 3 ? t.hops : 3] = ctx->now;
    t.value *= 2.0;
    t.hops += 1;
    *(RkToken*)out_payload = t;
    return 1;
}
