//! [`GpuType`]: plain-data structs whose layout is the same in Rust and in WGSL.
//!
//! Implement it with `#[derive(GpuType)]` from `ringkernel-derive` (re-exported by the
//! `ringkernel` facade). The derive checks at compile time that the struct can be
//! shared bit for bit with a WGSL shader through a storage buffer, and writes the WGSL
//! declaration of the struct ([`GpuType::WGSL_STRUCT`]).
//!
//! # Layout rules
//!
//! WGSL lays a struct out in the storage address space by these rules (WGSL spec,
//! "Memory Layout"): every member is placed at the next offset that is a multiple of
//! its alignment, and the struct's size is rounded up to its largest member alignment.
//! The derive accepts exactly the field types whose WGSL form has a fixed, known
//! layout, so the Rust `#[repr(C)]` layout can be checked against it:
//!
//! | Rust field      | WGSL member       | size | align |
//! |-----------------|-------------------|------|-------|
//! | `u32`           | `u32`             | 4    | 4     |
//! | `i32`           | `i32`             | 4    | 4     |
//! | `f32`           | `f32`             | 4    | 4     |
//! | `u64`           | `vec2<u32>`       | 8    | 8     |
//! | `i64`           | `vec2<i32>`       | 8    | 8     |
//! | `[T; N]` of the above | `array<T', N>` | N × size(T) | align(T) |
//!
//! * 64-bit integers become two 32-bit words, low word first (WGSL has no 64-bit
//!   integers in the core language); the shader reassembles them.
//! * `f64` is rejected at compile time: WGSL has no `f64`.
//! * `bool`, 8- and 16-bit integers, `usize`/`isize`, pointers and nested structs are
//!   rejected: they have no host-shareable WGSL form of the same layout.
//! * Array lengths must be integer literals (the WGSL text needs the number).
//! * No generics, and no padding anywhere: every field must start at the offset WGSL
//!   gives it and the struct's size must be the WGSL size, so for example a `u64` after
//!   a single `u32` fails to compile (padding bytes are not data); reorder the fields or
//!   add an explicit `u32` pad field. The error names the field to add.
//!
//! # With or without `#[repr(C)]`
//!
//! * `#[repr(C)]`: the Rust layout is fixed, the derive checks every field's
//!   `offset_of!` and the size against WGSL at compile time and implements
//!   `bytemuck::Pod`; the bytes of the value are its WGSL form (slices of it can be cast
//!   with `bytemuck::cast_slice`).
//! * No `repr`: Rust may reorder the fields in memory, so the derive does not rely on
//!   the Rust layout at all. It computes the WGSL offsets itself, publishes them in
//!   [`GpuType::FIELDS`] and [`GpuType::SIZE`], and [`GpuType::write_bytes`] /
//!   [`GpuType::read_bytes`] copy field by field at those offsets. The struct does not
//!   need to be `Copy`. Use [`GpuType::to_bytes`] / [`GpuType::slice_to_bytes`] to fill
//!   a buffer.
//!
//! ```ignore
//! #[derive(Clone, Copy, GpuType)]
//! #[repr(C)]
//! struct Particle { id: u64, pos: [f32; 3], mass: f32 }
//! assert_eq!(Particle::WGSL_STRUCT,
//!     "struct Particle {\n    id: vec2<u32>,\n    pos: array<f32, 3>,\n    mass: f32,\n}\n");
//!
//! #[derive(GpuType)] // no repr(C), no Copy: encoded field by field
//! struct Matrix4x4 { data: [f32; 16] }
//! assert_eq!((Matrix4x4::SIZE, Matrix4x4::ALIGN), (64, 4));
//! let bytes = Matrix4x4 { data: [1.0; 16] }.to_bytes();
//! ```

use crate::error::{Error, Result};

/// A struct with a fixed, documented byte layout that a WGSL shader reads through a
/// storage buffer.
///
/// Derive it (`#[derive(GpuType)]`); the derive checks the layout at compile time. A
/// `#[repr(C)]` struct is also `bytemuck::Pod` and its bytes are its memory; a struct
/// without `#[repr(C)]` is encoded field by field at the WGSL offsets
/// ([`GpuType::write_bytes`]). A hand-written implementation must keep the constants
/// and the two methods true to each other.
pub trait GpuType: Sized + Send + Sync + 'static {
    /// The struct's name in WGSL (the Rust type name).
    const WGSL_NAME: &'static str;
    /// The WGSL declaration `struct Name { field: type, ... }`, ready to paste into a
    /// shader.
    const WGSL_STRUCT: &'static str;
    /// Size in bytes of the WGSL form (for a `#[repr(C)]` struct also its Rust size).
    const SIZE: usize;
    /// Alignment in bytes in WGSL (the largest member alignment).
    const ALIGN: usize;
    /// Every field with its byte offset in the WGSL form, in declaration order.
    const FIELDS: &'static [(&'static str, usize)];

    /// Writes the WGSL form of `self` into `out`, which must be exactly
    /// [`GpuType::SIZE`] bytes ([`Error::InvalidArgument`] otherwise).
    fn write_bytes(&self, out: &mut [u8]) -> Result<()>;

    /// Reads a value from its WGSL form (`bytes.len() == SIZE`, else
    /// [`Error::InvalidArgument`]).
    fn read_bytes(bytes: &[u8]) -> Result<Self>;

    /// The WGSL form of `self` as a new buffer of [`GpuType::SIZE`] bytes.
    fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; Self::SIZE];
        // The buffer has exactly SIZE bytes, the only error case.
        if let Err(e) = self.write_bytes(&mut v) {
            unreachable!("GpuType::write_bytes into SIZE bytes failed: {e}");
        }
        v
    }

    /// The WGSL form of a slice of values, back to back (a WGSL `array<Name>`: the
    /// size is a multiple of the alignment, so there is no stride padding).
    fn slice_to_bytes(items: &[Self]) -> Vec<u8> {
        let mut v = vec![0u8; Self::SIZE * items.len()];
        for (item, out) in items.iter().zip(v.chunks_exact_mut(Self::SIZE.max(1))) {
            if let Err(e) = item.write_bytes(out) {
                unreachable!("GpuType::write_bytes into SIZE bytes failed: {e}");
            }
        }
        v
    }
}

