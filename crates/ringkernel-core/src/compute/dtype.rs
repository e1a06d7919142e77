//! Element types of device buffers, and their host-side conversions.
//!
//! A [`DeviceBuffer`](super::DeviceBuffer) holds 32-bit words. An `f32` or `u32` tensor
//! puts one element in each word; `f16` and `bf16` tensors pack two elements per word,
//! element `2w` in the low half of word `w` and element `2w + 1` in the high half (the
//! little-endian byte order of a plain `[u16]` array). The padding half of the last word
//! of an odd-length half-precision buffer is written as zero.
//!
//! Conversions round to nearest, ties to even, on every backend (the same results
//! bit for bit): an `f32` beyond the `f16` range becomes ±∞, NaN stays NaN.
//!
//! ```
//! use ringkernel_core::compute::dtype::{self, DType};
//! assert_eq!(DType::F16.words(5), 3);
//! let words = dtype::pack(DType::F16, &[1.0, -2.0, 0.5]);
//! assert_eq!(words, vec![0xC000_3C00, 0x0000_3800]);
//! assert_eq!(dtype::unpack(DType::F16, &words, 3), vec![1.0, -2.0, 0.5]);
//! // bf16 keeps f32's range: 1e30 survives, rounded to 8 significant bits
//! let b = dtype::unpack(DType::Bf16, &dtype::pack(DType::Bf16, &[1e30]), 1)[0];
//! assert!((b / 1e30 - 1.0).abs() < 1.0 / 256.0);
//! ```

use half::{bf16, f16};

/// The element type of a tensor's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE-754 binary32, one element per word.
    F32,
    /// IEEE-754 binary16, two elements per word.
    F16,
    /// bfloat16 (the upper half of an f32), two elements per word.
    Bf16,
    /// Unsigned 32-bit integers (token ids, positions), one element per word.
    U32,
}

impl DType {
    /// Every type.
    pub const ALL: [DType; 4] = [DType::F32, DType::F16, DType::Bf16, DType::U32];

    /// Lower-case name (`f32`, `f16`, `bf16`, `u32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::U32 => "u32",
        }
    }

    /// Numeric code shared with GPU kernels (0 f32, 1 f16, 2 bf16, 3 u32).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// Whether it is a floating-point type (everything but `U32`).
    pub fn is_float(self) -> bool {
        self != DType::U32
    }

    /// 32-bit words that `n` elements occupy.
    pub fn words(self, n: usize) -> usize {
        match self {
            DType::F32 | DType::U32 => n,
            DType::F16 | DType::Bf16 => n.div_ceil(2),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` rounded to f16, as bits.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// The f16 with bits `h`, exactly, as f32.
pub fn f16_bits_to_f32(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

/// `x` rounded to bf16, as bits.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// The bf16 with bits `h`, exactly, as f32.
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    bf16::from_bits(h).to_f32()
}

/// `values` stored as `ty` (rounded for the half types; `U32` takes each value's
/// integer part, saturating).
pub fn pack(ty: DType, values: &[f32]) -> Vec<u32> {
    match ty {
        DType::F32 => values.iter().map(|v| v.to_bits()).collect(),
        DType::U32 => values.iter().map(|&v| v as u32).collect(),
        DType::F16 | DType::Bf16 => {
            let half = |v: f32| -> u32 {
                u32::from(if ty == DType::F16 {
                    f32_to_f16_bits(v)
                } else {
                    f32_to_bf16_bits(v)
                })
            };
            values
                .chunks(2)
                .map(|p| half(p[0]) | p.get(1).map_or(0, |&v| half(v) << 16))
                .collect()
        }
    }
}

/// The first `n` elements of `words` (stored as `ty`) as f32 (`U32` values converted).
/// Panics if `words` holds fewer than `ty.words(n)` words.
pub fn unpack(ty: DType, words: &[u32], n: usize) -> Vec<f32> {
    (0..n).map(|i| element(ty, words, i)).collect()
}

/// Element `i` of `words` (stored as `ty`) as f32.
pub fn element(ty: DType, words: &[u32], i: usize) -> f32 {
    match ty {
        DType::F32 => f32::from_bits(words[i]),
        DType::U32 => words[i] as f32,
        DType::F16 | DType::Bf16 => {
            let h = (words[i / 2] >> (16 * (i % 2))) as u16;
            if ty == DType::F16 {
                f16_bits_to_f32(h)
            } else {
                bf16_bits_to_f32(h)
            }
        }
    }
}

/// Words as the f32 slots a [`ComputeBackend`](super::ComputeBackend) uploads: the same
/// bits (no float arithmetic touches them on the way).
pub fn words_as_f32(words: &[u32]) -> &[f32] {
    bytemuck::cast_slice(words)
}

/// f32 slots read from a device buffer as words (the same bits).
pub fn f32_as_words(values: &[f32]) -> &[u32] {
    bytemuck::cast_slice(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_types_round_to_nearest_even_and_keep_specials() {
        // 1 + 2^-11 is halfway between f16 1.0 and its successor: ties to even (1.0)
        assert_eq!(f32_to_f16_bits(1.0 + f32::powi(2.0, -11)), 0x3C00);
        // just above halfway rounds up
        assert_eq!(f32_to_f16_bits(1.0 + f32::powi(2.0, -11) * 1.5), 0x3C01);
        assert_eq!(f32_to_f16_bits(70000.0), 0x7C00); // overflow to +inf
        assert_eq!(f32_to_f16_bits(-1e-9), 0x8000); // underflow to -0
        assert!(f16_bits_to_f32(f32_to_f16_bits(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7F80);
    }

    #[test]
    fn pack_unpack_round_trip_and_pad_odd_lengths() {
        let v = [0.5f32, -3.25, 1024.0];
        for ty in [DType::F32, DType::F16, DType::Bf16] {
            let w = pack(ty, &v);
            assert_eq!(w.len(), ty.words(3));
            assert_eq!(unpack(ty, &w, 3), v);
        }
        assert_eq!(pack(DType::F16, &v)[1] >> 16, 0);
        assert_eq!(pack(DType::U32, &[7.9, 3.0]), vec![7, 3]);
        assert_eq!(words_as_f32(&[0x3F80_0000])[0], 1.0);
        assert_eq!(f32_as_words(&[1.0])[0], 0x3F80_0000);
    }
}
