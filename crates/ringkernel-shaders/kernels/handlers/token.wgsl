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

// Copies the request token into the output slot and stamps stamps[min(hops, 3)] with
// the kernel's clock. Returns false when the request is not a Token.
fn token_begin(ctx: ptr<function, RkContext>, in_slot: u32, out_slot: u32) -> bool {
    if ((*ctx).request.type_id != TOKEN_TYPE_ID || (*ctx).request.payload_len != TOKEN_BYTES) {
        return false;
    }
    for (var w = 0u; w < TOKEN_WORDS; w++) {
        rk_output[out_slot + w] = rk_input[in_slot + w];
    }
    let s = min(rk_input[in_slot + TOKEN_HOPS], 3u);
    rk_out_set_u64(out_slot + TOKEN_STAMPS + 2u * s, (*ctx).hlc);
    return true;
}

fn token_value(slot: u32) -> vec2<u32> {
    return vec2<u32>(rk_output[slot + TOKEN_VALUE], rk_output[slot + TOKEN_VALUE + 1u]);
}
