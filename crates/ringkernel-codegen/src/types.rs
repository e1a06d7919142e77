//! The types of the subset and how they map to CUDA C and WGSL.

use crate::{ParamKind, Target};
use syn::spanned::Spanned;

/// The `GpuType` structs a translation knows, by name: their sizes in bytes (the
/// translation's struct table implements it; types only need to know which names are
/// structs and how large they are).
pub(crate) trait StructSizes {
    /// The size of struct `name`, `None` when no such struct is known.
    fn struct_size(&self, name: &str) -> Option<u32>;
}

/// A scalar type of the subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarType {
    /// `f32`: CUDA `float`, WGSL `f32`.
    F32,
    /// `f64`: CUDA `double`; not available in WGSL (a translation error).
    F64,
    /// `i32`: CUDA `int`, WGSL `i32`.
    I32,
    /// `u32`: CUDA `unsigned int`, WGSL `u32`.
    U32,
    /// `usize` (index arithmetic only, not a parameter type): CUDA `unsigned long long`,
    /// WGSL `u32`.
    Usize,
    /// `bool`: CUDA `bool`, WGSL `bool` (a `u32` in the WGSL parameter block).
    Bool,
    /// `i64`: CUDA `long long`; not available in WGSL (a translation error).
    I64,
    /// `u64`: CUDA `unsigned long long`; not available in WGSL (a translation error).
    U64,
}

impl ScalarType {
    /// The Rust spelling.
    pub fn rust_name(self) -> &'static str {
        match self {
            ScalarType::F32 => "f32",
            ScalarType::F64 => "f64",
            ScalarType::I32 => "i32",
            ScalarType::U32 => "u32",
            ScalarType::Usize => "usize",
            ScalarType::Bool => "bool",
            ScalarType::I64 => "i64",
            ScalarType::U64 => "u64",
        }
    }

    /// The CUDA C spelling.
    pub fn cuda_name(self) -> &'static str {
        match self {
            ScalarType::F32 => "float",
            ScalarType::F64 => "double",
            ScalarType::I32 => "int",
            ScalarType::U32 => "unsigned int",
            ScalarType::Usize => "unsigned long long",
            ScalarType::Bool => "bool",
            ScalarType::I64 => "long long",
            ScalarType::U64 => "unsigned long long",
        }
    }

    /// The WGSL spelling (`None` for `f64`, `i64` and `u64`, which WGSL lacks).
    pub fn wgsl_name(self) -> Option<&'static str> {
        match self {
            ScalarType::F32 => Some("f32"),
            ScalarType::F64 | ScalarType::I64 | ScalarType::U64 => None,
            ScalarType::I32 => Some("i32"),
            ScalarType::U32 | ScalarType::Usize => Some("u32"),
            ScalarType::Bool => Some("bool"),
        }
    }

    pub(crate) fn is_float(self) -> bool {
        matches!(self, ScalarType::F32 | ScalarType::F64)
    }

    pub(crate) fn is_int(self) -> bool {
        matches!(
            self,
            ScalarType::I32
                | ScalarType::U32
                | ScalarType::Usize
                | ScalarType::I64
                | ScalarType::U64
        )
    }

    pub(crate) fn is_signed(self) -> bool {
        matches!(
            self,
            ScalarType::I32 | ScalarType::I64 | ScalarType::F32 | ScalarType::F64
        )
    }

    /// The scalar spelled `s` in Rust (`"f32"`, `"u32"`, ...).
    pub fn from_rust_name(s: &str) -> Option<Self> {
        Self::from_name(s)
    }

    pub(crate) fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "f32" => ScalarType::F32,
            "f64" => ScalarType::F64,
            "i32" => ScalarType::I32,
            "u32" => ScalarType::U32,
            "usize" => ScalarType::Usize,
            "bool" => ScalarType::Bool,
            "i64" => ScalarType::I64,
            "u64" => ScalarType::U64,
            _ => return None,
        })
    }
}