/// [`Error::InvalidArgument`] unless `len` is `T::SIZE` (used by the derived
/// [`GpuType::write_bytes`]/[`GpuType::read_bytes`]).
pub fn check_len<T: GpuType>(len: usize) -> Result<()> {
    if len == T::SIZE {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{} bytes cannot hold a {} ({} bytes in WGSL)",
            len,
            T::WGSL_NAME,
            T::SIZE
        )))
    }
}

/// Marker behind the derives' plain-data field check: implemented for every
/// `bytemuck::Pod` type, with an error message that says what went wrong when a field
/// is not plain data. Not meant to be implemented or named by users.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not plain data (`bytemuck::Pod`), so it cannot be a field of a RingMessage or GpuType",
    label = "not plain data",
    note = "fields must be integers, floats, arrays of them or other plain-data structs; references, pointers, bool, char and heap types are not"
)]
pub trait PlainField: bytemuck::Pod {}

impl<T: bytemuck::Pod> PlainField for T {}

/// Rounds `offset` up to a multiple of `align` (a power of two). Used by the derive's
/// compile-time layout checks.
pub const fn round_up(offset: usize, align: usize) -> usize {
    (offset + align - 1) & !(align - 1)
}

/// The layout WGSL gives a struct: member offsets, size and alignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgslLayout {
    /// Struct name.
    pub name: String,
    /// `(member, offset)` in declaration order.
    pub fields: Vec<(String, usize)>,
    /// Size in bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
}

/// Size and alignment of a WGSL member type of the subset [`GpuType`] uses.
fn member_layout(ty: &str) -> Result<(usize, usize)> {
    let ty = ty.trim();
    match ty {
        "u32" | "i32" | "f32" => return Ok((4, 4)),
        "vec2<u32>" | "vec2<i32>" | "vec2<f32>" => return Ok((8, 8)),
        _ => {}
    }
    if let Some(inner) = ty.strip_prefix("array<").and_then(|t| t.strip_suffix('>')) {
        let (elem, n) = inner
            .rsplit_once(',')
            .ok_or_else(|| Error::invalid(format!("WGSL array without a length: {ty}")))?;
        let n: usize = n
            .trim()
            .parse()
            .map_err(|_| Error::invalid(format!("WGSL array length is not a number: {ty}")))?;
        let (size, align) = member_layout(elem)?;
        // Array stride is the element size rounded up to its alignment.
        return Ok((round_up(size, align) * n, align));
    }
    Err(Error::invalid(format!(
        "WGSL type {ty:?} is outside the GpuType subset"
    )))
}

