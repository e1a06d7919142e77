// rk.counter: counts the tokens it has seen (rk_state words 0-1, a u64) and replies with
// value = count so far, hops + 1. Runs in queue order so the counts follow the messages.
const RK_SERIAL: bool = true;

fn handle(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> u32 {
    var t: TokenWords;
    if (!token_read(ctx, in_slot, &t)) {
        return RK_ERR_TYPE_MISMATCH;
    }
    let n = rk_u64_add32(vec2<u32>(rk_state[0], rk_state[1]), 1u);
    rk_state[0] = n.x;
    rk_state[1] = n.y;
    token_words_set_value(&t, rk_f64_from_u64(n));
    t.e.y = t.e.y + 1u;
    token_store(out_slot, t);
    rk_reply(ctx, TOKEN_TYPE_ID, TOKEN_BYTES);
    return 0u;
}
