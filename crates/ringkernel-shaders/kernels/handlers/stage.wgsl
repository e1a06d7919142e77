// rk.stage: stamps, value + 1, hops + 1; then sends the token on to route[hops] (K2K)
// while hops < min(route_len, 4), else replies to the host.
fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {
    var t: TokenWords;
    if (!token_read(ctx, in_slot, &t)) {
        return RK_ERR_TYPE_MISMATCH;
    }
    token_words_set_value(&t, rk_f64_add(token_words_value(&t), vec2<u32>(0u, 0x3FF00000u)));
    let hops = t.e.y + 1u;
    t.e.y = hops;
    token_store(out_slot, t);
    if (hops < min(t.e.x, 4u)) {
        rk_send(ctx, t.d[hops], TOKEN_TYPE_ID, TOKEN_BYTES);
    } else {
        rk_reply(ctx, TOKEN_TYPE_ID, TOKEN_BYTES);
    }
    return 0u;
}
