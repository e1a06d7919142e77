//! Weight matrices stored in blocks of 32 values, as the quantized ops
//! ([`ComputeBackend::qmatmul`](super::ComputeBackend::qmatmul),
//! [`ComputeBackend::embedding`](super::ComputeBackend::embedding)) read them on every
//! backend.
//!
//! A matrix of `rows × cols` values (`cols` a multiple of 32) is row-major: row `r` is
//! `cols / 32` consecutive blocks. A block is a whole number of 32-bit words, so GPU
//! kernels that address words (WGSL has no byte loads) read it directly:
//!
//! | format | words | layout | value `j` of the block |
//! |--------|-------|--------|------------------------|
//! | `F32` | 32 | 32 × f32 | `x[j]` |
//! | `Q4_1` | 5 | `d: f16, m: f16` (word 0: `d` low half, `m` high half), 16 bytes of nibbles | `nib_j · d + m` |
//! | `Q8_0` | 9 | `d: f16` (word 0, low half; high half zero), 32 × i8 | `q_j · d` |
//!
//! where `nib_j` is the low nibble of byte `j` for `j < 16` and the high nibble of byte
//! `j − 16` otherwise. `Q4_1` is ggml's block byte for byte; ggml's 34-byte `Q8_0` block
//! gets two bytes of padding after its scale ([`WeightFormat::pack_ggml`]).
//!
//! ```
//! use ringkernel_core::compute::quant::{self, WeightFormat};
//! let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 10.0).collect();
//! let words = quant::quantize(WeightFormat::Q8_0, &x)?;
//! assert_eq!(words.len(), WeightFormat::Q8_0.words(1, 64)?);
//! let back = quant::dequantize(WeightFormat::Q8_0, &words, 64)?;
//! assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() < 0.02));
//! # Ok::<(), ringkernel_core::Error>(())
//! ```

use super::dtype::{f16_bits_to_f32, f32_to_f16_bits};
use crate::error::{Error, Result};

/// Values per block.
pub const BLOCK: usize = 32;

/// How a weight matrix is stored (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Plain f32 (a block is 32 words).
    F32,
    /// ggml's 4-bit format with a scale and a minimum per block.
    Q4_1,
    /// ggml's 8-bit format with a scale per block.
    Q8_0,
}

impl WeightFormat {
    /// Every format.
    pub const ALL: [WeightFormat; 3] = [WeightFormat::F32, WeightFormat::Q4_1, WeightFormat::Q8_0];

