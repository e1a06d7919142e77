// baseline.cu: the comparison point for the persistent kernel's round trip: one
// launch per message. The kernel copies the request slot from mapped host memory,
// applies rk.echo's transformation to the Token and writes the reply slot back to
// mapped host memory. Used by the benchmark (launch + sync per message, and the same
// launch replayed from a CUDA graph).
extern "C" __global__ void rk_baseline_echo(const unsigned char* in_slot, unsigned char* out_slot) {
    __shared__ uint4 buf[16];
    const unsigned t = threadIdx.x;
    if (t < 16) buf[t] = __ldcv((const uint4*)in_slot + t);
    __syncthreads();
    if (t == 0) {
        RkMessageHeader* h = (RkMessageHeader*)buf;
        RkToken* tok = (RkToken*)(h + 1);
        h->correlation_id = h->message_id;
        h->flags = RK_FLAG_REPLY;
        tok->value *= 2.0;
        tok->hops += 1;
    }
    __syncthreads();
    if (t < 16) ((uint4*)out_slot)[t] = buf[t];
    __threadfence_system();
}
