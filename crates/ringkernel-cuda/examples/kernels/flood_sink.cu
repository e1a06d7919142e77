// xgpu.flood_sink: counts the messages that reach its K2K inbox. A host message
// {u64 expected} arms it; the inbox message that makes the count reach `expected` replies
// to the host with {u64 count} and resets the count. Parallel: counted with atomics.
struct FloodSinkState {
    unsigned long long expected;
    unsigned long long count;
};

__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    FloodSinkState* s = (FloodSinkState*)state;
    if (!ctx->from_inbox) {
        if (in_hdr->payload_len != 8) return -(int)RK_ERR_HANDLER;
        atomicExch(&s->expected, *(const unsigned long long*)in_payload);
        return 0;
    }
    const unsigned long long c = atomicAdd(&s->count, 1ull) + 1ull;
    if (c == *(volatile unsigned long long*)&s->expected) {
        *(unsigned long long*)out_payload = c;
        out_hdr->payload_len = 8;
        atomicExch(&s->expected, 0ull);
        atomicExch(&s->count, 0ull);
        return 1;
    }
    return 0;
}
