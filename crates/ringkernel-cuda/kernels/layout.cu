// layout.cu: writes sizeof and offsetof() of every mirrored struct, so the host can
// compare the CUDA layouts with the Rust ones (tests/gpu_smoke.rs, `layout_matches_rust`).
// Output order: for each struct in the order below, sizeof, then each field's offset.
// Kept in sync with src/layout.rs (expected_layout).
// NVRTC has no offsetof/__builtin_offsetof: the classic null-pointer form.
#define RK_OFF(T, f) ((rk_u64)(&(((T*)0)->f)))
extern "C" __global__ void rk_layout(rk_u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int i = 0;
    out[i++] = sizeof(RkControlBlock);
    out[i++] = RK_OFF(RkControlBlock, command);
    out[i++] = RK_OFF(RkControlBlock, command_seq);
    out[i++] = RK_OFF(RkControlBlock, kernel_id);
    out[i++] = RK_OFF(RkControlBlock, slot_size);
    out[i++] = RK_OFF(RkControlBlock, input_tail);
    out[i++] = RK_OFF(RkControlBlock, output_head);
    out[i++] = RK_OFF(RkControlBlock, input_capacity);
    out[i++] = RK_OFF(RkControlBlock, output_capacity);
    out[i++] = RK_OFF(RkControlBlock, max_drift_ms);
    out[i++] = RK_OFF(RkControlBlock, host_reserved);
    out[i++] = RK_OFF(RkControlBlock, state);
    out[i++] = RK_OFF(RkControlBlock, command_ack);
    out[i++] = RK_OFF(RkControlBlock, input_head);
    out[i++] = RK_OFF(RkControlBlock, output_tail);
    out[i++] = RK_OFF(RkControlBlock, processed);
    out[i++] = RK_OFF(RkControlBlock, dropped);
    out[i++] = RK_OFF(RkControlBlock, hlc);
    out[i++] = RK_OFF(RkControlBlock, last_error);
    out[i++] = RK_OFF(RkControlBlock, heartbeat);
    out[i++] = RK_OFF(RkControlBlock, device_reserved);
    out[i++] = sizeof(RkMessageHeader);
    out[i++] = RK_OFF(RkMessageHeader, magic);
    out[i++] = RK_OFF(RkMessageHeader, version);
    out[i++] = RK_OFF(RkMessageHeader, type_id);
    out[i++] = RK_OFF(RkMessageHeader, payload_len);
    out[i++] = RK_OFF(RkMessageHeader, message_id);
    out[i++] = RK_OFF(RkMessageHeader, correlation_id);
    out[i++] = RK_OFF(RkMessageHeader, source_kernel);
    out[i++] = RK_OFF(RkMessageHeader, dest_kernel);
    out[i++] = RK_OFF(RkMessageHeader, timestamp);
    out[i++] = RK_OFF(RkMessageHeader, checksum);
    out[i++] = RK_OFF(RkMessageHeader, flags);
    out[i++] = RK_OFF(RkMessageHeader, node_id);
    out[i++] = sizeof(RkQueueHeader);
    out[i++] = RK_OFF(RkQueueHeader, tail);
    out[i++] = RK_OFF(RkQueueHeader, capacity);
    out[i++] = RK_OFF(RkQueueHeader, slot_size);
    out[i++] = RK_OFF(RkQueueHeader, mask);
    out[i++] = RK_OFF(RkQueueHeader, producer_reserved);
    out[i++] = RK_OFF(RkQueueHeader, head);
    out[i++] = RK_OFF(RkQueueHeader, consumer_reserved);
    out[i++] = sizeof(RkInbox);
    out[i++] = RK_OFF(RkInbox, reserve);
    out[i++] = RK_OFF(RkInbox, capacity);
    out[i++] = RK_OFF(RkInbox, slot_size);
    out[i++] = RK_OFF(RkInbox, mask);
    out[i++] = RK_OFF(RkInbox, producer_reserved);
    out[i++] = RK_OFF(RkInbox, head);
    out[i++] = RK_OFF(RkInbox, consumer_reserved);
    out[i++] = sizeof(RkRoute);
    out[i++] = RK_OFF(RkRoute, inbox);
    out[i++] = RK_OFF(RkRoute, slots);
    out[i++] = RK_OFF(RkRoute, ready);
    out[i++] = RK_OFF(RkRoute, kernel_id);
    out[i++] = RK_OFF(RkRoute, valid);
    out[i++] = sizeof(RkLaunchParams);
    out[i++] = RK_OFF(RkLaunchParams, control);
    out[i++] = RK_OFF(RkLaunchParams, in_queue);
    out[i++] = RK_OFF(RkLaunchParams, out_queue);
    out[i++] = RK_OFF(RkLaunchParams, inbox);
    out[i++] = RK_OFF(RkLaunchParams, inbox_slots);
    out[i++] = RK_OFF(RkLaunchParams, inbox_ready);
    out[i++] = RK_OFF(RkLaunchParams, routes);
    out[i++] = RK_OFF(RkLaunchParams, route_count);
    out[i++] = RK_OFF(RkLaunchParams, scratch_in);
    out[i++] = RK_OFF(RkLaunchParams, scratch_out);
    out[i++] = RK_OFF(RkLaunchParams, state);
    out[i++] = RK_OFF(RkLaunchParams, clock_offset_ns);
    out[i++] = RK_OFF(RkLaunchParams, kernel_id);
    out[i++] = RK_OFF(RkLaunchParams, slot_size);
    out[i++] = RK_OFF(RkLaunchParams, in_capacity);
    out[i++] = RK_OFF(RkLaunchParams, out_capacity);
    out[i++] = RK_OFF(RkLaunchParams, inbox_capacity);
    out[i++] = RK_OFF(RkLaunchParams, max_drift_ms);
    out[i++] = RK_OFF(RkLaunchParams, latency);
    out[i++] = RK_OFF(RkLaunchParams, latency_capacity);
    out[i++] = sizeof(RkToken);
    out[i++] = RK_OFF(RkToken, id);
    out[i++] = RK_OFF(RkToken, value);
    out[i++] = RK_OFF(RkToken, stamps);
    out[i++] = RK_OFF(RkToken, route);
    out[i++] = RK_OFF(RkToken, route_len);
    out[i++] = RK_OFF(RkToken, hops);
    out[i++] = 0xC0FFEEull; /* end marker */
}