/// A type of the subset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ty {
    Scalar(ScalarType),
    Slice {
        elem: ScalarType,
        mutable: bool,
    },
    Array {
        elem: ScalarType,
        len: usize,
    },
    /// A `GpuType` struct (by name; its definition is in the translation's `Structs`).
    Struct(String),
    /// `&[T]` / `&mut [T]` of a `GpuType` struct.
    StructSlice {
        name: String,
        mutable: bool,
    },
    GridPos {
        dims: u8,
    },
    Unit,
    /// A handler's `&mut KernelContext<'_>` parameter.
    Context,
    /// What the tail of an `Option<R>` handler produces: a reply or none.
    Reply,
}

impl Ty {
    pub(crate) fn scalar(&self) -> Option<ScalarType> {
        match self {
            Ty::Scalar(s) => Some(*s),
            _ => None,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Ty::Scalar(s) => s.rust_name().to_string(),
            Ty::Slice { elem, mutable } => {
                format!(
                    "&{}[{}]",
                    if *mutable { "mut " } else { "" },
                    elem.rust_name()
                )
            }
            Ty::Array { elem, len } => format!("[{}; {len}]", elem.rust_name()),
            Ty::Struct(n) => n.clone(),
            Ty::StructSlice { name, mutable } => {
                format!("&{}[{name}]", if *mutable { "mut " } else { "" })
            }
            Ty::GridPos { dims: 2 } => "GridPos".into(),
            Ty::GridPos { .. } => "GridPos3".into(),
            Ty::Unit => "()".into(),
            Ty::Context => "&mut KernelContext".into(),
            Ty::Reply => "Option<reply>".into(),
        }
    }
}

pub(crate) const SUPPORTED_TYPES: &str = "f32, f64 (CUDA only), i32, u32, i64 and u64 (CUDA \
     only), bool, usize (for indices), [T; N] locals, &[T] and &mut [T] parameters, GpuType \
     structs (defined above the kernel with #[derive(GpuType)]), GridPos/GridPos3 (stencil kernels)";

/// The spelling of a scalar for `target`; `f64` on WGSL is an error at `span_of`.
pub(crate) fn scalar_name(
    s: ScalarType,
    target: Target,
    span_of: &dyn quote::ToTokens,
) -> syn::Result<&'static str> {
    match target {
        Target::Cuda => Ok(s.cuda_name()),
        Target::Wgsl => s.wgsl_name().ok_or_else(|| no_wgsl_type(s, span_of)),
    }
}

/// The error for a type WGSL lacks (`f64`, `i64`, `u64`) at `span_of`.
pub(crate) fn no_wgsl_type(s: ScalarType, span_of: &dyn quote::ToTokens) -> syn::Error {
    if s == ScalarType::F64 {
        return f64_error(span_of);
    }
    syn::Error::new_spanned(
        span_of,
        format!(
            "type `{}` is not available in WGSL (it has no 64-bit integers); use `i32`/`u32` in \
             kernels translated to WGSL ({} is supported on CUDA only)",
            s.rust_name(),
            s.rust_name()
        ),
    )
}

pub(crate) fn f64_error(span_of: &dyn quote::ToTokens) -> syn::Error {
    syn::Error::new_spanned(
        span_of,
        "type `f64` is not available in WGSL (it has no 64-bit floats); use `f32` in kernels \
         translated to WGSL (f64 is supported on CUDA only)",
    )
}

