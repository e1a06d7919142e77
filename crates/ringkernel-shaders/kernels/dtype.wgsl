// Element-type conversion between f32, f16 and bf16 (and u32 to u32), on the words of
// the buffers: f16/bf16 pack two elements per u32, element 2w in the low half of word w.
// Every conversion is integer arithmetic on the bits, so the results are the same on
// every GPU (round to nearest, ties to even; beyond the f16 range gives infinity; NaN
// stays NaN) and subnormals are never flushed. One thread per output word; the padding
// half of the last word of an odd-length half-precision output is written as zero.
// The conversion functions are in half.wgsl, which the shaders crate puts in front.

struct ConvertParams {
    len: u32,    // elements
    words: u32,  // output words
    src_type: u32, // DType code: 0 f32, 1 f16, 2 bf16, 3 u32
    dst_type: u32,
}

@group(0) @binding(0) var<uniform> p: ConvertParams;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

// Element i of the input, as f32 bits.
fn load_bits(i: u32) -> u32 {
    switch p.src_type {
        case 1u: { return f16_to_f32_bits((a[i / 2u] >> (16u * (i % 2u))) & 0xFFFFu); }
        case 2u: { return ((a[i / 2u] >> (16u * (i % 2u))) & 0xFFFFu) << 16u; }
        default: { return a[i]; }
    }
}

fn store_half(bits: u32) -> u32 {
    if (p.dst_type == 1u) {
        return f32_to_f16_bits(bits);
    }
    return f32_to_bf16_bits(bits);
}

@compute @workgroup_size(256)
fn convert(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = gid.x + gid.y * nwg.x * 256u;
    if (w >= p.words) {
        return;
    }
    if (p.dst_type == 0u || p.dst_type == 3u) {
        out[w] = load_bits(w);
        return;
    }
    // two elements per output word; same-type copies keep the bits
    var lo = 0u;
    var hi = 0u;
    let e0 = 2u * w;
    if (p.src_type == p.dst_type) {
        let word = a[w];
        lo = word & 0xFFFFu;
        hi = word >> 16u;
    } else {
        lo = store_half(load_bits(e0));
        if (e0 + 1u < p.len) {
            hi = store_half(load_bits(e0 + 1u));
        }
    }
    if (e0 + 1u >= p.len) {
        hi = 0u;
    }
    out[w] = lo | (hi << 16u);
}
