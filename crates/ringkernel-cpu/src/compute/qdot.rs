//! Dot products of one stored weight row (a [`WeightFormat`] row, as bytes) with f32
//! vectors, straight on the blocks: AVX-512 or AVX2/FMA/F16C kernels where the CPU has
//! them, plain loops otherwise. The same f32 arithmetic in both: `d·Σ nib·x + m·Σx` per Q4_1
//! block, `d·Σ q·x` per Q8_0 block.

use ringkernel_core::compute::dtype::f16_bits_to_f32;
use ringkernel_core::compute::quant::BLOCK;
use ringkernel_core::compute::WeightFormat;

/// Bytes of one block.
pub(crate) fn block_bytes(format: WeightFormat) -> usize {
    format.block_words() * 4
}

/// Per-block sums of `x` (Q4_1's second factor); empty for the other formats.
pub(crate) fn block_sums(format: WeightFormat, x: &[f32]) -> Vec<f32> {
    match format {
        WeightFormat::Q4_1 => x.chunks_exact(BLOCK).map(|b| b.iter().sum()).collect(),
        _ => Vec::new(),
    }
}

#[inline(always)]
fn half_at(b: &[u8], i: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// `row · x` with `xsum` from [`block_sums`], on the fastest kernel the CPU has.
#[inline]
pub(crate) fn dot(format: WeightFormat, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x86::available_512() {
        match format {
            // SAFETY: `x86::available_512()` said the CPU has AVX-512F, FMA and F16C.
            WeightFormat::Q4_1 => return unsafe { x86::dot_q4_1_512(row, x, xsum) },
            // SAFETY: as above.
            WeightFormat::Q8_0 => return unsafe { x86::dot_q8_0_512(row, x) },
            WeightFormat::F32 => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        match format {
            // SAFETY: `x86::available()` said the CPU has AVX2, FMA and F16C.
            WeightFormat::Q4_1 => return unsafe { x86::dot_q4_1(row, x, xsum) },
            // SAFETY: as above.
            WeightFormat::Q8_0 => return unsafe { x86::dot_q8_0(row, x) },
            WeightFormat::F32 => {}
        }
    }
    dot_plain(format, row, x, xsum)
}

/// `row · x` in plain Rust (the fallback, and what the SIMD kernels are tested against).
pub(crate) fn dot_plain(format: WeightFormat, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
    match format {
        WeightFormat::F32 => {
            let mut a = [0f32; 8];
            for (j, (c, &v)) in row.chunks_exact(4).zip(x).enumerate() {
                a[j % 8] += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * v;
            }
            a.iter().sum()
        }
        WeightFormat::Q4_1 => {
            let mut acc = 0f32;
            for ((b, xb), &s) in row.chunks_exact(20).zip(x.chunks_exact(BLOCK)).zip(xsum) {
                let (d, m) = (half_at(b, 0), half_at(b, 2));
                let (lo, hi) = xb.split_at(16);
                let mut a = [0f32; 16];
                for j in 0..16 {
                    a[j] = f32::from(b[4 + j] & 0xF) * lo[j] + f32::from(b[4 + j] >> 4) * hi[j];
                }
                acc += d * a.iter().sum::<f32>() + m * s;
            }
            acc
        }
        WeightFormat::Q8_0 => {
            let mut acc = 0f32;
            for (b, xb) in row.chunks_exact(36).zip(x.chunks_exact(BLOCK)) {
                let d = half_at(b, 0);
                let mut a = [0f32; 8];
                for (j, (&q, &v)) in b[4..36].iter().zip(xb).enumerate() {
                    a[j % 8] += f32::from(q as i8) * v;
                }
                acc += d * a.iter().sum::<f32>();
            }
            acc
        }
    }
}

/// Decodes one stored row into `out` (`cols` values, each `nib·d + m` or `q·d` rounded
/// once to f32): for products with several input rows, which then share the decoding.
pub(crate) fn decode_row(format: WeightFormat, row: &[u8], out: &mut [f32]) {
    match format {
        WeightFormat::F32 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(BLOCK).zip(row.chunks_exact(20)) {
                let (d, m) = (half_at(b, 0), half_at(b, 2));
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    lo[j] = f32::from(b[4 + j] & 0xF) * d + m;
                    hi[j] = f32::from(b[4 + j] >> 4) * d + m;
                }
            }
        }
        WeightFormat::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(BLOCK).zip(row.chunks_exact(36)) {
                let d = half_at(b, 0);
                for (v, &q) in o.iter_mut().zip(&b[4..36]) {
                    *v = f32::from(q as i8) * d;
                }
            }
        }
    }
}

