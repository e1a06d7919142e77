//! ggml tensor types: block layouts, dequantization, and matrix-vector products computed
//! directly on the quantized blocks.
//!
//! Block formats (32 values a block, little-endian):
//!
//! | type | bytes | layout | value `j` |
//! |------|-------|--------|-----------|
//! | Q4_0 | 18 | `d: f16, qs: [u8; 16]` | `(nib_j - 8) · d` |
//! | Q4_1 | 20 | `d: f16, m: f16, qs: [u8; 16]` | `nib_j · d + m` |
//! | Q8_0 | 34 | `d: f16, qs: [i8; 32]` | `qs[j] · d` |
//!
//! where `nib_j` is the low nibble of `qs[j]` for `j < 16` and the high nibble of
//! `qs[j - 16]` otherwise.
//!
//! ```
//! use ringkernel_llm::quant::{quantize_q8_0, dequantize, GgmlType};
//! let x: Vec<f32> = (0..64).map(|i| i as f32 / 10.0).collect();
//! let q = quantize_q8_0(&x);
//! let mut y = vec![0.0; 64];
//! dequantize(GgmlType::Q8_0, &q, &mut y).unwrap();
//! assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 0.03));
//! ```

use crate::error::{LlmError, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Values in one quantization block.
pub const QK: usize = 32;

/// A ggml element type this crate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit, scale only.
    Q4_0,
    /// 4-bit, scale and minimum.
    Q4_1,
    /// 8-bit, scale only.
    Q8_0,
}

impl GgmlType {
    /// The type for a ggml type id, or `None` for ids this crate cannot decode.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }
    /// The ggml type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::Bf16 => 30,
        }
    }
    /// ggml's name.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Bf16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q8_0 => "Q8_0",
        }
    }
    /// Values per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            _ => QK,
        }
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q8_0 => 34,
        }
    }
    /// Bytes that `n` values take (`n` a multiple of the block length).
    pub fn bytes_for(self, n: usize) -> usize {
        n / self.block_len() * self.block_bytes()
    }
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn check(ty: GgmlType, bytes: &[u8], n: usize) -> Result<()> {
    if !n.is_multiple_of(ty.block_len()) {
        return Err(LlmError::Shape(format!(
            "{} values is not a multiple of {}'s block of {}",
            n,
            ty.name(),
            ty.block_len()
        )));
    }
    if bytes.len() != ty.bytes_for(n) {
        return Err(LlmError::Shape(format!(
            "{} values of {} take {} bytes, got {}",
            n,
            ty.name(),
            ty.bytes_for(n),
            bytes.len()
        )));
    }
    Ok(())
}

/// Decodes `out.len()` values of type `ty` from `bytes`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check(ty, bytes, out.len())?;
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    o[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
                    o[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(20)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for j in 0..16 {
                    o[j] = (b[4 + j] & 0xF) as f32 * d + m;
                    o[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(bytes.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for j in 0..QK {
                    o[j] = b[2 + j] as i8 as f32 * d;
                }
            }
        }
    }
    Ok(())
}

/// Quantizes `x` (length a multiple of 32) to Q8_0 the way ggml does (`d = amax / 127`).
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * 34);
    for blk in x.chunks_exact(QK) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        for v in blk {
            out.push((v * id).round() as i8 as u8);
        }
    }
    out
}

/// Quantizes `x` (length a multiple of 32) to Q4_1 the way ggml does
/// (`d = (max - min) / 15`, `m = min`).
pub fn quantize_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * 20);
    for blk in x.chunks_exact(QK) {
        let min = blk.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let max = blk.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(min).to_le_bytes());
        for j in 0..16 {
            let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
            out.push(q(blk[j]) | (q(blk[j + 16]) << 4));
        }
    }
    out
}

/// Encodes f32 values as f16 bytes.
pub fn to_f16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|&v| f16::from_f32(v).to_le_bytes())
        .collect()
}

/// Encodes f32 values as bf16 bytes.
pub fn to_bf16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
        .collect()
}

/// Per-block sums of `x` (length a multiple of 32), the second factor of Q4_1's dot.
fn block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(QK).map(|b| b.iter().sum()).collect()
}

