// Bit-exact conversions between f32 and the half types, shared by the kernels that
// store or read f16/bf16 (prepended to dtype.wgsl, quant.wgsl and decode.wgsl by the
// shaders crate). Integer arithmetic only: the same bits on every GPU, subnormals kept.

// f16 bits (low 16 bits of h) to f32 bits, exactly.
fn f16_to_f32_bits(h: u32) -> u32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1Fu;
    let m = h & 0x3FFu;
    if (e == 0x1Fu) {
        if (m == 0u) {
            return sign | 0x7F800000u;
        }
        return sign | 0x7FC00000u | (m << 13u);
    }
    if (e == 0u) {
        if (m == 0u) {
            return sign;
        }
        // subnormal: normalise (m has its leading one at bit 9 - k)
        let k = countLeadingZeros(m) - 22u; // leading zeros within the 10-bit field
        let mm = (m << (k + 1u)) & 0x3FFu;
        return sign | ((112u - k) << 23u) | (mm << 13u);
    }
    return sign | ((e + 112u) << 23u) | (m << 13u);
}

// f32 bits to f16 bits, round to nearest even.
fn f32_to_f16_bits(x: u32) -> u32 {
    let sign = (x >> 16u) & 0x8000u;
    let e = (x >> 23u) & 0xFFu;
    let m = x & 0x7FFFFFu;
    if (e == 0xFFu) {
        return sign | 0x7C00u | select(0u, 0x200u | (m >> 13u), m != 0u);
    }
    let he = i32(e) - 127 + 15;
    if (he >= 31) {
        return sign | 0x7C00u;
    }
    if (he <= 0) {
        if (14 - he > 24) {
            return sign;
        }
        let mf = m | 0x800000u;
        let shift = u32(14 - he);
        var hm = mf >> shift;
        let round_bit = 1u << (shift - 1u);
        if ((mf & round_bit) != 0u && (mf & (3u * round_bit - 1u)) != 0u) {
            hm = hm + 1u;
        }
        return sign | hm;
    }
    let v = sign | (u32(he) << 10u) | (m >> 13u);
    if ((m & 0x1000u) != 0u && (m & 0x2FFFu) != 0u) {
        return v + 1u;
    }
    return v;
}

// f32 bits to bf16 bits, round to nearest even.
fn f32_to_bf16_bits(x: u32) -> u32 {
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        return (x >> 16u) | 0x40u;
    }
    let v = x >> 16u;
    if ((x & 0x8000u) != 0u && (x & 0x17FFFu) != 0u) {
        return v + 1u;
    }
    return v;
}

// An f16 (low 16 bits of h) as f32.
fn f16_value(h: u32) -> f32 {
    return bitcast<f32>(f16_to_f32_bits(h & 0xFFFFu));
}
