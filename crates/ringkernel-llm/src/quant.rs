//! ggml tensor types as a GGUF file stores them: block layouts, dequantization and
//! quantization on the host (the device formats the decoder multiplies with are
//! `ringkernel_core::compute::quant`'s; see [`crate::weights`]).
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
use ringkernel_core::compute::{quant, WeightFormat};

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
    quant::quantize_ggml(WeightFormat::Q8_0, x).expect("a whole number of blocks")
}

/// Quantizes `x` (length a multiple of 32) to Q4_1 the way ggml does
/// (`d = (max - min) / 15`, `m = min`).
pub fn quantize_q4_1(x: &[f32]) -> Vec<u8> {
    quant::quantize_ggml(WeightFormat::Q4_1, x).expect("a whole number of blocks")
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
}
