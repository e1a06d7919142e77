//! [`Tensor`]: an array of f32 (or f16, bf16, u32) on a [`Device`], with a method per op.

use super::Device;
use crate::core::compute::dtype;
use crate::core::compute::{
    checks, AttentionDims, BinaryOp, BufferRef, DType, MatmulDims, ReduceDims, ReduceOp, RopeDims,
    UnaryOp,
};
use crate::{Error, Result};
use std::fmt;

/// An immutable, row-major tensor on a [`Device`]: an `Arc`'d device buffer plus a shape
/// and an element type ([`DType`]). Ops return new tensors; the data stays on the device
/// between ops (only [`Tensor::to_vec`] reads it back). Cloning shares the buffer.
///
/// A shape of `[]` is a scalar (one element). Tensors with no elements are refused
/// ([`Error::ShapeMismatch`]), as are shapes whose element count overflows.
///
/// The ops compute in f32: `f16` and `bf16` tensors are storage (half the memory), made
/// with [`Tensor::from_f16_bits`] / [`Tensor::to_dtype`] and converted back with
/// [`Tensor::to_dtype`] on the device; an op given one is [`Error::InvalidArgument`]
/// naming the conversion. `u32` tensors hold ids and positions
/// ([`QuantMatrix::embedding`](super::QuantMatrix::embedding)).
///
/// ```
/// use ringkernel::compute::{Device, Tensor};
/// let dev = Device::cpu();
/// let a = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = Tensor::from_slice(&dev, &[5.0, 6.0, 7.0, 8.0], &[2, 2])?;
/// assert_eq!(a.matmul(&b)?.to_vec()?, vec![19.0, 22.0, 43.0, 50.0]);
/// assert_eq!(a.add(&b)?.sum()?.to_scalar()?, 36.0);
/// # Ok::<(), ringkernel::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    buf: BufferRef,
    device: Device,
    shape: Vec<usize>,
    dtype: DType,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("device", &self.device.kind())
            .finish()
    }
}

/// Element count of `shape`, or [`Error::ShapeMismatch`] for an empty or overflowing
/// shape.
pub(crate) fn numel(shape: &[usize]) -> Result<usize> {
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize / 4)
        .ok_or_else(|| Error::shape(format!("shape {shape:?} has too many elements")))?;
    if n == 0 {
        return Err(Error::shape(format!(
            "shape {shape:?} has no elements; empty tensors are not supported"
        )));
    }
    Ok(n)
}

/// Half-precision bit patterns packed two to a word, the first in the low half.
fn pack_halves(bits: &[u16]) -> Vec<u32> {
    bits.chunks(2)
        .map(|p| u32::from(p[0]) | p.get(1).map_or(0, |&h| u32::from(h) << 16))
        .collect()
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Tensor> {
                self.unary(UnaryOp::$op)
            }
        )*
    };
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                self.binary(BinaryOp::$op, other)
            }
            #[doc = concat!("Like [`Tensor::", stringify!($name), "`] with a scalar right-hand side.")]
            pub fn $scalar(&self, s: f32) -> Result<Tensor> {
                self.binary_scalar(BinaryOp::$op, s)
            }
        )*
    };
}

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $whole:ident, $axis:ident => $op:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            #[doc = "Over the whole tensor: returns a scalar (shape `[]`)."]
            pub fn $whole(&self) -> Result<Tensor> {
                self.reduce(ReduceOp::$op, None)
            }
            $(#[$doc])*
            #[doc = "Along `axis`: returns the shape without that axis."]
            pub fn $axis(&self, axis: usize) -> Result<Tensor> {
                self.reduce(ReduceOp::$op, Some(axis))
            }
        )*
    };
}