/// AVX2/FMA/F16C versions of the hot dot products (same f32 arithmetic, 8 lanes).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::QK;
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
        assert!(row.len() == x.len() / QK * 20 && xsum.len() == x.len() / QK);
        let mask = _mm_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut macc = 0f32;
        for (i, b) in row.chunks_exact(20).enumerate() {
            let (d, m) = (half(b, 0), half(b, 2));
            // SAFETY: `b` has 20 bytes, 16 of them from offset 4 are read; `x` has
            // 32 floats from `i * 32` (lengths asserted above); unaligned loads.
            let v = unsafe {
                let qs = _mm_loadu_si128(b.as_ptr().add(4) as *const __m128i);
                let lo = _mm_and_si128(qs, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
                let xp = x.as_ptr().add(i * QK);
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

    /// Q8_0 row · x; `row` holds `x.len() / 32` blocks of 34 bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
        assert!(row.len() == x.len() / QK * 34);
        let mut acc = _mm256_setzero_ps();
        for (i, b) in row.chunks_exact(34).enumerate() {
            let d = half(b, 0);
            // SAFETY: `b` has 34 bytes, 32 of them from offset 2 are read; `x` has 32
            // floats from `i * 32` (length asserted above); unaligned loads.
            let v = unsafe {
                let q = _mm256_loadu_si256(b.as_ptr().add(2) as *const __m256i);
                let xp = x.as_ptr().add(i * QK);
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

/// `row · x`, through the AVX2 kernels where the CPU has them (`simd`).
#[inline]
fn dot_row_fast(ty: GgmlType, row: &[u8], x: &[f32], xsum: &[f32], simd: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd {
        match ty {
            // SAFETY: `simd` is true only when `x86::available()` said the CPU has
            // AVX2, FMA and F16C.
            GgmlType::Q4_1 => return unsafe { x86::dot_q4_1(row, x, xsum) },
            // SAFETY: as above.
            GgmlType::Q8_0 => return unsafe { x86::dot_q8_0(row, x) },
            _ => {}
        }
    }
    let _ = simd;
    dot_row(ty, row, x, xsum)
}

/// Whether the SIMD kernels are used on this CPU.
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `row · x` for one quantized row; `xsum` holds `x`'s block sums (Q4_0/Q4_1 use them).
#[inline]
fn dot_row(ty: GgmlType, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
    match ty {
        GgmlType::Q4_1 => {
            let mut acc = 0f32;
            for ((b, xb), &s) in row.chunks_exact(20).zip(x.chunks_exact(QK)).zip(xsum) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qs: &[u8; 16] = b[4..20].try_into().expect("block of 20 bytes");
                let (lo, hi) = xb.split_at(16);
                let mut a = [0f32; 16];
                for j in 0..16 {
                    a[j] = (qs[j] & 0xF) as f32 * lo[j] + (qs[j] >> 4) as f32 * hi[j];
                }
                acc += d * a.iter().sum::<f32>() + m * s;
            }
            acc
        }
        GgmlType::Q4_0 => {
            let mut acc = 0f32;
            for ((b, xb), &s) in row.chunks_exact(18).zip(x.chunks_exact(QK)).zip(xsum) {
                let d = f16_at(b, 0);
                let qs: &[u8; 16] = b[2..18].try_into().expect("block of 18 bytes");
                let (lo, hi) = xb.split_at(16);
                let mut a = [0f32; 16];
                for j in 0..16 {
                    a[j] = (qs[j] & 0xF) as f32 * lo[j] + (qs[j] >> 4) as f32 * hi[j];
                }
                acc += d * (a.iter().sum::<f32>() - 8.0 * s);
            }
            acc
        }
        GgmlType::Q8_0 => {
            let mut acc = 0f32;
            for (b, xb) in row.chunks_exact(34).zip(x.chunks_exact(QK)) {
                let d = f16_at(b, 0);
                let mut a = [0f32; 8];
                for (j, (&q, &v)) in b[2..34].iter().zip(xb).enumerate() {
                    a[j % 8] += q as i8 as f32 * v;
                }
                acc += d * a.iter().sum::<f32>();
            }
            acc
        }
        GgmlType::F32 => {
            let mut a = [0f32; 8];
            for (j, (c, &v)) in row.chunks_exact(4).zip(x).enumerate() {
                a[j % 8] += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * v;
            }
            a.iter().sum()
        }
        GgmlType::F16 | GgmlType::Bf16 => {
            let conv = if ty == GgmlType::F16 {
                |c: &[u8]| f16::from_le_bytes([c[0], c[1]]).to_f32()
            } else {
                |c: &[u8]| bf16::from_le_bytes([c[0], c[1]]).to_f32()
            };
            let mut a = [0f32; 8];
            for (j, (c, &v)) in row.chunks_exact(2).zip(x).enumerate() {
                a[j % 8] += conv(c) * v;
            }
            a.iter().sum()
        }
    }
}

/// A read-only matrix of `rows × cols` values of one ggml type, row-major, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    /// Element type.
    pub ty: GgmlType,
    /// Rows (outputs of a matvec).
    pub rows: usize,
    /// Columns (a row's length; a multiple of the block length).
    pub cols: usize,
    /// `rows · bytes_for(cols)` bytes.
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Checks the sizes and wraps the bytes.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| LlmError::Shape(format!("{rows} x {cols} overflows")))?;
        if !cols.is_multiple_of(ty.block_len()) {
            return Err(LlmError::Shape(format!(
                "{} columns is not a multiple of {}'s block of {}",
                cols,
                ty.name(),
                ty.block_len()
            )));
        }
        check(ty, data, n)?;
        Ok(Self {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.ty.bytes_for(self.cols)
    }

    /// The quantized bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Decodes row `r` into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        if r >= self.rows {
            return Err(LlmError::Shape(format!(
                "row {r} of a matrix of {} rows",
                self.rows
            )));
        }
        dequantize(self.ty, self.row(r), out)
    }

    /// The whole matrix as f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        dequantize(self.ty, self.data, &mut out).expect("sizes checked in QMatrix::new");
        out
    }

    /// `y = W · x` on the quantized rows, rows split over rayon's threads (SIMD kernels
    /// where the CPU has them).
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        self.matvec_with(x, y, simd_available())
    }

    /// [`Self::matvec`] with the SIMD kernels on (where available) or off: for tests
    /// that compare the two.
    pub fn matvec_with(&self, x: &[f32], y: &mut [f32], simd: bool) -> Result<()> {
        let simd = simd && simd_available();
        if x.len() != self.cols || y.len() != self.rows {
            return Err(LlmError::Shape(format!(
                "matvec of a {} x {} matrix with x of {} and y of {}",
                self.rows,
                self.cols,
                x.len(),
                y.len()
            )));
        }
        let xsum = if self.ty.block_len() == QK {
            block_sums(x)
        } else {
            Vec::new()
        };
        let rb = self.row_bytes();
        // Rows in chunks of 16: enough work per task to hide rayon's overhead.
        y.par_chunks_mut(16)
            .zip(self.data.par_chunks(rb * 16))
            .for_each(|(ys, rows)| {
                for (o, row) in ys.iter_mut().zip(rows.chunks_exact(rb)) {
                    *o = dot_row_fast(self.ty, row, x, &xsum, simd);
                }
            });
        Ok(())
    }
}
