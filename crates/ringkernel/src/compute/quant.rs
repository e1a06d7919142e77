//! [`QuantMatrix`]: a weight matrix stored in blocks on a device (f32, or ggml's Q4_1 and
//! Q8_0 quantizations), multiplied and looked up in without being expanded to f32.

use super::tensor::numel;
use super::{Device, Tensor};
use crate::core::compute::quant;
use crate::core::compute::{
    checks, dtype, BufferRef, DType, EmbeddingDims, QMatmulDims, WeightFormat,
};
use crate::{Error, Result};
use std::fmt;

/// A `rows × cols` weight matrix in a [`WeightFormat`] on a device (`cols` a multiple of
/// 32), as a linear layer or an embedding table uses it:
/// [`QuantMatrix::matmul`] is `x · Wᵀ` on the stored blocks, [`QuantMatrix::embedding`]
/// gathers rows by id.
///
/// ```
/// use ringkernel::compute::{Device, QuantMatrix, Tensor, WeightFormat};
/// let dev = Device::cpu();
/// let w: Vec<f32> = (0..2 * 64).map(|i| (i % 7) as f32 - 3.0).collect();
/// let q = QuantMatrix::quantize(&dev, WeightFormat::Q8_0, &w, 2, 64)?;
/// let x = Tensor::full(&dev, &[1, 64], 1.0)?;
/// let y = q.matmul(&x)?.to_vec()?; // each row's sum, from the 8-bit blocks
/// let want: f32 = w[..64].iter().sum();
/// assert!((y[0] - want).abs() < 0.05);
/// let ids = Tensor::from_u32(&dev, &[1, 0], &[2])?;
/// assert_eq!(q.embedding(&ids)?.shape(), &[2, 64]);
/// # Ok::<(), ringkernel::Error>(())
/// ```
#[derive(Clone)]
pub struct QuantMatrix {
    buf: BufferRef,
    device: Device,
    format: WeightFormat,
    rows: usize,
    cols: usize,
}

impl fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("device", &self.device.kind())
            .finish()
    }
}

impl QuantMatrix {
    /// Uploads a matrix already in device words ([`quant`](crate::core::compute::quant)
    /// layout); [`Error::ShapeMismatch`] unless `words` is exactly `rows × cols` of it.
    pub fn from_words(
        device: &Device,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        words: &[u32],
    ) -> Result<QuantMatrix> {
        let need = format.words(rows, cols)?;
        numel(&[rows, cols])?;
        if words.len() != need {
            return Err(Error::shape(format!(
                "{format} matrix {rows} x {cols} takes {need} words, got {}",
                words.len()
            )));
        }
        let buf = device.backend().upload(dtype::words_as_f32(words))?;
        Ok(QuantMatrix {
            buf,
            device: device.clone(),
            format,
            rows,
            cols,
        })
    }

    /// Uploads a matrix from ggml's block bytes (a GGUF tensor of type F32, Q4_1 or Q8_0,
    /// rows of `cols` values).
    pub fn from_ggml(
        device: &Device,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QuantMatrix> {
        Self::from_words(device, format, rows, cols, &format.pack_ggml(bytes)?)
    }

    /// Quantizes row-major f32 `values` (`rows × cols`) the way ggml does and uploads them.
    pub fn quantize(
        device: &Device,
        format: WeightFormat,
        values: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<QuantMatrix> {
        if values.len() != numel(&[rows, cols])? {
            return Err(Error::shape(format!(
                "quantize: {} values for a {rows} x {cols} matrix",
                values.len()
            )));
        }
        Self::from_words(
            device,
            format,
            rows,
            cols,
            &quant::quantize(format, values)?,
        )
    }

    /// The storage format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Rows (outputs of [`QuantMatrix::matmul`], entries of the table).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (the input width).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device buffer (for calling backend ops directly).
    pub fn buffer(&self) -> &BufferRef {
        &self.buf
    }

    /// Device bytes the matrix takes.
    pub fn bytes(&self) -> usize {
        self.buf.len() * 4
    }

    fn input(&self, x: &Tensor, op: &str) -> Result<usize> {
        if x.device() != &self.device {
            return Err(Error::Device(format!(
                "{op}: the tensor is on {} and the matrix on {}; move it with to_device",
                x.device(),
                self.device
            )));
        }
        if x.dtype() != DType::F32 {
            return Err(Error::invalid(format!(
                "{op} takes f32 inputs, got {}: convert with to_dtype(DType::F32)",
                x.dtype()
            )));
        }
        match x.shape().last() {
            Some(&c) if c == self.cols => Ok(x.len() / c),
            _ => Err(Error::shape(format!(
                "{op}: input of shape {:?} against a {} x {} matrix (the last dimension must \
                 be {})",
                x.shape(),
                self.rows,
                self.cols,
                self.cols
            ))),
        }
    }

    /// `x · Wᵀ` for `x: [..., cols]`, giving `[..., rows]` (a linear layer; each input
    /// row is one matrix-vector product with the stored blocks).
    pub fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        let batch = self.input(x, "qmatmul")?;
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("input has a last dimension") = self.rows;
        let out = Tensor::alloc(&self.device, shape)?;
        let dims = QMatmulDims {
            batch,
            rows: self.rows,
            cols: self.cols,
            accumulate: false,
        };
        self.device.backend().qmatmul(
            &*self.buf,
            self.format,
            &**x.buffer(),
            &**out.buffer(),
            dims,
        )?;
        Ok(out)
    }

    /// A SwiGLU feed-forward gate: `silu(x·Wᵀ) · (x·Upᵀ)` with `self` the gate matrix and
    /// `up` of the same shape and format.
    pub fn swiglu(&self, up: &QuantMatrix, x: &Tensor) -> Result<Tensor> {
        if (up.format, up.rows, up.cols) != (self.format, self.rows, self.cols)
            || up.device != self.device
        {
            return Err(Error::shape(format!(
                "swiglu: gate {self:?} and up {up:?} differ"
            )));
        }
        let batch = self.input(x, "qmatmul_swiglu")?;
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("input has a last dimension") = self.rows;
        let out = Tensor::alloc(&self.device, shape)?;
        let dims = QMatmulDims {
            batch,
            rows: self.rows,
            cols: self.cols,
            accumulate: false,
        };
        self.device.backend().qmatmul_swiglu(
            &*self.buf,
            &*up.buf,
            self.format,
            &**x.buffer(),
            &**out.buffer(),
            dims,
        )?;
        Ok(out)
    }

    /// The rows `ids` names (a `u32` tensor of any shape), decoded to f32: shape
    /// `ids.shape() + [cols]`. An id past the table is [`Error::InvalidArgument`].
    ///
    /// ```
    /// use ringkernel::compute::{Device, QuantMatrix, Tensor, WeightFormat};
    /// let dev = Device::cpu();
    /// let table: Vec<f32> = (0..3 * 32).map(|i| i as f32).collect();
    /// let t = QuantMatrix::quantize(&dev, WeightFormat::F32, &table, 3, 32)?;
    /// let rows = t.embedding(&Tensor::from_u32(&dev, &[2], &[1])?)?.to_vec()?;
    /// assert_eq!(rows[0], 64.0);
    /// assert!(t.embedding(&Tensor::from_u32(&dev, &[3], &[1])?).is_err());
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.dtype() != DType::U32 {
            return Err(Error::invalid(format!(
                "embedding takes u32 ids, got {}",
                ids.dtype()
            )));
        }
        if ids.device() != &self.device {
            return Err(Error::Device(
                "embedding: ids and table on different devices".into(),
            ));
        }
        let v = ids.to_u32_vec()?;
        if let Some(bad) = v.iter().find(|&&id| id as usize >= self.rows) {
            return Err(Error::invalid(format!(
                "embedding: id {bad} outside the table of {} rows",
                self.rows
            )));
        }
        let mut shape = ids.shape().to_vec();
        shape.push(self.cols);
        let out = Tensor::alloc(&self.device, shape)?;
        let dims = EmbeddingDims {
            rows: self.rows,
            cols: self.cols,
            count: ids.len(),
        };
        checks::embedding(self.format, dims)?;
        self.device.backend().embedding(
            &*self.buf,
            self.format,
            &**ids.buffer(),
            &**out.buffer(),
            dims,
        )?;
        Ok(out)
    }