/// Parses a type of the subset; `f64` (and anything containing it) is an error on WGSL.
/// Struct names resolve through `structs`.
pub(crate) fn parse_type(
    ty: &syn::Type,
    target: Target,
    structs: &dyn StructSizes,
) -> syn::Result<Ty> {
    let unsupported = || {
        syn::Error::new(
            ty.span(),
            format!(
                "unsupported type `{}`; the kernel subset supports {SUPPORTED_TYPES}",
                quote::quote!(#ty)
            ),
        )
    };
    match ty {
        syn::Type::Paren(p) => parse_type(&p.elem, target, structs),
        syn::Type::Tuple(t) if t.elems.is_empty() => Ok(Ty::Unit),
        syn::Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last().ok_or_else(unsupported)?;
            if !last.arguments.is_none() {
                return Err(unsupported());
            }
            let name = last.ident.to_string();
            if let Some(s) = ScalarType::from_name(&name) {
                if p.path.segments.len() != 1 {
                    return Err(unsupported());
                }
                if target == Target::Wgsl && s.wgsl_name().is_none() {
                    return Err(no_wgsl_type(s, ty));
                }
                return Ok(Ty::Scalar(s));
            }
            match name.as_str() {
                "GridPos" => Ok(Ty::GridPos { dims: 2 }),
                "GridPos3" => Ok(Ty::GridPos { dims: 3 }),
                _ if structs.struct_size(&name).is_some() && p.path.segments.len() == 1 => {
                    Ok(Ty::Struct(name))
                }
                _ if name.starts_with(|c: char| c.is_ascii_uppercase()) => Err(syn::Error::new(
                    ty.span(),
                    format!(
                        "unknown type `{}`: a struct used in a kernel derives `GpuType` and \
                             is defined above the kernel in the same module (it is then handed \
                             to the translator; with the translator's API, define it at the top \
                             of the kernel's body); the kernel subset supports {SUPPORTED_TYPES}",
                        quote::quote!(#ty)
                    ),
                )),
                _ => Err(unsupported()),
            }
        }
        syn::Type::Reference(r) => {
            if r.lifetime.is_some() {
                return Err(syn::Error::new_spanned(
                    r,
                    "lifetimes are not part of the kernel subset; write `&[T]` or `&mut [T]`",
                ));
            }
            let syn::Type::Slice(s) = &*r.elem else {
                return Err(syn::Error::new_spanned(
                    r,
                    format!(
                        "references other than slices are not supported; the kernel subset \
                         supports {SUPPORTED_TYPES}"
                    ),
                ));
            };
            if let Ty::Struct(name) = parse_type(&s.elem, target, structs)? {
                return Ok(Ty::StructSlice {
                    name,
                    mutable: r.mutability.is_some(),
                });
            }
            let elem = element_type(&s.elem, target, structs)?;
            Ok(Ty::Slice {
                elem,
                mutable: r.mutability.is_some(),
            })
        }
        syn::Type::Array(a) => {
            let elem = element_type(&a.elem, target, structs)?;
            let len = match &a.len {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(i),
                    ..
                }) => i.base10_parse::<usize>()?,
                other => {
                    return Err(syn::Error::new_spanned(
                        other,
                        "array lengths must be integer literals",
                    ))
                }
            };
            check_array_len(len, &a.len)?;
            Ok(Ty::Array { elem, len })
        }
        _ => Err(unsupported()),
    }
}

/// Largest local array the subset accepts (elements).
pub(crate) const MAX_ARRAY_LEN: usize = 1024;

pub(crate) fn check_array_len(len: usize, span_of: &dyn quote::ToTokens) -> syn::Result<()> {
    check_len(len, MAX_ARRAY_LEN, "local arrays", span_of)
}

/// `len` within `1..=max`, else an error at `span_of` naming `what`.
fn check_len(len: usize, max: usize, what: &str, span_of: &dyn quote::ToTokens) -> syn::Result<()> {
    if len == 0 || len > max {
        return Err(syn::Error::new_spanned(
            span_of,
            format!("{what} need 1 to {max} elements"),
        ));
    }
    Ok(())
}

/// Largest shared array the subset accepts (elements): 16 KiB of 4-byte elements,
/// WebGPU's default workgroup memory (the total over a kernel's shared arrays is the
/// device's limit, checked when the kernel compiles).
pub(crate) const MAX_SHARED_LEN: usize = 4096;

