// rk.echo: replies with value * 2, hops + 1, stamps[min(hops, 3)] = clock.
fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {
    var t: TokenWords;
    if (!token_read(ctx, in_slot, &t)) {
        return RK_ERR_TYPE_MISMATCH;
    }
    token_words_set_value(&t, rk_f64_mul2(token_words_value(&t)));
    t.e.y = t.e.y + 1u;
    token_store(out_slot, t);
    rk_reply(ctx, TOKEN_TYPE_ID, TOKEN_BYTES);
    return 0u;
}