/// AVX2/FMA/F16C versions of the Q4_1 and Q8_0 dots (8 lanes, same arithmetic).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::BLOCK;
    use std::arch::x86_64::*;

    /// Whether this CPU has what the functions below need (cached by std).
    #[inline]
    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// How far ahead of the current block the `_512` kernels prefetch, in bytes.
    const PREFETCH: usize = 1024;

    /// Whether this CPU has what the `_512` functions below need (cached by std).
    #[inline]
    pub fn available_512() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// The two halves `(d, m)` at the start of block `b` (its first 4 bytes).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn halves(b: &[u8]) -> __m128 {
        let w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        _mm_cvtph_ps(_mm_cvtsi32_si128(w as i32))
    }

    /// Q4_1 row · x with 16-lane registers, two blocks per round on independent
    /// accumulators; the same per-block arithmetic as `dot_q4_1` (`d·Σ nib·x + m·Σx`).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub fn dot_q4_1_512(row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
        let nb = x.len() / BLOCK;
        assert!(row.len() == nb * 20 && xsum.len() == nb);
        let mask = _mm512_set1_epi32(0x0F);
        let mut acc = [_mm512_setzero_ps(); 2];
        let mut macc = [_mm_setzero_ps(); 2];
        let block = |i: usize, acc: &mut __m512, macc: &mut __m128| {
            let b = &row[i * 20..i * 20 + 20];
            let dm = halves(b);
            // SAFETY: `b` has 20 bytes, 16 of them from offset 4 are read; `x` has 32
            // floats from `i * 32` (lengths asserted above); unaligned loads.
            let v = unsafe {
                let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr().add(4) as *const __m128i));
                let lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, mask));
                let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4));
                let xp = x.as_ptr().add(i * BLOCK);
                let v = _mm512_mul_ps(lo, _mm512_loadu_ps(xp));
                _mm512_fmadd_ps(hi, _mm512_loadu_ps(xp.add(16)), v)
            };
            *acc = _mm512_fmadd_ps(_mm512_set1_ps(_mm_cvtss_f32(dm)), v, *acc);
            // m · Σx in lane 1
            *macc = _mm_fmadd_ps(dm, _mm_set1_ps(xsum[i]), *macc);
        };
        let [a0, a1] = &mut acc;
        let [m0, m1] = &mut macc;
        for i in (0..nb / 2 * 2).step_by(2) {
            // Rows follow each other in memory: fetch ahead into the next rows (a hint;
            // an address past the buffer is never dereferenced).
            ringkernel_core::util::prefetch(row.as_ptr().wrapping_add(i * 20 + PREFETCH), 64);
            block(i, a0, m0);
            block(i + 1, a1, m1);
        }
        if nb % 2 == 1 {
            block(nb - 1, a0, m0);
        }
        let m = _mm_add_ps(*m0, *m1);
        _mm512_reduce_add_ps(_mm512_add_ps(*a0, *a1)) + _mm_cvtss_f32(_mm_movehdup_ps(m))
    }

    /// Q8_0 row · x with 16-lane registers, two blocks per round on independent
    /// accumulators; the same per-block arithmetic as `dot_q8_0`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub fn dot_q8_0_512(row: &[u8], x: &[f32]) -> f32 {
        let nb = x.len() / BLOCK;
        assert!(row.len() == nb * 36);
        let mut acc = [_mm512_setzero_ps(); 2];
        let block = |i: usize, acc: &mut __m512| {
            let b = &row[i * 36..i * 36 + 36];
            let d = half(b, 0);
            // SAFETY: `b` has 36 bytes, 32 of them from offset 4 are read; `x` has 32
            // floats from `i * 32` (length asserted above); unaligned loads.
            let v = unsafe {
                let p = b.as_ptr().add(4);
                let f = |p: *const u8| {
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)))
                };
                let xp = x.as_ptr().add(i * BLOCK);
                let v = _mm512_mul_ps(f(p), _mm512_loadu_ps(xp));
                _mm512_fmadd_ps(f(p.add(16)), _mm512_loadu_ps(xp.add(16)), v)
            };
            *acc = _mm512_fmadd_ps(_mm512_set1_ps(d), v, *acc);
        };
        let [a0, a1] = &mut acc;
        for i in (0..nb / 2 * 2).step_by(2) {
            // as in `dot_q4_1_512`
            ringkernel_core::util::prefetch(row.as_ptr().wrapping_add(i * 36 + PREFETCH), 128);
            block(i, a0);
            block(i + 1, a1);
        }
        if nb % 2 == 1 {
            block(nb - 1, a0);
        }
        _mm512_reduce_add_ps(_mm512_add_ps(*a0, *a1))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn half(b: &[u8], i: usize) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            u16::from_le_bytes([b[i], b[i + 1]]) as i32,
        )))
    }

    /// Q4_1 row · x; `row` holds `x.len() / 32` blocks of 20 bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q4_1(row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
        assert!(row.len() == x.len() / BLOCK * 20 && xsum.len() == x.len() / BLOCK);
        let mask = _mm_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut macc = 0f32;
        for (i, b) in row.chunks_exact(20).enumerate() {
            let (d, m) = (half(b, 0), half(b, 2));
            // SAFETY: `b` has 20 bytes, 16 of them from offset 4 are read; `x` has 32
            // floats from `i * 32` (lengths asserted above); unaligned loads.
            let v = unsafe {
                let qs = _mm_loadu_si128(b.as_ptr().add(4) as *const __m128i);
                let lo = _mm_and_si128(qs, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
                let xp = x.as_ptr().add(i * BLOCK);
                let f = |q: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
                let mut v = _mm256_mul_ps(f(lo), _mm256_loadu_ps(xp));
                v = _mm256_fmadd_ps(f(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(xp.add(8)), v);
                v = _mm256_fmadd_ps(f(hi), _mm256_loadu_ps(xp.add(16)), v);
                _mm256_fmadd_ps(f(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(xp.add(24)), v)
            };
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), v, acc);
            macc += m * xsum[i];
        }
        hsum(acc) + macc
    }

    /// Q8_0 row · x; `row` holds `x.len() / 32` blocks of 36 bytes (scale, 2 bytes of
    /// padding, 32 codes).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
        assert!(row.len() == x.len() / BLOCK * 36);
        let mut acc = _mm256_setzero_ps();
        for (i, b) in row.chunks_exact(36).enumerate() {
            let d = half(b, 0);
            // SAFETY: `b` has 36 bytes, 32 of them from offset 4 are read; `x` has 32
            // floats from `i * 32` (length asserted above); unaligned loads.
            let v = unsafe {
                let q = _mm256_loadu_si256(b.as_ptr().add(4) as *const __m256i);
                let xp = x.as_ptr().add(i * BLOCK);
                let lo = _mm256_castsi256_si128(q);
                let hi = _mm256_extracti128_si256(q, 1);
                let f = |q: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                let mut v = _mm256_mul_ps(f(lo), _mm256_loadu_ps(xp));
                v = _mm256_fmadd_ps(f(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(xp.add(8)), v);
                v = _mm256_fmadd_ps(f(hi), _mm256_loadu_ps(xp.add(16)), v);
                _mm256_fmadd_ps(f(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(xp.add(24)), v)
            };
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), v, acc);
        }
        hsum(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringkernel_core::compute::quant;
    use ringkernel_core::util::SplitMix64;

    #[test]
    fn simd_and_plain_dots_agree() {
        let mut rng = SplitMix64::new(7);
        for (format, n) in WeightFormat::ALL
            .into_iter()
            .flat_map(|f| [32, 544, 576].map(|n| (f, n)))
        {
            let x = rng.vec(n, -1.0, 1.0);
            let w = quant::quantize(format, &rng.vec(n, -1.0, 1.0)).unwrap();
            let bytes: &[u8] = bytemuck::cast_slice(&w);
            let s = block_sums(format, &x);
            let (a, b) = (dot(format, bytes, &x, &s), dot_plain(format, bytes, &x, &s));
            let exact: f64 = quant::dequantize_f64(format, &w, n)
                .unwrap()
                .iter()
                .zip(&x)
                .map(|(w, &x)| w * f64::from(x))
                .sum();
            assert!(
                (f64::from(a) - exact).abs() < 1e-4,
                "{format} simd {a} vs {exact}"
            );
            assert!(
                (f64::from(b) - exact).abs() < 1e-4,
                "{format} plain {b} vs {exact}"
            );
            #[cfg(target_arch = "x86_64")]
            if x86::available() {
                // SAFETY: the CPU has what the kernels need (just checked).
                let c = unsafe {
                    match format {
                        WeightFormat::Q4_1 => x86::dot_q4_1(bytes, &x, &s),
                        WeightFormat::Q8_0 => x86::dot_q8_0(bytes, &x),
                        WeightFormat::F32 => b,
                    }
                };
                assert!((f64::from(c) - exact).abs() < 1e-4, "{format} avx2 {c}");
            }
        }
    }
}
