// xgpu.flood_src: a host message FloodTrigger {dest, count} makes the handling thread send
// `count` 32-byte messages to kernel `dest` through its K2K inbox (on this GPU or another
// one of the group), retrying while the inbox is full; it replies (an empty payload) when
// all are delivered. Parallel: several triggers send at once, one thread each. For the
// K2K throughput of examples/multi_gpu_bench.rs.
struct FloodTrigger {
    unsigned dest;
    unsigned count;
};
struct FloodItem {
    unsigned long long seq;
    unsigned long long pad[3];
};
#define FLOOD_ITEM_TYPE 0x4B11u

__device__ int handle(RkContext* ctx, const RkMessageHeader* in_hdr, const unsigned char* in_payload,
                      RkMessageHeader* out_hdr, unsigned char* out_payload, void* state) {
    (void)state;
    (void)out_payload;
    if (ctx->from_inbox || in_hdr->payload_len != sizeof(FloodTrigger)) return -(int)RK_ERR_HANDLER;
    const FloodTrigger t = *(const FloodTrigger*)in_payload;
    FloodItem item;
    item.pad[0] = item.pad[1] = item.pad[2] = 0;
    for (unsigned i = 0; i < t.count; i++) {
        item.seq = i;
        for (;;) {
            int r = rk_send_to(ctx, t.dest, FLOOD_ITEM_TYPE, &item, sizeof(FloodItem));
            if (r == RK_K2K_DELIVERED) break;
            if (r == RK_K2K_NOT_FOUND) return -(int)RK_ERR_HANDLER;
            __nanosleep(64);
        }
    }
    out_hdr->payload_len = 0;
    return 1;
}