/// Computes the storage-buffer layout of one WGSL struct declaration of the subset
/// that [`GpuType::WGSL_STRUCT`] uses (scalars, `vec2` and fixed-size arrays of them),
/// following the WGSL rules independently of the Rust side, so tests can compare the
/// two. [`Error::InvalidArgument`] for text outside the subset.
///
/// ```
/// use ringkernel_core::gpu_type::wgsl_struct_layout;
/// let l = wgsl_struct_layout("struct S {\n  a: u32,\n  b: u32,\n  c: vec2<u32>,\n}").unwrap();
/// assert_eq!(l.fields, vec![("a".into(), 0), ("b".into(), 4), ("c".into(), 8)]);
/// assert_eq!((l.size, l.align), (16, 8));
/// ```
pub fn wgsl_struct_layout(decl: &str) -> Result<WgslLayout> {
    let decl = decl.trim();
    let rest = decl
        .strip_prefix("struct")
        .ok_or_else(|| Error::invalid("a WGSL struct declaration starts with `struct`"))?;
    let open = rest
        .find('{')
        .ok_or_else(|| Error::invalid("missing `{` in WGSL struct"))?;
    let close = rest
        .rfind('}')
        .ok_or_else(|| Error::invalid("missing `}` in WGSL struct"))?;
    if close < open {
        return Err(Error::invalid("`}` before `{` in WGSL struct"));
    }
    let name = rest[..open].trim().to_string();
    if name.is_empty() {
        return Err(Error::invalid("WGSL struct without a name"));
    }
    let body = &rest[open + 1..close];
    // Split members at top-level commas (array<T, N> holds a comma itself).
    let mut members = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in body.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ',' if depth == 0 => {
                members.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    members.push(&body[start..]);
    let mut offset = 0usize;
    let mut align = 1usize;
    let mut fields = Vec::new();
    for m in members.into_iter().map(str::trim).filter(|m| !m.is_empty()) {
        let (fname, ty) = m
            .split_once(':')
            .ok_or_else(|| Error::invalid(format!("WGSL member without a type: {m:?}")))?;
        let (size, a) = member_layout(ty)?;
        offset = round_up(offset, a);
        fields.push((fname.trim().to_string(), offset));
        offset += size;
        align = align.max(a);
    }
    Ok(WgslLayout {
        name,
        fields,
        size: round_up(offset, align),
        align,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytemuck::{Pod, Zeroable};
    use std::mem::{align_of, offset_of, size_of};

    /// What `#[derive(GpuType)]` generates for this struct, written out by hand (the
    /// derive crate's own tests check the generated text against this same parser).
    #[repr(C)]
    #[derive(Clone, Copy, Pod, Zeroable)]
    struct Particle {
        id: u64,
        pos: [f32; 3],
        mass: f32,
        tags: [u64; 2],
        count: i32,
        flags: u32,
    }

    impl GpuType for Particle {
        const WGSL_NAME: &'static str = "Particle";
        const WGSL_STRUCT: &'static str = "struct Particle {\n    id: vec2<u32>,\n    pos: array<f32, 3>,\n    mass: f32,\n    tags: array<vec2<u32>, 2>,\n    count: i32,\n    flags: u32,\n}\n";
        const SIZE: usize = size_of::<Particle>();
        const ALIGN: usize = 8;
        const FIELDS: &'static [(&'static str, usize)] = &[
            ("id", offset_of!(Particle, id)),
            ("pos", offset_of!(Particle, pos)),
            ("mass", offset_of!(Particle, mass)),
            ("tags", offset_of!(Particle, tags)),
            ("count", offset_of!(Particle, count)),
            ("flags", offset_of!(Particle, flags)),
        ];
        fn write_bytes(&self, out: &mut [u8]) -> Result<()> {
            check_len::<Self>(out.len())?;
            out.copy_from_slice(bytemuck::bytes_of(self));
            Ok(())
        }
        fn read_bytes(bytes: &[u8]) -> Result<Self> {
            check_len::<Self>(bytes.len())?;
            Ok(bytemuck::pod_read_unaligned(bytes))
        }
    }

    #[test]
    fn wgsl_layout_matches_rust_layout() {
        let l = wgsl_struct_layout(Particle::WGSL_STRUCT).unwrap();
        assert_eq!(l.name, Particle::WGSL_NAME);
        let rust: Vec<(String, usize)> = Particle::FIELDS
            .iter()
            .map(|(n, o)| (n.to_string(), *o))
            .collect();
        assert_eq!(l.fields, rust);
        assert_eq!(l.size, size_of::<Particle>());
        assert_eq!(l.size, Particle::SIZE);
        assert_eq!(l.align, Particle::ALIGN);
        assert_eq!(align_of::<Particle>(), 8);
    }

    #[test]
    fn wgsl_rules_pad_like_the_spec() {
        // A vec2 after a single u32 starts at 8; the size rounds up to the alignment.
        let l = wgsl_struct_layout("struct P { a: u32, b: vec2<u32>, c: u32 }").unwrap();
        assert_eq!(
            l.fields,
            vec![("a".into(), 0), ("b".into(), 8), ("c".into(), 16)]
        );
        assert_eq!((l.size, l.align), (24, 8));
        let l =
            wgsl_struct_layout("struct Q { a: array<u32, 3>, b: array<vec2<i32>, 2>, }").unwrap();
        assert_eq!(l.fields, vec![("a".into(), 0), ("b".into(), 16)]);
        assert_eq!(l.size, 32);
    }

    #[test]
    fn text_outside_the_subset_is_an_error() {
        assert!(wgsl_struct_layout("fn main() {}").is_err());
        assert!(wgsl_struct_layout("struct { a: u32 }").is_err());
        assert!(wgsl_struct_layout("struct S { a: f64 }").is_err());
        assert!(wgsl_struct_layout("struct S { a }").is_err());
        assert!(wgsl_struct_layout("struct S { a: array<u32> }").is_err());
        assert!(wgsl_struct_layout("struct S { a: array<u32, n> }").is_err());
    }

    #[test]
    fn round_up_rounds() {
        assert_eq!(round_up(0, 8), 0);
        assert_eq!(round_up(1, 8), 8);
        assert_eq!(round_up(8, 8), 8);
        assert_eq!(round_up(13, 4), 16);
    }
}
