//! GGUF tensors as device weight matrices ([`WeightFormat`] blocks): which format each
//! ggml type becomes, and the layout changes the decoder relies on.
//!
//! * Q4_1 and Q8_0 keep their blocks (Q8_0 padded to whole words); Q4_0 becomes Q4_1
//!   exactly (`m = −8·d`); F32, F16 and BF16 matrices are decoded to f32.
//! * The query and key rows of each head are put in the half-split order of the
//!   device's RoPE: GGUF stores llama's q/k rows so that rotation pairs are adjacent
//!   (`2i, 2i+1`); row `i` of a head becomes old row `2i` and row `half + i` old row
//!   `2i + 1` (attention scores are dot products, unchanged by a permutation applied to
//!   both queries and keys).
//! * q, k and v are concatenated into one matrix (one product per layer), as are the
//!   gate and up matrices' formats matched; matrices of different formats are joined as
//!   f32.

use crate::error::{LlmError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{dequantize, GgmlType};
use ringkernel::compute::{Device, QuantMatrix, WeightFormat};
use ringkernel_core::compute::dtype::{f16_bits_to_f32, f32_to_f16_bits};
use ringkernel_core::compute::quant;

/// The device format of a ggml type.
pub fn device_format(ty: GgmlType) -> WeightFormat {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q4_0 => WeightFormat::Q4_1,
        GgmlType::Q8_0 => WeightFormat::Q8_0,
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => WeightFormat::F32,
    }
}

/// The format of matrices of these ggml types once joined (their device format when
/// it agrees, else f32), for memory estimates.
pub fn joined_format(types: &[GgmlType]) -> WeightFormat {
    let f = device_format(types[0]);
    if types.iter().all(|&t| device_format(t) == f) {
        f
    } else {
        WeightFormat::F32
    }
}

/// A matrix on the host, in device words.
#[derive(Debug, Clone)]
pub struct HostMatrix {
    /// Storage format.
    pub format: WeightFormat,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// The words.
    pub words: Vec<u32>,
}

impl HostMatrix {
    /// Reads tensor `t` (`rows × cols`), its rows reordered by `order` when given (row
    /// `i` of the result is row `order[i]` of the tensor), into its device format.
    pub fn read(
        f: &GgufFile,
        t: &TensorInfo,
        rows: usize,
        cols: usize,
        order: Option<&[usize]>,
    ) -> Result<Self> {
        if t.dims.len() != 2 || t.row_len() != cols || t.rows() != rows {
            return Err(LlmError::Shape(format!(
                "tensor `{}` is {:?} (ggml order), the model needs [{cols}, {rows}]",
                t.name, t.dims
            )));
        }
        let bytes = f.tensor_bytes(t);
        let rb = t.dtype.bytes_for(cols);
        let reordered;
        let bytes = match order {
            None => bytes,
            Some(o) => {
                reordered = o
                    .iter()
                    .flat_map(|&r| &bytes[r * rb..(r + 1) * rb])
                    .copied()
                    .collect::<Vec<u8>>();
                &reordered[..]
            }
        };
        let (format, words) = match t.dtype {
            GgmlType::Q4_1 | GgmlType::Q8_0 => {
                let f = device_format(t.dtype);
                (f, f.pack_ggml(bytes)?)
            }
            GgmlType::Q4_0 => match q4_0_as_q4_1(bytes) {
                Some(v) => (WeightFormat::Q4_1, WeightFormat::Q4_1.pack_ggml(&v)?),
                None => (WeightFormat::F32, f32_words(t.dtype, bytes, rows * cols)?),
            },
            _ => (WeightFormat::F32, f32_words(t.dtype, bytes, rows * cols)?),
        };
        Ok(HostMatrix {
            format,
            rows,
            cols,
            words,
        })
    }

    /// The matrix in `format`: the same when it already is, else (only to f32) decoded.
    pub fn into_format(self, format: WeightFormat) -> Result<Self> {
        if self.format == format {
            return Ok(self);
        }
        if format != WeightFormat::F32 {
            return Err(LlmError::InvalidArgument(format!(
                "{} weights convert only to f32, not {format}",
                self.format
            )));
        }
        let v = quant::dequantize(self.format, &self.words, self.rows * self.cols)?;
        Ok(HostMatrix {
            format,
            words: v.iter().map(|x| x.to_bits()).collect(),
            ..self
        })
    }

