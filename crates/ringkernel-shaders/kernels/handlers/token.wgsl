// The built-in kernels' message, ringkernel_core::builtin::Token (72 bytes), as words:
// id 0-1, value (f64 bits) 2-3, stamps[4] 4-11, route[4] 12-15, route_len 16, hops 17.
const TOKEN_TYPE_ID: u32 = 0x524B0001u;
const TOKEN_BYTES: u32 = 72u;
const TOKEN_WORDS: u32 = 18u;
const TOKEN_VALUE: u32 = 2u;
const TOKEN_STAMPS: u32 = 4u;
const TOKEN_ROUTE: u32 = 12u;
const TOKEN_ROUTE_LEN: u32 = 16u;
const TOKEN_HOPS: u32 = 17u;

// A token's 18 words in registers: each word is loaded once and stored once (a
// per-word copy followed by stores of the changed fields would store them twice, and a
// private array indexed at run time may land in slow memory).
struct TokenWords {
    a: vec4<u32>, // id (words 0-1), value (2-3)
    b: vec4<u32>, // stamps[0] (4-5), stamps[1] (6-7)
    c: vec4<u32>, // stamps[2] (8-9), stamps[3] (10-11)
    d: vec4<u32>, // route[0..4] (12-15)
    e: vec2<u32>, // route_len (16), hops (17)
}

// Payloads start on a 16-byte boundary (see the template), so the 18 words are five
// 16-byte units; the last two words of the fifth are past the token, inside the payload
// area (80 bytes from a 144-byte slot on, and a compact pass's payload stride is the
// same): read and written as zeros.
fn token_load(slot: u32) -> TokenWords {
    var t: TokenWords;
    t.a = rk_in4(slot);
    t.b = rk_in4(slot + 4u);
    t.c = rk_in4(slot + 8u);
    t.d = rk_in4(slot + 12u);
    t.e = rk_in4(slot + 16u).xy;
    return t;
}

fn token_store(slot: u32, t: TokenWords) {
    rk_out_set4(slot, t.a);
    rk_out_set4(slot + 4u, t.b);
    rk_out_set4(slot + 8u, t.c);
    rk_out_set4(slot + 12u, t.d);
    rk_out_set4(slot + 16u, vec4<u32>(t.e, 0u, 0u));
}

// Reads the request token into `t` and stamps stamps[min(hops, 3)] with the kernel's
// clock. Returns false when the request is not a Token. Change the words, then
// `token_store(out_slot, t)`: every word is read once and written once.
fn token_read(ctx: ptr<function, RkContext>, in_slot: u32, t: ptr<function, TokenWords>) -> bool {
    if ((*ctx).request.type_id != TOKEN_TYPE_ID || (*ctx).request.payload_len != TOKEN_BYTES) {
        return false;
    }
    var w = token_load(in_slot);
    let s = min(w.e.y, 3u);
    let hlc = (*ctx).hlc;
    w.b = select(w.b, vec4<u32>(hlc, w.b.zw), s == 0u);
    w.b = select(w.b, vec4<u32>(w.b.xy, hlc), s == 1u);
    w.c = select(w.c, vec4<u32>(hlc, w.c.zw), s == 2u);
    w.c = select(w.c, vec4<u32>(w.c.xy, hlc), s == 3u);
    *t = w;
    return true;
}

// The value (f64 bits) of a token in registers.
fn token_words_value(t: ptr<function, TokenWords>) -> vec2<u32> {
    return (*t).a.zw;
}

fn token_words_set_value(t: ptr<function, TokenWords>, v: vec2<u32>) {
    (*t).a = vec4<u32>((*t).a.xy, v);
}

// Copies the request token into the output slot and stamps stamps[min(hops, 3)] with
// the kernel's clock. Returns false when the request is not a Token. (Handlers that
// change words afterwards store those twice: `token_read` + `token_store` do not.)
fn token_begin(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> bool {
    var t: TokenWords;
    if (!token_read(ctx, in_slot, &t)) {
        return false;
    }
    token_store(out_slot, t);
    return true;
}

// The value (f64 bits) of the token in output slot `slot`.
fn token_value(slot: u32) -> vec2<u32> {
    return vec2<u32>(rk_out(slot + TOKEN_VALUE), rk_out(slot + TOKEN_VALUE + 1u));
}