impl Tensor {
    /// Uploads `data` as a tensor of `shape` (its element count must equal `data.len()`).
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3])?;
    /// assert_eq!(t.shape(), &[3]);
    /// assert!(Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[2, 2]).is_err());
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn from_slice(device: &Device, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        let n = numel(shape)?;
        if n != data.len() {
            return Err(Error::shape(format!(
                "from_slice: shape {shape:?} holds {n} elements, data has {}",
                data.len()
            )));
        }
        let buf = device.backend().upload(data)?;
        Ok(Tensor {
            buf,
            device: device.clone(),
            shape: shape.to_vec(),
            dtype: DType::F32,
        })
    }

    /// Uploads raw words holding `numel(shape)` elements of `dtype` (see
    /// [`dtype`](crate::core::compute::dtype) for the packing).
    fn from_words(device: &Device, words: &[u32], shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = numel(shape)?;
        if words.len() != dtype.words(n) {
            return Err(Error::shape(format!(
                "shape {shape:?} of {dtype} takes {} words, got {}",
                dtype.words(n),
                words.len()
            )));
        }
        let buf = device.backend().upload(dtype::words_as_f32(words))?;
        Ok(Tensor {
            buf,
            device: device.clone(),
            shape: shape.to_vec(),
            dtype,
        })
    }

    /// A `u32` tensor (token ids, positions).
    ///
    /// ```
    /// use ringkernel::compute::{DType, Device, Tensor};
    /// let ids = Tensor::from_u32(&Device::cpu(), &[3, 1, 4], &[3])?;
    /// assert_eq!(ids.dtype(), DType::U32);
    /// assert_eq!(ids.to_u32_vec()?, vec![3, 1, 4]);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn from_u32(device: &Device, data: &[u32], shape: &[usize]) -> Result<Tensor> {
        Self::from_words(device, data, shape, DType::U32)
    }

    /// An `f16` tensor from the elements' bits (`half::f16::to_bits`).
    ///
    /// ```
    /// use ringkernel::compute::{DType, Device, Tensor};
    /// let t = Tensor::from_f16_bits(&Device::cpu(), &[0x3C00, 0xC000, 0x3800], &[3])?;
    /// assert_eq!(t.to_vec()?, vec![1.0, -2.0, 0.5]);
    /// assert_eq!(t.to_dtype(DType::F32)?.dtype(), DType::F32);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn from_f16_bits(device: &Device, bits: &[u16], shape: &[usize]) -> Result<Tensor> {
        Self::from_words(device, &pack_halves(bits), shape, DType::F16)
    }

    /// A `bf16` tensor from the elements' bits (`half::bf16::to_bits`).
    pub fn from_bf16_bits(device: &Device, bits: &[u16], shape: &[usize]) -> Result<Tensor> {
        Self::from_words(device, &pack_halves(bits), shape, DType::Bf16)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The tensor stored as `dtype`, converted on the device (round to nearest even for
    /// the half types; the same tensor when it already is). Floats convert among
    /// themselves; `u32` only to `u32` ([`Error::InvalidArgument`]).
    ///
    /// ```
    /// use ringkernel::compute::{DType, Device, Tensor};
    /// let x = Tensor::from_slice(&Device::cpu(), &[1.0, 1.0 + 1.0 / 1024.0, 65520.0], &[3])?;
    /// let h = x.to_dtype(DType::F16)?;
    /// assert_eq!(h.to_vec()?, vec![1.0, 1.0 + 1.0 / 1024.0, f32::INFINITY]);
    /// let b = x.to_dtype(DType::Bf16)?;
    /// assert_eq!(b.to_vec()?, vec![1.0, 1.0, 65536.0]);
    /// assert!(Tensor::from_u32(&Device::cpu(), &[1], &[1])?.to_dtype(DType::F32).is_err());
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        checks::convert(self.dtype, dtype, 0)?;
        let n = self.len();
        let out = Tensor::alloc_typed(&self.device, self.shape.clone(), dtype)?;
        self.device
            .backend()
            .convert(&*self.buf, self.dtype, &*out.buf, dtype, n)?;
        Ok(out)
    }

    /// The elements of a `u32` tensor ([`Error::InvalidArgument`] for another type).
    pub fn to_u32_vec(&self) -> Result<Vec<u32>> {
        if self.dtype != DType::U32 {
            return Err(Error::invalid(format!(
                "to_u32_vec on a tensor of {}",
                self.dtype
            )));
        }
        self.words()
    }

    /// The raw words of the buffer (the tensor's elements as stored).
    fn words(&self) -> Result<Vec<u32>> {
        let mut v = vec![0.0f32; self.dtype.words(self.len())];
        self.device.backend().read(&*self.buf, 0, &mut v)?;
        Ok(dtype::f32_as_words(&v).to_vec())
    }

    /// [`Error::InvalidArgument`] unless this is an f32 tensor (what the ops compute on).
    fn need_f32(&self, op: &str) -> Result<()> {
        if self.dtype == DType::F32 {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "{op} computes on f32 tensors, this one is {}: convert it with to_dtype(DType::F32)",
                self.dtype
            )))
        }
    }

    /// A tensor of zeros.
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let z = Tensor::zeros(&Device::cpu(), &[2, 3])?;
    /// assert_eq!(z.to_vec()?, vec![0.0; 6]);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn zeros(device: &Device, shape: &[usize]) -> Result<Tensor> {
        Self::full(device, shape, 0.0)
    }

    /// A tensor with every element `value`.
    pub fn full(device: &Device, shape: &[usize], value: f32) -> Result<Tensor> {
        let n = numel(shape)?;
        Self::from_slice(device, &vec![value; n], shape)
    }

    /// Wraps an existing device buffer of at least `numel(shape)` elements.
    pub fn from_buffer(device: &Device, buf: BufferRef, shape: &[usize]) -> Result<Tensor> {
        let n = numel(shape)?;
        if buf.backend() != device.kind() {
            return Err(Error::Device(format!(
                "buffer of the {} backend on a {} device",
                buf.backend(),
                device.kind()
            )));
        }
        if buf.len() < n {
            return Err(Error::shape(format!(
                "from_buffer: shape {shape:?} needs {n} elements, buffer has {}",
                buf.len()
            )));
        }
        Ok(Tensor {
            buf,
            device: device.clone(),
            shape: shape.to_vec(),
            dtype: DType::F32,
        })
    }

    /// An output of `shape` on `device` whose contents the next op overwrites.
    pub(crate) fn alloc(device: &Device, shape: Vec<usize>) -> Result<Tensor> {
        Self::alloc_typed(device, shape, DType::F32)
    }

    /// [`Tensor::alloc`] of another element type.
    pub(crate) fn alloc_typed(device: &Device, shape: Vec<usize>, dtype: DType) -> Result<Tensor> {
        let n = numel(&shape)?;
        let buf = device.backend().alloc(dtype.words(n))?;
        Ok(Tensor {
            buf,
            device: device.clone(),
            shape,
            dtype,
        })
    }

    fn empty_like(&self, shape: Vec<usize>) -> Result<Tensor> {
        Self::alloc(&self.device, shape)
    }

    /// Reads the data back to the host (waiting for queued work), as f32 (half-precision
    /// elements widened exactly, `u32` ones converted).
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        if self.dtype == DType::F32 {
            let mut v = vec![0.0; self.len()];
            self.device.backend().read(&*self.buf, 0, &mut v)?;
            return Ok(v);
        }
        Ok(dtype::unpack(self.dtype, &self.words()?, self.len()))
    }

    /// The single value of a one-element tensor.
    pub fn to_scalar(&self) -> Result<f32> {
        if self.len() != 1 {
            return Err(Error::shape(format!(
                "to_scalar on a tensor of shape {:?}",
                self.shape
            )));
        }
        Ok(self.to_vec()?[0])
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (never 0).
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Always false: empty tensors cannot be made.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The device holding the data.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device buffer (for calling backend ops directly).
    pub fn buffer(&self) -> &BufferRef {
        &self.buf
    }

    /// The same data under another shape with the same element count (no copy).
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let t = Tensor::zeros(&Device::cpu(), &[2, 6])?;
    /// assert_eq!(t.reshape(&[3, 4])?.shape(), &[3, 4]);
    /// assert!(t.reshape(&[5]).is_err());
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n = numel(shape)?;
        if n != self.len() {
            return Err(Error::shape(format!(
                "reshape {:?} ({} elements) to {shape:?} ({n})",
                self.shape,
                self.len()
            )));
        }
        Ok(Tensor {
            buf: self.buf.clone(),
            device: self.device.clone(),
            shape: shape.to_vec(),
            dtype: self.dtype,
        })
    }

    /// A copy on `device` (the same tensor when it is already there).
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let a = Tensor::from_slice(&Device::cpu(), &[1.0, 2.0], &[2])?;
    /// let other = Device::cpu(); // a distinct device
    /// let b = a.to_device(&other)?;
    /// assert_eq!(b.device(), &other);
    /// assert_eq!(b.to_vec()?, vec![1.0, 2.0]);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if &self.device == device {
            return Ok(self.clone());
        }
        Tensor::from_words(device, &self.words()?, &self.shape, self.dtype)
    }

    /// Both on one device and both f32.
    fn same_device(&self, other: &Tensor, op: &str) -> Result<()> {
        self.need_f32(op)?;
        other.need_f32(op)?;
        if self.device == other.device {
            Ok(())
        } else {
            Err(Error::Device(format!(
                "{op}: tensors on different devices ({} and {}); move one with to_device",
                self.device, other.device
            )))
        }
    }

    fn same_shape(&self, other: &Tensor, op: &str) -> Result<()> {
        self.same_device(other, op)?;
        if self.shape == other.shape {
            Ok(())
        } else {
            Err(Error::shape(format!(
                "{op}: shapes {:?} and {:?} differ",
                self.shape, other.shape
            )))
        }
    }

    /// `op` applied to every element.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        self.need_f32(op.name())?;
        let out = self.empty_like(self.shape.clone())?;
        self.device
            .backend()
            .unary(op, &*self.buf, &*out.buf, self.len())?;
        Ok(out)
    }

    unary_methods! {
        /// −x elementwise.
        neg => Neg,
        /// |x| elementwise.
        abs => Abs,
        /// √x elementwise.
        sqrt => Sqrt,
        /// eˣ elementwise.
        exp => Exp,
        /// ln x elementwise.
        log => Log,
        /// sin x elementwise.
        sin => Sin,
        /// cos x elementwise.
        cos => Cos,
        /// tanh x elementwise.
        tanh => Tanh,
        /// max(x, 0) elementwise.
        relu => Relu,
        /// 1/(1+e⁻ˣ) elementwise.
        sigmoid => Sigmoid,
        /// x·sigmoid(x) elementwise.
        silu => Silu,
        /// GELU (tanh approximation) elementwise.
        gelu => Gelu,
    }

    /// `op(self, other)` elementwise under numpy's broadcasting rules: the shapes are
    /// aligned at their last dimension, and each dimension must be equal or 1 in one of
    /// them (missing leading dimensions count as 1); the result has the larger extent
    /// of each. Shapes that do not broadcast are [`Error::ShapeMismatch`].
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[4])?;
    /// let b = Tensor::from_slice(&dev, &[10.0, 20.0, 30.0, 40.0], &[4])?;
    /// assert_eq!(a.add(&b)?.to_vec()?, vec![11.0, 22.0, 33.0, 44.0]);
    /// assert_eq!(a.maximum_scalar(2.5)?.to_vec()?, vec![2.5, 2.5, 3.0, 4.0]);
    /// // [2, 3] + [3]: the row is added to each row
    /// let m = Tensor::from_slice(&dev, &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[2, 3])?;
    /// let r = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3])?;
    /// assert_eq!(m.add(&r)?.to_vec()?, vec![1.0, 2.0, 3.0, 2.0, 3.0, 4.0]);
    /// // [2, 1] * [1, 3] is an outer product of shape [2, 3]
    /// let c = Tensor::from_slice(&dev, &[1.0, 2.0], &[2, 1])?;
    /// assert_eq!(c.mul(&r.reshape(&[1, 3])?)?.to_vec()?, vec![1.0, 2.0, 3.0, 2.0, 4.0, 6.0]);
    /// assert!(a.add(&b.reshape(&[2, 2])?).is_err()); // [4] and [2, 2] do not broadcast
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        self.same_device(other, op.name())?;
        if self.shape == other.shape {
            let out = self.empty_like(self.shape.clone())?;
            self.device
                .backend()
                .binary(op, &*self.buf, &*other.buf, &*out.buf, self.len())?;
            return Ok(out);
        }
        let (shape, dims) = checks::broadcast(&self.shape, &other.shape)
            .map_err(|e| Error::shape(format!("{}: {e}", op.name())))?;
        let out = self.empty_like(shape)?;
        self.device
            .backend()
            .broadcast_binary(op, &*self.buf, &*other.buf, &*out.buf, &dims)?;
        Ok(out)
    }

    /// `op(self[i], s)`.
    pub fn binary_scalar(&self, op: BinaryOp, s: f32) -> Result<Tensor> {
        self.need_f32(op.name())?;
        let out = self.empty_like(self.shape.clone())?;
        self.device
            .backend()
            .binary_scalar(op, &*self.buf, s, &*out.buf, self.len())?;
        Ok(out)
    }

    binary_methods! {
        /// Elementwise sum.
        add, add_scalar => Add,
        /// Elementwise difference.
        sub, sub_scalar => Sub,
        /// Elementwise product.
        mul, mul_scalar => Mul,
        /// Elementwise quotient.
        div, div_scalar => Div,
        /// Elementwise maximum (`max` is the reduction).
        maximum, maximum_scalar => Max,
        /// Elementwise minimum (`min` is the reduction).
        minimum, minimum_scalar => Min,
    }

    /// Matrix product: `[m, k] × [k, n] → [m, n]`, or batched `[b, m, k] × [b, k, n]`
    /// (or a shared `[k, n]`) `→ [b, m, n]`.
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 1, 3])?;
    /// let w = Tensor::from_slice(&dev, &[1.0, 0.0, 1.0], &[3, 1])?;
    /// assert_eq!(a.matmul(&w)?.shape(), &[2, 1, 1]);
    /// assert_eq!(a.matmul(&w)?.to_vec()?, vec![4.0, 10.0]);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.same_device(other, "matmul")?;
        let bad = || {
            Error::shape(format!(
                "matmul: cannot multiply {:?} by {:?}",
                self.shape, other.shape
            ))
        };
        let (dims, out_shape) = match (self.shape.as_slice(), other.shape.as_slice()) {
            (&[m, k], &[k2, n]) if k == k2 => (
                MatmulDims {
                    batch: 1,
                    m,
                    k,
                    n,
                    b_batched: false,
                },
                vec![m, n],
            ),
            (&[b, m, k], &[b2, k2, n]) if k == k2 && b == b2 => (
                MatmulDims {
                    batch: b,
                    m,
                    k,
                    n,
                    b_batched: true,
                },
                vec![b, m, n],
            ),
            (&[b, m, k], &[k2, n]) if k == k2 => (
                MatmulDims {
                    batch: b,
                    m,
                    k,
                    n,
                    b_batched: false,
                },
                vec![b, m, n],
            ),
            _ => return Err(bad()),
        };
        let out = self.empty_like(out_shape)?;
        self.device
            .backend()
            .matmul(&*self.buf, &*other.buf, &*out.buf, dims)?;
        Ok(out)
    }

    /// Matrix–vector product `[m, k] × [k] → [m]`.
    pub fn matvec(&self, x: &Tensor) -> Result<Tensor> {
        self.same_device(x, "matvec")?;
        let (m, k) = match (self.shape.as_slice(), x.shape.as_slice()) {
            (&[m, k], &[k2]) if k == k2 => (m, k),
            _ => {
                return Err(Error::shape(format!(
                    "matvec: cannot multiply {:?} by {:?}",
                    self.shape, x.shape
                )))
            }
        };
        let out = self.empty_like(vec![m])?;
        self.device
            .backend()
            .matvec(&*self.buf, &*x.buf, &*out.buf, m, k)?;
        Ok(out)
    }

    /// Inner product of two tensors of the same shape; a scalar.
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3])?;
    /// assert_eq!(a.dot(&a)?.to_scalar()?, 14.0);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn dot(&self, other: &Tensor) -> Result<Tensor> {
        self.same_shape(other, "dot")?;
        let out = self.empty_like(vec![])?;
        self.device
            .backend()
            .dot(&*self.buf, &*other.buf, &*out.buf, self.len())?;
        Ok(out)
    }

    /// The flat index of the largest element (the first at a tie; NaNs are passed over),
    /// found on the device: only that index is read back. An empty tensor is an error.
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let t = Tensor::from_slice(&Device::cpu(), &[1.0, 7.0, f32::NAN, 7.0, -2.0, 3.0], &[2, 3])?;
    /// assert_eq!(t.argmax()?, 1);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn argmax(&self) -> Result<usize> {
        self.need_f32("argmax")?;
        let out = self.device.backend().alloc(1)?;
        self.device
            .backend()
            .argmax(&*self.buf, self.len(), &*out)?;
        let mut word = [0f32; 1];
        self.device.backend().read(&*out, 0, &mut word)?;
        Ok(word[0].to_bits() as usize)
    }

    /// Reduction over the whole tensor (`axis = None`, a scalar) or along one axis.
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let t = Tensor::from_slice(&Device::cpu(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// assert_eq!(t.sum_axis(0)?.to_vec()?, vec![5.0, 7.0, 9.0]);
    /// assert_eq!(t.max_axis(1)?.to_vec()?, vec![3.0, 6.0]);
    /// assert_eq!(t.mean()?.to_scalar()?, 3.5);
    /// assert!(t.sum_axis(2).is_err());
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn reduce(&self, op: ReduceOp, axis: Option<usize>) -> Result<Tensor> {
        self.need_f32(op.name())?;
        let (dims, out_shape) = match axis {
            None => (
                ReduceDims {
                    outer: 1,
                    axis: self.len(),
                    inner: 1,
                },
                vec![],
            ),
            Some(a) if a < self.rank() => {
                let outer = self.shape[..a].iter().product();
                let inner = self.shape[a + 1..].iter().product();
                let mut s = self.shape.clone();
                s.remove(a);
                (
                    ReduceDims {
                        outer,
                        axis: self.shape[a],
                        inner,
                    },
                    s,
                )
            }
            Some(a) => {
                return Err(Error::shape(format!(
                    "{}: axis {a} out of range for shape {:?}",
                    op.name(),
                    self.shape
                )))
            }
        };
        let out = self.empty_like(out_shape)?;
        self.device
            .backend()
            .reduce(op, &*self.buf, &*out.buf, dims)?;
        Ok(out)
    }

    reduce_methods! {
        /// Sum.
        sum, sum_axis => Sum,
        /// Maximum.
        max, max_axis => Max,
        /// Minimum.
        min, min_axis => Min,
        /// Arithmetic mean.
        mean, mean_axis => Mean,
    }

    /// `(rows, cols)` seeing the tensor as rows of its last dimension.
    fn rows_cols(&self, op: &str) -> Result<(usize, usize)> {
        self.need_f32(op)?;
        match self.shape.last() {
            Some(&c) => Ok((self.len() / c, c)),
            None => Err(Error::shape(format!(
                "{op} needs at least one dimension, got a scalar"
            ))),
        }
    }

    fn check_vector(&self, v: &Tensor, cols: usize, op: &str, what: &str) -> Result<()> {
        self.same_device(v, op)?;
        if v.shape != [cols] {
            return Err(Error::shape(format!(
                "{op}: {what} has shape {:?}, want [{cols}]",
                v.shape
            )));
        }
        Ok(())
    }

    /// Numerically stable softmax over the last dimension.
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let t = Tensor::from_slice(&Device::cpu(), &[1000.0, 1000.0], &[1, 2])?;
    /// assert_eq!(t.softmax()?.to_vec()?, vec![0.5, 0.5]);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn softmax(&self) -> Result<Tensor> {
        let (rows, cols) = self.rows_cols("softmax")?;
        let out = self.empty_like(self.shape.clone())?;
        self.device
            .backend()
            .softmax(&*self.buf, &*out.buf, rows, cols)?;
        Ok(out)
    }

    /// RMSNorm over the last dimension: `x / √(mean(x²) + eps) · weight`, with
    /// `weight` of shape `[last dim]`.
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_slice(&dev, &[3.0, 4.0], &[1, 2])?;
    /// let w = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])?;
    /// let y = x.rms_norm(&w, 0.0)?.to_vec()?;
    /// let r = (12.5f32).sqrt();
    /// assert!((y[0] - 3.0 / r).abs() < 1e-6 && (y[1] - 8.0 / r).abs() < 1e-6);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn rms_norm(&self, weight: &Tensor, eps: f32) -> Result<Tensor> {
        let (rows, cols) = self.rows_cols("rms_norm")?;
        self.check_vector(weight, cols, "rms_norm", "weight")?;
        let out = self.empty_like(self.shape.clone())?;
        self.device
            .backend()
            .rms_norm(&*self.buf, &*weight.buf, &*out.buf, rows, cols, eps)?;
        Ok(out)
    }

    /// LayerNorm over the last dimension (biased variance), `weight` and `bias` of shape
    /// `[last dim]`.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
        let (rows, cols) = self.rows_cols("layer_norm")?;
        self.check_vector(weight, cols, "layer_norm", "weight")?;
        self.check_vector(bias, cols, "layer_norm", "bias")?;
        let out = self.empty_like(self.shape.clone())?;
        self.device.backend().layer_norm(
            &*self.buf,
            &*weight.buf,
            &*bias.buf,
            &*out.buf,
            rows,
            cols,
            eps,
        )?;
        Ok(out)
    }

    /// Rotary position embedding (half-split layout) of `self: [seq, heads, head_dim]`
    /// with `positions: [seq]` (as f32) and frequency base `base` (10000 in most models).
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_slice(&dev, &[1.0, 0.0], &[1, 1, 2])?;
    /// let p = Tensor::from_slice(&dev, &[std::f32::consts::PI], &[1])?;
    /// let y = x.rope(&p, 10000.0)?.to_vec()?;
    /// assert!((y[0] + 1.0).abs() < 1e-6 && y[1].abs() < 1e-6);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn rope(&self, positions: &Tensor, base: f32) -> Result<Tensor> {
        self.need_f32("rope")?;
        let (seq, heads, head_dim) = match self.shape.as_slice() {
            &[s, h, d] if d % 2 == 0 => (s, h, d),
            _ => {
                return Err(Error::shape(format!(
                    "rope: want [seq, heads, even head_dim], got {:?}",
                    self.shape
                )))
            }
        };
        self.check_vector(positions, seq, "rope", "positions")?;
        let out = self.empty_like(self.shape.clone())?;
        let dims = RopeDims {
            seq,
            heads,
            head_dim,
            base,
        };
        self.device
            .backend()
            .rope(&*self.buf, &*positions.buf, &*out.buf, dims)?;
        Ok(out)
    }

    /// Attention dims for `self: [bh, q_len, d]` against `k, v: [bh, kv_len, d]`.
    fn attention_dims(&self, k: &Tensor, causal: bool, op: &str) -> Result<AttentionDims> {
        self.same_device(k, op)?;
        match (self.shape.as_slice(), k.shape.as_slice()) {
            (&[bh, q_len, d], &[bh2, kv_len, d2]) if bh == bh2 && d == d2 && (!causal || q_len <= kv_len) => Ok(AttentionDims {
                batch_heads: bh,
                q_len,
                kv_len,
                kv_stride: kv_len,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                causal,
                q_offset: kv_len - q_len.min(kv_len),
            }),
            _ => Err(Error::shape(format!(
                "{op}: want q [bh, q_len, d] and k/v [bh, kv_len, d] (kv_len ≥ q_len when causal), got {:?} and {:?}",
                self.shape, k.shape
            ))),
        }
    }

    /// Attention scores `Q·Kᵀ/√d` of `self: [bh, q_len, d]` and `k: [bh, kv_len, d]`, as
    /// `[bh, q_len, kv_len]`. With `causal`, the queries are the last `q_len` positions
    /// (query `i` sits at `kv_len − q_len + i`) and later keys score `−∞`.
    pub fn attention_scores(&self, k: &Tensor, causal: bool) -> Result<Tensor> {
        let dims = self.attention_dims(k, causal, "attention_scores")?;
        let out = self.empty_like(vec![dims.batch_heads, dims.q_len, dims.kv_len])?;
        self.device
            .backend()
            .attention_scores(&*self.buf, &*k.buf, &*out.buf, dims)?;
        Ok(out)
    }

    /// `P·V` for probabilities `self: [bh, q_len, kv_len]` and `v: [bh, kv_len, d]`.
    pub fn attention_weighted_sum(&self, v: &Tensor) -> Result<Tensor> {
        self.same_device(v, "attention_weighted_sum")?;
        let dims = match (self.shape.as_slice(), v.shape.as_slice()) {
            (&[bh, q_len, kv_len], &[bh2, kv2, d]) if bh == bh2 && kv_len == kv2 => AttentionDims {
                batch_heads: bh,
                q_len,
                kv_len,
                kv_stride: kv_len,
                head_dim: d,
                scale: 1.0,
                causal: false,
                q_offset: 0,
            },
            _ => {
                return Err(Error::shape(format!(
                    "attention_weighted_sum: want p [bh, q_len, kv_len] and v [bh, kv_len, d], got {:?} and {:?}",
                    self.shape, v.shape
                )))
            }
        };
        let out = self.empty_like(vec![dims.batch_heads, dims.q_len, dims.head_dim])?;
        self.device
            .backend()
            .attention_weighted_sum(&*self.buf, &*v.buf, &*out.buf, dims)?;
        Ok(out)
    }

    /// Fused scaled-dot-product attention `softmax(Q·Kᵀ/√d [+ causal mask])·V` of
    /// `self: [bh, q_len, d]` with `k, v: [bh, kv_len, d]`; causal as in
    /// [`Tensor::attention_scores`].
    ///
    /// ```
    /// use ringkernel::compute::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let q = Tensor::from_slice(&dev, &[1.0, 1.0], &[1, 2, 1])?;
    /// let k = Tensor::from_slice(&dev, &[0.0, 0.0], &[1, 2, 1])?;
    /// let v = Tensor::from_slice(&dev, &[2.0, 4.0], &[1, 2, 1])?;
    /// // the first query sees only the first key; the second sees both equally
    /// assert_eq!(q.attention(&k, &v, true)?.to_vec()?, vec![2.0, 3.0]);
    /// # Ok::<(), ringkernel::Error>(())
    /// ```
    pub fn attention(&self, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
        let dims = self.attention_dims(k, causal, "attention")?;
        if v.shape != k.shape {
            return Err(Error::shape(format!(
                "attention: k {:?} and v {:?} differ",
                k.shape, v.shape
            )));
        }
        self.same_device(v, "attention")?;
        let out = self.empty_like(self.shape.clone())?;
        self.device
            .backend()
            .attention(&*self.buf, &*k.buf, &*v.buf, &*out.buf, dims)?;
        Ok(out)
    }

    /// SwiGLU `silu(self) · up`, same shapes.
    pub fn swiglu(&self, up: &Tensor) -> Result<Tensor> {
        self.same_shape(up, "swiglu")?;
        let out = self.empty_like(self.shape.clone())?;
        self.device
            .backend()
            .swiglu(&*self.buf, &*up.buf, &*out.buf, self.len())?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::compute::reference;
    use crate::core::util::{rel_error, SplitMix64};

    fn dev() -> Device {
        Device::cpu()
    }

    #[test]
    fn bad_shapes_are_shape_mismatches() {
        let d = dev();
        let a = Tensor::zeros(&d, &[2, 3]).unwrap();
        let b = Tensor::zeros(&d, &[3, 2]).unwrap();
        let shape_err = |r: Result<Tensor>| matches!(r, Err(Error::ShapeMismatch(_)));
        assert!(shape_err(Tensor::from_slice(&d, &[1.0; 5], &[2, 3])));
        assert!(shape_err(Tensor::from_slice(&d, &[], &[0])));
        assert!(shape_err(Tensor::zeros(&d, &[usize::MAX, 2])));
        assert!(shape_err(Tensor::zeros(&d, &[1 << 40, 1 << 30])));
        assert!(shape_err(a.add(&b)));
        assert!(shape_err(a.matmul(&a)));
        assert!(a.matmul(&b).is_ok());
        assert!(shape_err(a.matvec(&Tensor::zeros(&d, &[2]).unwrap())));
        assert!(shape_err(a.sum_axis(2)));
        assert!(shape_err(
            a.rms_norm(&Tensor::zeros(&d, &[2]).unwrap(), 1e-5)
        ));
        assert!(shape_err(
            Tensor::zeros(&d, &[2, 2, 3])
                .unwrap()
                .rope(&Tensor::zeros(&d, &[2]).unwrap(), 1e4)
        ));
        assert!(shape_err(
            Tensor::zeros(&d, &[1, 3, 4])
                .unwrap()
                .attention_scores(&Tensor::zeros(&d, &[1, 2, 4]).unwrap(), true)
        ));
        assert!(shape_err(Tensor::zeros(&d, &[]).unwrap().softmax()));
        assert!(shape_err(a.reshape(&[7])));
        assert!(shape_err(a.to_scalar().map(|_| a.clone())));
    }

    #[test]
    fn half_tensors_are_storage_and_convert_on_the_device() {
        let d = dev();
        let x = Tensor::from_slice(&d, &[0.1, -2.5, 3.0e5, 1e-6, 7.0], &[5]).unwrap();
        let h = x.to_dtype(DType::F16).unwrap();
        assert_eq!((h.dtype(), h.shape()), (DType::F16, &[5][..]));
        assert_eq!(h.buffer().len(), 3, "two f16 per word");
        let back = h.to_dtype(DType::F32).unwrap().to_vec().unwrap();
        assert_eq!(back, h.to_vec().unwrap());
        assert_eq!(back[4], 7.0);
        assert_eq!(back[2], f32::INFINITY);
        assert!((back[0] - 0.1).abs() < 1e-4);
        // ops refuse half tensors with the conversion to use
        let e = h.exp().unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(ref m) if m.contains("to_dtype")),
            "{e}"
        );
        assert!(h.add(&x).is_err());
        // a copy keeps the type
        let moved = h.to_device(&Device::cpu()).unwrap();
        assert_eq!(moved.dtype(), DType::F16);
        assert_eq!(moved.to_vec().unwrap(), h.to_vec().unwrap());
        let ids = Tensor::from_u32(&d, &[7, 8], &[2]).unwrap();
        assert!(ids.to_dtype(DType::F16).is_err());
        assert!(matches!(
            Tensor::from_u32(&d, &[1, 2, 3], &[2]),
            Err(Error::ShapeMismatch(_))
        ));
    }

    #[test]
    fn binary_ops_broadcast_like_numpy() {
        let d = dev();
        let mut rng = SplitMix64::from_entropy();
        for (sa, sb, want) in [
            (&[2, 3][..], &[3][..], &[2, 3][..]),
            (&[4, 1, 5], &[3, 1], &[4, 3, 5]),
            (&[1], &[2, 2], &[2, 2]),
            (&[], &[3], &[3]),
        ] {
            let a = rng.vec(sa.iter().product(), -1.0, 1.0);
            let b = rng.vec(sb.iter().product(), 0.5, 1.0);
            let (ta, tb) = (
                Tensor::from_slice(&d, &a, sa).unwrap(),
                Tensor::from_slice(&d, &b, sb).unwrap(),
            );
            let got = ta.div(&tb).unwrap();
            assert_eq!(got.shape(), want);
            let (_, dims) = checks::broadcast(sa, sb).unwrap();
            let r = reference::broadcast_binary(BinaryOp::Div, &a, &b, &dims);
            assert!(
                rel_error(&got.to_vec().unwrap(), &r) < 1e-6,
                "{sa:?} {sb:?}"
            );
        }
        let a = Tensor::zeros(&d, &[2, 3]).unwrap();
        for bad in [&[2][..], &[3, 3], &[4, 2, 2]] {
            let b = Tensor::zeros(&d, bad).unwrap();
            assert!(matches!(a.add(&b), Err(Error::ShapeMismatch(_))), "{bad:?}");
        }
    }

    #[test]
    fn tensors_on_different_devices_do_not_mix() {
        let a = Tensor::zeros(&dev(), &[4]).unwrap();
        let b = Tensor::zeros(&dev(), &[4]).unwrap();
        assert!(matches!(a.add(&b), Err(Error::Device(_))));
        assert!(a.add(&b.to_device(a.device()).unwrap()).is_ok());
    }

    #[test]
    fn reductions_along_every_axis_match_the_reference() {
        let d = dev();
        let mut rng = SplitMix64::from_entropy();
        let shape = [3, 7, 5, 2];
        let x = rng.vec(210, -1.0, 1.0);
        let t = Tensor::from_slice(&d, &x, &shape).unwrap();
        for op in ReduceOp::ALL {
            for axis in 0..4 {
                let outer: usize = shape[..axis].iter().product();
                let inner: usize = shape[axis + 1..].iter().product();
                let want = reference::reduce(
                    op,
                    &x,
                    ReduceDims {
                        outer,
                        axis: shape[axis],
                        inner,
                    },
                );
                let got = t.reduce(op, Some(axis)).unwrap();
                let mut s = shape.to_vec();
                s.remove(axis);
                assert_eq!(got.shape(), &s[..]);
                assert!(
                    rel_error(&got.to_vec().unwrap(), &want) < 1e-6,
                    "{} axis {axis}",
                    op.name()
                );
            }
            let whole = t.reduce(op, None).unwrap();
            assert_eq!(whole.shape(), &[] as &[usize]);
            let want = reference::reduce(
                op,
                &x,
                ReduceDims {
                    outer: 1,
                    axis: 210,
                    inner: 1,
                },
            );
            assert!(rel_error(&whole.to_vec().unwrap(), &want) < 1e-5);
        }
    }

    #[test]
    fn chained_ops_match_the_reference() {
        let d = dev();
        let mut rng = SplitMix64::from_entropy();
        let (m, k, n) = (7, 33, 5);
        let a = rng.vec(m * k, -1.0, 1.0);
        let b = rng.vec(k * n, -1.0, 1.0);
        let ta = Tensor::from_slice(&d, &a, &[m, k]).unwrap();
        let tb = Tensor::from_slice(&d, &b, &[k, n]).unwrap();
        let got = ta.matmul(&tb).unwrap().gelu().unwrap().softmax().unwrap();
        let mm = reference::matmul(
            &a,
            &b,
            MatmulDims {
                batch: 1,
                m,
                k,
                n,
                b_batched: false,
            },
        );
        let want = reference::softmax(&reference::unary(UnaryOp::Gelu, &mm), m, n);
        assert!(rel_error(&got.to_vec().unwrap(), &want) < 1e-5);
        // batched with a shared right-hand side
        let a3 = rng.vec(3 * m * k, -1.0, 1.0);
        let t3 = Tensor::from_slice(&d, &a3, &[3, m, k]).unwrap();
        let got = t3.matmul(&tb).unwrap();
        assert_eq!(got.shape(), &[3, m, n]);
        let want = reference::matmul(
            &a3,
            &b,
            MatmulDims {
                batch: 3,
                m,
                k,
                n,
                b_batched: false,
            },
        );
        assert!(rel_error(&got.to_vec().unwrap(), &want) < 1e-5);
    }

    #[test]
    fn attention_methods_match_the_reference() {
        let d = dev();
        let mut rng = SplitMix64::from_entropy();
        let (bh, ql, kl, hd) = (3, 4, 9, 8);
        let q = rng.vec(bh * ql * hd, -1.0, 1.0);
        let k = rng.vec(bh * kl * hd, -1.0, 1.0);
        let v = rng.vec(bh * kl * hd, -1.0, 1.0);
        let (tq, tk, tv) = (
            Tensor::from_slice(&d, &q, &[bh, ql, hd]).unwrap(),
            Tensor::from_slice(&d, &k, &[bh, kl, hd]).unwrap(),
            Tensor::from_slice(&d, &v, &[bh, kl, hd]).unwrap(),
        );
        let dims = AttentionDims {
            batch_heads: bh,
            q_len: ql,
            kv_len: kl,
            kv_stride: kl,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            causal: true,
            q_offset: kl - ql,
        };
        let want = reference::attention(&q, &k, &v, dims);
        let fused = tq.attention(&tk, &tv, true).unwrap();
        assert!(rel_error(&fused.to_vec().unwrap(), &want) < 1e-5);
        let unfused = tq
            .attention_scores(&tk, true)
            .unwrap()
            .softmax()
            .unwrap()
            .attention_weighted_sum(&tv)
            .unwrap();
        assert!(rel_error(&unfused.to_vec().unwrap(), &want) < 1e-5);
    }
}