    /// Stacks matrices of one width vertically, in their common format (f32 when they
    /// differ).
    pub fn stack(parts: Vec<HostMatrix>) -> Result<Self> {
        let cols = parts[0].cols;
        if parts.iter().any(|p| p.cols != cols) {
            return Err(LlmError::Shape("stacked matrices differ in width".into()));
        }
        let format = common_format(&parts);
        let parts = parts
            .into_iter()
            .map(|p| p.into_format(format))
            .collect::<Result<Vec<_>>>()?;
        let rows = parts.iter().map(|p| p.rows).sum();
        let words = parts.into_iter().flat_map(|p| p.words).collect();
        Ok(HostMatrix {
            format,
            rows,
            cols,
            words,
        })
    }

    /// Uploads it.
    pub fn upload(&self, device: &Device) -> Result<QuantMatrix> {
        Ok(QuantMatrix::from_words(
            device,
            self.format,
            self.rows,
            self.cols,
            &self.words,
        )?)
    }

    /// Device bytes.
    pub fn bytes(&self) -> u64 {
        self.words.len() as u64 * 4
    }
}

/// The format matrices share: theirs when they agree, else f32.
pub fn common_format(parts: &[HostMatrix]) -> WeightFormat {
    let f = parts[0].format;
    if parts.iter().all(|p| p.format == f) {
        f
    } else {
        WeightFormat::F32
    }
}

/// Values decoded to f32 words.
fn f32_words(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<u32>> {
    let mut v = vec![0f32; n];
    dequantize(ty, bytes, &mut v)?;
    Ok(v.iter().map(|x| x.to_bits()).collect())
}

/// Q4_0 blocks (`d`, 16 bytes of nibbles; value `(nib − 8)·d`) as Q4_1 blocks with
/// `m = −8·d`, or `None` when some `−8·d` is not an f16 (an overflowing scale).
fn q4_0_as_q4_1(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len() / 18 * 20);
    for b in bytes.chunks_exact(18) {
        let d = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        let m = f32_to_f16_bits(-8.0 * d);
        if f16_bits_to_f32(m) != -8.0 * d {
            return None;
        }
        out.extend_from_slice(&b[0..2]);
        out.extend(m.to_le_bytes());
        out.extend_from_slice(&b[2..18]);
    }
    Some(out)
}

/// The row order that turns GGUF's interleaved rotation pairs into the half-split
/// layout, for `heads` heads of `head_dim` rows.
pub fn half_split_order(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..heads * head_dim)
        .map(|r| {
            let (h, i) = (r / head_dim, r % head_dim);
            h * head_dim + if i < half { 2 * i } else { 2 * (i - half) + 1 }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_q8_0;

    #[test]
    fn q4_0_becomes_q4_1_exactly() {
        let mut blk = vec![0u8; 18];
        blk[..2].copy_from_slice(&f32_to_f16_bits(0.25).to_le_bytes());
        for (j, b) in blk[2..].iter_mut().enumerate() {
            *b = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut want = vec![0f32; 32];
        dequantize(GgmlType::Q4_0, &blk, &mut want).unwrap();
        let q41 = q4_0_as_q4_1(&blk).unwrap();
        let mut got = vec![0f32; 32];
        dequantize(GgmlType::Q4_1, &q41, &mut got).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn half_split_order_moves_pairs_apart() {
        assert_eq!(half_split_order(2, 4), vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }

    #[test]
    fn mixed_formats_join_as_f32() {
        assert_eq!(
            joined_format(&[GgmlType::Q4_1, GgmlType::Q4_0]),
            WeightFormat::Q4_1
        );
        assert_eq!(
            joined_format(&[GgmlType::Q4_1, GgmlType::Q8_0]),
            WeightFormat::F32
        );
        let x: Vec<f32> = (0..64).map(|i| i as f32 / 8.0).collect();
        let m = HostMatrix {
            format: WeightFormat::Q8_0,
            rows: 1,
            cols: 64,
            words: WeightFormat::Q8_0.pack_ggml(&quantize_q8_0(&x)).unwrap(),
        };
        let f = m.clone().into_format(WeightFormat::F32).unwrap();
        assert_eq!(f.words.len(), 64);
        assert!(m.into_format(WeightFormat::Q4_1).is_err());
    }
}
