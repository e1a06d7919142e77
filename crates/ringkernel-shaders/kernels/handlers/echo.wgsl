// rk.echo: replies with value * 2, hops + 1, stamps[min(hops, 3)] = clock.
fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {
    if (!token_begin(ctx, in_slot, out_slot)) {
        return RK_ERR_TYPE_MISMATCH;
    }
    rk_out_set_u64(out_slot + TOKEN_VALUE, rk_f64_mul2(token_value(out_slot)));
    rk_output[out_slot + TOKEN_HOPS] = rk_output[out_slot + TOKEN_HOPS] + 1u;
    rk_reply(ctx, TOKEN_TYPE_ID, TOKEN_BYTES);
    return 0u;
}