    /// Name (`f32`, `q4_1`, `q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::Q4_1 => "q4_1",
            WeightFormat::Q8_0 => "q8_0",
        }
    }

    /// Numeric code shared with GPU kernels (0 f32, 1 q4_1, 2 q8_0).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Words per block of 32 values.
    pub fn block_words(self) -> usize {
        match self {
            WeightFormat::F32 => 32,
            WeightFormat::Q4_1 => 5,
            WeightFormat::Q8_0 => 9,
        }
    }

    /// Bytes of one block in a ggml (GGUF) file.
    pub fn ggml_block_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 128,
            WeightFormat::Q4_1 => 20,
            WeightFormat::Q8_0 => 34,
        }
    }

    /// Words of a `rows × cols` matrix: [`Error::ShapeMismatch`] when `cols` is not a
    /// multiple of 32 or the size overflows.
    pub fn words(self, rows: usize, cols: usize) -> Result<usize> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(Error::shape(format!(
                "{} weights: {cols} columns is not a multiple of the block of {BLOCK}",
                self.name()
            )));
        }
        (cols / BLOCK)
            .checked_mul(self.block_words())
            .and_then(|w| w.checked_mul(rows))
            .ok_or_else(|| {
                Error::shape(format!(
                    "{} weights: {rows} x {cols} overflows",
                    self.name()
                ))
            })
    }

    /// Repacks ggml blocks (the bytes of a GGUF tensor of this type, any number of
    /// whole blocks) into device words. [`Error::ShapeMismatch`] unless `bytes` is a
    /// whole number of blocks.
    pub fn pack_ggml(self, bytes: &[u8]) -> Result<Vec<u32>> {
        let bb = self.ggml_block_bytes();
        if !bytes.len().is_multiple_of(bb) {
            return Err(Error::shape(format!(
                "{} data of {} bytes is not a whole number of {bb}-byte blocks",
                self.name(),
                bytes.len()
            )));
        }
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let mut out = Vec::with_capacity(bytes.len() / bb * self.block_words());
        for blk in bytes.chunks_exact(bb) {
            match self {
                WeightFormat::F32 | WeightFormat::Q4_1 => {
                    out.extend(blk.chunks_exact(4).map(word));
                }
                WeightFormat::Q8_0 => {
                    out.push(u32::from(u16::from_le_bytes([blk[0], blk[1]])));
                    out.extend(blk[2..].chunks_exact(4).map(word));
                }
            }
        }
        Ok(out)
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Byte `i` of a word slice (little-endian).
fn byte(words: &[u32], i: usize) -> u8 {
    (words[i / 4] >> (8 * (i % 4))) as u8
}

/// Decodes `n` values (a multiple of 32) from `words`, each value correctly rounded to
/// f32. [`Error::ShapeMismatch`] when `words` is shorter than `n` values need.
pub fn dequantize(format: WeightFormat, words: &[u32], n: usize) -> Result<Vec<f32>> {
    Ok(dequantize_f64(format, words, n)?
        .into_iter()
        .map(|v| v as f32)
        .collect())
}

/// [`dequantize`] in f64, where every block value is exact (the f16 scale and minimum
/// and the small integer codes multiply and add without rounding).
pub fn dequantize_f64(format: WeightFormat, words: &[u32], n: usize) -> Result<Vec<f64>> {
    let need = format.words(1, n)?;
    if words.len() < need {
        return Err(Error::shape(format!(
            "{} data: {n} values need {need} words, got {}",
            format.name(),
            words.len()
        )));
    }
    let bw = format.block_words();
    let half = |w: u32| f64::from(f16_bits_to_f32(w as u16));
    let mut out = Vec::with_capacity(n);
    for blk in words[..need].chunks_exact(bw) {
        match format {
            WeightFormat::F32 => out.extend(blk.iter().map(|&w| f64::from(f32::from_bits(w)))),
            WeightFormat::Q4_1 => {
                let (d, m) = (half(blk[0]), half(blk[0] >> 16));
                let qs = &blk[1..];
                out.extend((0..16).map(|j| f64::from(byte(qs, j) & 0xF) * d + m));
                out.extend((0..16).map(|j| f64::from(byte(qs, j) >> 4) * d + m));
            }
            WeightFormat::Q8_0 => {
                let d = half(blk[0]);
                let qs = &blk[1..];
                out.extend((0..BLOCK).map(|j| f64::from(byte(qs, j) as i8) * d));
            }
        }
    }
    Ok(out)
}

/// Quantizes `x` (length a multiple of 32) the way ggml does, straight into device
/// words: `Q8_0` with `d = max|x| / 127`, `Q4_1` with `d = (max − min) / 15`, `m = min`.
pub fn quantize(format: WeightFormat, x: &[f32]) -> Result<Vec<u32>> {
    format.pack_ggml(&quantize_ggml(format, x)?)
}

/// Quantizes `x` (length a multiple of 32) into ggml's block bytes (as a GGUF file
/// stores them): see [`quantize`].
pub fn quantize_ggml(format: WeightFormat, x: &[f32]) -> Result<Vec<u8>> {
    format.words(1, x.len())?;
    let mut out = Vec::with_capacity(x.len() / BLOCK * format.ggml_block_bytes());
    for blk in x.chunks_exact(BLOCK) {
        match format {
            WeightFormat::F32 => out.extend(blk.iter().flat_map(|v| v.to_le_bytes())),
            WeightFormat::Q8_0 => {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f32_to_f16_bits(d).to_le_bytes());
                out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
            }
            WeightFormat::Q4_1 => {
                let min = blk.iter().fold(f32::INFINITY, |a, &v| a.min(v));
                let max = blk.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f32_to_f16_bits(d).to_le_bytes());
                out.extend(f32_to_f16_bits(min).to_le_bytes());
                let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
                out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_is_repacked_with_two_padding_bytes() {
        let mut blk = vec![0u8; 34];
        blk[0] = 0x00;
        blk[1] = 0x3C; // d = 1.0
        for (j, b) in blk[2..].iter_mut().enumerate() {
            *b = (j as i8 - 16) as u8;
        }
        let w = WeightFormat::Q8_0.pack_ggml(&blk).unwrap();
        assert_eq!(w.len(), 9);
        assert_eq!(w[0], 0x3C00);
        let v = dequantize(WeightFormat::Q8_0, &w, 32).unwrap();
        assert_eq!(v[0], -16.0);
        assert_eq!(v[31], 15.0);
        assert!(WeightFormat::Q8_0.pack_ggml(&blk[..33]).is_err());
    }

    #[test]
    fn q4_1_nibbles_low_then_high() {
        let x: Vec<f32> = (0..32).map(|j| j as f32 / 31.0 * 15.0).collect();
        let w = quantize(WeightFormat::Q4_1, &x).unwrap();
        assert_eq!(w.len(), 5);
        let v = dequantize(WeightFormat::Q4_1, &w, 32).unwrap();
        for (a, b) in x.iter().zip(&v) {
            assert!((a - b).abs() <= 0.5 + 1e-3, "{a} {b}");
        }
        assert_eq!(v[0], 0.0);
        assert_eq!(v[31], 15.0);
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(WeightFormat::Q4_1.words(3, 64).unwrap(), 30);
        assert_eq!(WeightFormat::F32.words(2, 32).unwrap(), 64);
        assert!(matches!(
            WeightFormat::Q8_0.words(1, 33),
            Err(Error::ShapeMismatch(_))
        ));
        assert!(WeightFormat::Q8_0.words(usize::MAX, 64).is_err());
        assert!(dequantize(WeightFormat::Q8_0, &[0; 8], 32).is_err());
    }
}
