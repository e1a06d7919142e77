// rk.stage: stamps, value + 1, hops + 1; then sends the token on to route[hops] (K2K)
// while hops < min(route_len, 4), else replies to the host.
fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {
    if (!token_begin(ctx, in_slot, out_slot)) {
        return RK_ERR_TYPE_MISMATCH;
    }
    rk_out_set_u64(out_slot + TOKEN_VALUE, rk_f64_add(token_value(out_slot), vec2<u32>(0u, 0x3FF00000u)));
    let hops = rk_output[out_slot + TOKEN_HOPS] + 1u;
    rk_output[out_slot + TOKEN_HOPS] = hops;
    if (hops < min(rk_output[out_slot + TOKEN_ROUTE_LEN], 4u)) {
        rk_send(ctx, rk_output[out_slot + TOKEN_ROUTE + hops], TOKEN_TYPE_ID, TOKEN_BYTES);
    } else {
        rk_reply(ctx, TOKEN_TYPE_ID, TOKEN_BYTES);
    }
    return 0u;
}