    /// The whole matrix decoded to an f32 tensor `[rows, cols]` (on the device).
    pub fn dequantize(&self) -> Result<Tensor> {
        let ids: Vec<u32> = (0..self.rows as u32).collect();
        let ids = Tensor::from_u32(&self.device, &ids, &[self.rows])?;
        self.embedding(&ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::compute::reference;
    use crate::core::util::{rel_error, SplitMix64};

    #[test]
    fn matmul_matches_the_exactly_decoded_weights() {
        let dev = Device::cpu();
        let mut rng = SplitMix64::from_entropy();
        for format in WeightFormat::ALL {
            let (rows, cols) = (37, 96);
            let w = rng.vec(rows * cols, -1.0, 1.0);
            let q = QuantMatrix::quantize(&dev, format, &w, rows, cols).unwrap();
            let x = rng.vec(3 * cols, -1.0, 1.0);
            let xt = Tensor::from_slice(&dev, &x, &[3, cols]).unwrap();
            let y = q.matmul(&xt).unwrap();
            assert_eq!(y.shape(), &[3, rows]);
            let words = quant::quantize(format, &w).unwrap();
            let dims = QMatmulDims {
                batch: 3,
                rows,
                cols,
                accumulate: false,
            };
            let want = reference::qmatmul(format, &words, &x, &[], dims);
            assert!(rel_error(&y.to_vec().unwrap(), &want) < 1e-5, "{format}");
            let deq = q.dequantize().unwrap().to_vec().unwrap();
            let exact = quant::dequantize(format, &words, rows * cols).unwrap();
            assert_eq!(deq, exact, "{format}");
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let dev = Device::cpu();
        assert!(matches!(
            QuantMatrix::quantize(&dev, WeightFormat::Q4_1, &[0.0; 40], 1, 40),
            Err(Error::ShapeMismatch(_))
        ));
        let q = QuantMatrix::quantize(&dev, WeightFormat::Q4_1, &[0.5; 64], 2, 32).unwrap();
        let x = Tensor::zeros(&dev, &[4, 31]).unwrap();
        assert!(matches!(q.matmul(&x), Err(Error::ShapeMismatch(_))));
        let h = Tensor::zeros(&dev, &[32])
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        assert!(matches!(q.matmul(&h), Err(Error::InvalidArgument(_))));
        let other = Tensor::zeros(&Device::cpu(), &[32]).unwrap();
        assert!(matches!(q.matmul(&other), Err(Error::Device(_))));
        let fids = Tensor::zeros(&dev, &[1]).unwrap();
        assert!(matches!(q.embedding(&fids), Err(Error::InvalidArgument(_))));
        let wide = QuantMatrix::quantize(&dev, WeightFormat::Q4_1, &[0.5; 128], 2, 64).unwrap();
        assert!(q
            .swiglu(&wide, &Tensor::zeros(&dev, &[32]).unwrap())
            .is_err());
    }
}