pub(crate) fn check_shared_len(len: usize, span_of: &dyn quote::ToTokens) -> syn::Result<()> {
    check_len(len, MAX_SHARED_LEN, "shared arrays", span_of)
}

/// Element type of a slice or array: a scalar that the target can store in a buffer.
fn element_type(
    ty: &syn::Type,
    target: Target,
    structs: &dyn StructSizes,
) -> syn::Result<ScalarType> {
    match parse_type(ty, target, structs)? {
        Ty::Scalar(ScalarType::Usize) => Err(syn::Error::new_spanned(
            ty,
            "`usize` has no fixed size on the GPU; use `u32` or `i32` elements",
        )),
        Ty::Scalar(ScalarType::Bool) if target == Target::Wgsl => Err(syn::Error::new_spanned(
            ty,
            "`bool` cannot be stored in a WGSL buffer; use `u32` elements (0 or 1)",
        )),
        Ty::Scalar(s) => Ok(s),
        _ => Err(syn::Error::new_spanned(
            ty,
            "slice and array elements must be scalars: f32, f64 (CUDA only), i32, u32, bool",
        )),
    }
}

/// One kernel parameter: its name pattern and type, with the checks every kernel shares
/// (a plain name; a scalar other than `usize`, a slice, a `GpuType` struct or a
/// `GridPos`).
pub(crate) fn parse_param<'a>(
    arg: &'a syn::FnArg,
    target: Target,
    structs: &dyn StructSizes,
) -> syn::Result<(&'a syn::PatIdent, ParamKind)> {
    let syn::FnArg::Typed(pt) = arg else {
        return Err(syn::Error::new_spanned(
            arg,
            "kernels are free functions; `self` is not supported",
        ));
    };
    let plain = || syn::Error::new_spanned(&pt.pat, "parameters must be plain names (`x: f32`)");
    let syn::Pat::Ident(pi) = &*pt.pat else {
        return Err(plain());
    };
    if pi.by_ref.is_some() || pi.subpat.is_some() {
        return Err(plain());
    }
    let ty = parse_type(&pt.ty, target, structs)?;
    match ty {
        Ty::Scalar(ScalarType::Usize) => Err(syn::Error::new_spanned(
            &pt.ty,
            "`usize` parameters are not supported (no fixed size on the GPU); use `u32` or \
             `i32`",
        )),
        Ty::Array { .. } | Ty::Unit | Ty::Context | Ty::Reply => Err(syn::Error::new_spanned(
            &pt.ty,
            "parameters are scalars (f32, f64 on CUDA, i32, u32, bool) or slices (`&[T]`, \
             `&mut [T]`)",
        )),
        Ty::Scalar(s) => Ok((pi, ParamKind::Scalar(s))),
        Ty::Slice { elem, mutable } => Ok((pi, ParamKind::Slice { elem, mutable })),
        Ty::Struct(name) => {
            let size = structs.struct_size(&name).expect("parsed");
            Ok((
                pi,
                ParamKind::Struct {
                    name: crate::intern(&name),
                    size,
                },
            ))
        }
        Ty::StructSlice { name, mutable } => {
            let size = structs.struct_size(&name).expect("parsed");
            Ok((
                pi,
                ParamKind::StructSlice {
                    name: crate::intern(&name),
                    size,
                    mutable,
                },
            ))
        }
        Ty::GridPos { dims } => Ok((pi, ParamKind::GridPos { dims })),
    }
}

impl From<ParamKind> for Ty {
    fn from(k: ParamKind) -> Ty {
        match k {
            ParamKind::Scalar(s) => Ty::Scalar(s),
            ParamKind::Slice { elem, mutable } => Ty::Slice { elem, mutable },
            ParamKind::Struct { name, .. } => Ty::Struct(name.to_string()),
            ParamKind::StructSlice { name, mutable, .. } => Ty::StructSlice {
                name: name.to_string(),
                mutable,
            },
            ParamKind::GridPos { dims } => Ty::GridPos { dims },
        }
    }
}
