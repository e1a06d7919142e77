//! Dot products of one stored weight row (a [`WeightFormat`] row, as bytes) with f32
//! vectors, straight on the blocks: AVX2/FMA/F16C kernels where the CPU has them, plain
//! loops otherwise. The same f32 arithmetic in both: `d·Σ nib·x + m·Σx` per Q4_1
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
        for format in WeightFormat::ALL {
            let x = rng.vec(576, -1.0, 1.0);
            let w = quant::quantize(format, &rng.vec(576, -1.0, 1.0)).unwrap();
            let bytes: &[u8] = bytemuck::cast_slice(&w);
            let s = block_sums(format, &x);
            let (a, b) = (dot(format, bytes, &x, &s), dot_plain(format, bytes, &x, &s));
            let exact: f64 = quant::dequantize_f64(format, &w, 576)
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
        }
    }
}
