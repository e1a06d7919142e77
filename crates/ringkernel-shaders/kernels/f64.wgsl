// IEEE-754 binary64 arithmetic on the bits, for devices without f64 (WGSL, Metal).
// A double is vec2<u32>(low word, high word), as it lies in memory. Results are exact
// (round to nearest, ties to even), equal bit for bit to the CPU's for finite values.

fn rk_u64_shl(a: vec2<u32>, n: u32) -> vec2<u32> {
    if (n == 0u) { return a; }
    if (n >= 64u) { return vec2<u32>(0u, 0u); }
    if (n >= 32u) { return vec2<u32>(0u, a.x << (n - 32u)); }
    return vec2<u32>(a.x << n, (a.y << n) | (a.x >> (32u - n)));
}

fn rk_u64_shr(a: vec2<u32>, n: u32) -> vec2<u32> {
    if (n == 0u) { return a; }
    if (n >= 64u) { return vec2<u32>(0u, 0u); }
    if (n >= 32u) { return vec2<u32>(a.y >> (n - 32u), 0u); }
    return vec2<u32>((a.x >> n) | (a.y << (32u - n)), a.y >> n);
}

fn rk_u64_is_zero(a: vec2<u32>) -> bool {
    return (a.x | a.y) == 0u;
}

// Shift right; any 1 bits shifted out are OR-ed into bit 0 (the sticky bit).
fn rk_u64_shr_sticky(a: vec2<u32>, n: u32) -> vec2<u32> {
    if (n == 0u) { return a; }
    if (n >= 64u) { return vec2<u32>(select(0u, 1u, !rk_u64_is_zero(a)), 0u); }
    let r = rk_u64_shr(a, n);
    let back = rk_u64_shl(r, n);
    let lost = back.x != a.x || back.y != a.y;
    return vec2<u32>(r.x | select(0u, 1u, lost), r.y);
}

fn rk_u64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn rk_u64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

fn rk_u64_clz(a: vec2<u32>) -> u32 {
    if (a.y != 0u) { return countLeadingZeros(a.y); }
    return 32u + countLeadingZeros(a.x);
}

// Rounds a significand `m` with its leading (hidden) bit at bit 55 and three extra bits
// (guard, round, sticky) below the 52 fraction bits, at biased exponent `e` (>= 1; a
// significand below bit 55 with e == 1 is subnormal), and packs it with `sign`.
fn rk_f64_round_pack(sign: u32, e_in: u32, m_in: vec2<u32>) -> vec2<u32> {
    var e = e_in;
    let grs = m_in.x & 7u;
    var m = rk_u64_shr(m_in, 3u);
    if (grs > 4u || (grs == 4u && (m.x & 1u) == 1u)) {
        m = rk_u64_add32(m, 1u);
        if ((m.y & 0x00200000u) != 0u) {
            m = rk_u64_shr(m, 1u);
            e = e + 1u;
        }
    }
    if (e >= 0x7FFu) {
        return vec2<u32>(0u, (sign << 31u) | 0x7FF00000u);
    }
    var hi = (sign << 31u) | (m.y & 0x000FFFFFu);
    if ((m.y & 0x00100000u) != 0u) {
        hi = hi | (e << 20u);
    }
    return vec2<u32>(m.x, hi);
}

fn rk_f64_is_nan(a: vec2<u32>) -> bool {
    return (a.y & 0x7FF00000u) == 0x7FF00000u && ((a.y & 0x000FFFFFu) | a.x) != 0u;
}

// a + b
fn rk_f64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (rk_f64_is_nan(a)) { return vec2<u32>(a.x, a.y | 0x00080000u); }
    if (rk_f64_is_nan(b)) { return vec2<u32>(b.x, b.y | 0x00080000u); }
    let ea = (a.y >> 20u) & 0x7FFu;
    let eb = (b.y >> 20u) & 0x7FFu;
    if (ea == 0x7FFu) {
        if (eb == 0x7FFu && (a.y >> 31u) != (b.y >> 31u)) {
            return vec2<u32>(0u, 0xFFF80000u); // inf - inf: the default NaN
        }
        return a;
    }
    if (eb == 0x7FFu) { return b; }
    let maga = vec2<u32>(a.x, a.y & 0x7FFFFFFFu);
    let magb = vec2<u32>(b.x, b.y & 0x7FFFFFFFu);
    var x = a;
    var y = b;
    if (rk_u64_lt(maga, magb)) {
        x = b;
        y = a;
    }
    let sx = x.y >> 31u;
    let sy = y.y >> 31u;
    if (rk_u64_is_zero(vec2<u32>(y.x, y.y & 0x7FFFFFFFu))) {
        if (rk_u64_is_zero(vec2<u32>(x.x, x.y & 0x7FFFFFFFu))) {
            return vec2<u32>(0u, (sx & sy) << 31u); // -0 only if both are -0
        }
        return x;
    }
    let ex = (x.y >> 20u) & 0x7FFu;
    let ey = (y.y >> 20u) & 0x7FFu;
    var mx = vec2<u32>(x.x, x.y & 0x000FFFFFu);
    var my = vec2<u32>(y.x, y.y & 0x000FFFFFu);
    if (ex != 0u) { mx.y = mx.y | 0x00100000u; }
    if (ey != 0u) { my.y = my.y | 0x00100000u; }
    let ex1 = max(ex, 1u);
    let ey1 = max(ey, 1u);
    mx = rk_u64_shl(mx, 3u);
    my = rk_u64_shr_sticky(rk_u64_shl(my, 3u), ex1 - ey1);
    var e = ex1;
    var m: vec2<u32>;
    if (sx == sy) {
        m = rk_u64_add(mx, my);
        if ((m.y & 0x01000000u) != 0u) {
            m = rk_u64_shr_sticky(m, 1u);
            e = e + 1u;
        }
    } else {
        m = rk_u64_sub(mx, my);
        if (rk_u64_is_zero(m)) {
            return vec2<u32>(0u, 0u);
        }
        let lz = rk_u64_clz(m);
        if (lz > 8u) {
            let sh = min(lz - 8u, e - 1u);
            m = rk_u64_shl(m, sh);
            e = e - sh;
        }
    }
    return rk_f64_round_pack(sx, e, m);
}

// a * 2 (exact unless it overflows to infinity)
fn rk_f64_mul2(a: vec2<u32>) -> vec2<u32> {
    let e = (a.y >> 20u) & 0x7FFu;
    let sign = a.y & 0x80000000u;
    if (e == 0x7FFu) {
        if (rk_f64_is_nan(a)) { return vec2<u32>(a.x, a.y | 0x00080000u); }
        return a;
    }
    if (e == 0u) {
        // Zero or subnormal: shift the fraction; a carry into the exponent field makes
        // the right normal number.
        let m = rk_u64_shl(vec2<u32>(a.x, a.y & 0x000FFFFFu), 1u);
        return vec2<u32>(m.x, sign | m.y);
    }
    if (e == 0x7FEu) {
        return vec2<u32>(0u, sign | 0x7FF00000u);
    }
    return vec2<u32>(a.x, a.y + 0x00100000u);
}

// The double nearest to the unsigned integer n.
fn rk_f64_from_u64(n: vec2<u32>) -> vec2<u32> {
    if (rk_u64_is_zero(n)) { return vec2<u32>(0u, 0u); }
    let lz = rk_u64_clz(n);
    let top = 63u - lz;
    // Bring the leading bit to bit 63, then down to bit 55 keeping a sticky bit.
    let m = rk_u64_shr_sticky(rk_u64_shl(n, lz), 8u);
    return rk_f64_round_pack(0u, 1023u + top, m);
}
