//! `#[derive(GpuType)]`.

use crate::paths::core_path;
use crate::plain::PlainStruct;
use crate::plain::{has_fixed_repr, parse_any_repr, parse_plain, pod_checks, pod_impls};
use proc_macro2::TokenStream;
use quote::quote;
use syn::{DeriveInput, Expr, Lit, Type};

/// WGSL form of a field type: member type text, alignment.
struct WgslField {
    wgsl: String,
    size: usize,
    align: usize,
}

/// Words that WGSL reserves as keywords and a Rust field may still be called.
const WGSL_KEYWORDS: &[&str] = &[
    "alias",
    "break",
    "case",
    "const",
    "const_assert",
    "continue",
    "continuing",
    "default",
    "diagnostic",
    "discard",
    "else",
    "enable",
    "false",
    "fn",
    "for",
    "if",
    "let",
    "loop",
    "override",
    "requires",
    "return",
    "struct",
    "switch",
    "true",
    "var",
    "while",
];

fn scalar(ty: &Type) -> syn::Result<(&'static str, usize)> {
    let name = match ty {
        Type::Path(p) if p.qself.is_none() => p.path.get_ident().map(|i| i.to_string()),
        _ => None,
    };
    match name.as_deref() {
        Some("u32") => Ok(("u32", 4)),
        Some("i32") => Ok(("i32", 4)),
        Some("f32") => Ok(("f32", 4)),
        Some("u64") => Ok(("vec2<u32>", 8)),
        Some("i64") => Ok(("vec2<i32>", 8)),
        Some("f64") => Err(syn::Error::new_spanned(
            ty,
            "#[derive(GpuType)]: WGSL has no f64; use f32 (or keep the bits in a u64, which becomes vec2<u32>)",
        )),
        Some(t @ ("bool" | "u8" | "i8" | "u16" | "i16" | "usize" | "isize" | "u128" | "i128" | "char")) => {
            Err(syn::Error::new_spanned(
                ty,
                format!(
                    "#[derive(GpuType)]: `{t}` has no WGSL storage-buffer form of the same layout; \
                     use u32 or i32 (32-bit) or u64/i64"
                ),
            ))
        }
        _ => Err(syn::Error::new_spanned(
            ty,
            "#[derive(GpuType)]: unsupported field type; supported are u32, i32, f32, u64, i64 \
             and fixed-size arrays [T; N] of them with a literal N",
        )),
    }
}

fn classify(ty: &Type) -> syn::Result<WgslField> {
    match ty {
        Type::Array(a) => {
            let (elem, align) = scalar(&a.elem)?;
            let n = match &a.len {
                Expr::Lit(l) => match &l.lit {
                    Lit::Int(i) => i.base10_parse::<usize>()?,
                    _ => return Err(syn::Error::new_spanned(&a.len, "array length must be an integer")),
                },
                other => {
                    return Err(syn::Error::new_spanned(
                        other,
                        "#[derive(GpuType)]: array lengths must be integer literals (the WGSL declaration needs the number)",
                    ))
                }
            };
            if n == 0 {
                return Err(syn::Error::new_spanned(
                    &a.len,
                    "#[derive(GpuType)]: WGSL arrays cannot be empty",
                ));
            }
            Ok(WgslField {
                wgsl: format!("array<{elem}, {n}>"),
                // Every supported element's size equals its alignment: no stride padding.
                size: n * align,
                align,
            })
        }
        Type::Group(g) => classify(&g.elem),
        Type::Paren(p) => classify(&p.elem),
        other => {
            let (wgsl, align) = scalar(other)?;
            Ok(WgslField {
                wgsl: wgsl.to_string(),
                size: align,
                align,
            })
        }
    }
}

/// Expands `#[derive(GpuType)]`: the impl, and the hand-over macro through which
/// `#[gpu_kernel]` and `#[ring_kernel(gpu)]` functions below it learn the struct's
/// fields.
pub fn derive(input: DeriveInput) -> syn::Result<TokenStream> {
    let mut out = derive_impl(&input)?;
    if let syn::Data::Struct(ds) = &input.data {
        let mut fields = ds.fields.clone();
        for f in fields.iter_mut() {
            f.attrs.clear();
            f.vis = syn::Visibility::Inherited;
        }
        let ident = &input.ident;
        let item = match &fields {
            syn::Fields::Named(_) => quote!(struct #ident #fields),
            _ => quote!(struct #ident #fields;),
        };
        out.extend(crate::gpu_fn::carrier_macro(
            &crate::gpu_fn::type_carrier(ident),
            item,
        ));
    }
    Ok(out)
}

fn derive_impl(input: &DeriveInput) -> syn::Result<TokenStream> {
    let fixed = has_fixed_repr(input)?;
    let s = if fixed {
        parse_plain(input, "GpuType")?
    } else {
        parse_any_repr(input, "GpuType")?
    };
    let core = core_path();
    let ident = &s.ident;
    let wgsl_name = ident.to_string();
    if wgsl_name.starts_with("__") {
        return Err(syn::Error::new(
            ident.span(),
            "WGSL identifiers may not start with `__`",
        ));
    }

    let mut classified = Vec::with_capacity(s.fields.len());
    let mut errors: Option<syn::Error> = None;
    for f in &s.fields {
        let r = classify(&f.ty).and_then(|w| {
            if WGSL_KEYWORDS.contains(&f.name.as_str()) || f.name.starts_with("__") {
                Err(syn::Error::new_spanned(
                    &f.member,
                    format!("#[derive(GpuType)]: `{}` is a reserved word or name in WGSL; rename the field", f.name),
                ))
            } else {
                Ok(w)
            }
        });
        match r {
            Ok(w) => classified.push(w),
            Err(e) => match &mut errors {
                Some(all) => all.combine(e),
                None => errors = Some(e),
            },
        }
    }
    if let Some(e) = errors {
        return Err(e);
    }
    if s.fields.is_empty() {
        return Err(syn::Error::new(
            ident.span(),
            "#[derive(GpuType)]: WGSL structs need at least one member",
        ));
    }

    let max_align = classified.iter().map(|w| w.align).max().unwrap_or(4);
    let mut decl = format!("struct {wgsl_name} {{\n");
    for (f, w) in s.fields.iter().zip(&classified) {
        decl.push_str(&format!("    {}: {},\n", f.name, w.wgsl));
    }
    decl.push_str("}\n");

    if !fixed {
        return explicit_layout(&s, &classified, &core, &decl, max_align);
    }

    let layout_checks = s.fields.iter().zip(&classified).map(|(f, w)| {
        let member = &f.member;
        let ty = &f.ty;
        let align = w.align;
        let msg = format!(
            "#[derive(GpuType)]: field `{}` of `{ident}` is not at the offset WGSL gives it \
             (WGSL aligns {} to {align} bytes): reorder the fields or add explicit u32 padding",
            f.name, w.wgsl
        );
        quote! {
            off = #core::gpu_type::round_up(off, #align);
            assert!(::core::mem::offset_of!(#ident, #member) == off, #msg);
            off += ::core::mem::size_of::<#ty>();
        }
    });
    let size_msg = format!(
        "#[derive(GpuType)]: the size of `{ident}` differs from its WGSL size (WGSL rounds a \
         struct's size up to its largest member alignment, {max_align} bytes)"
    );
    let field_table = s.fields.iter().map(|f| {
        let member = &f.member;
        let name = &f.name;
        quote!((#name, ::core::mem::offset_of!(#ident, #member)))
    });

    // A struct that also derives RingMessage (it carries `#[message(...)]`, the
    // RingMessage helper attribute) gets its Pod impls and checks from that derive.
    let also_message = input.attrs.iter().any(|a| a.path().is_ident("message"));
    let pod = if also_message {
        TokenStream::new()
    } else {
        let checks = pod_checks(&s, &core, "GpuType");
        let impls = pod_impls(&s, &core);
        quote!(#checks #impls)
    };

    Ok(quote! {
        #pod
        const _: () = {
            let mut off: usize = 0;
            #(#layout_checks)*
            assert!(::core::mem::size_of::<#ident>() == #core::gpu_type::round_up(off, #max_align), #size_msg);
        };
        impl #core::gpu_type::GpuType for #ident {
            const WGSL_NAME: &'static str = #wgsl_name;
            const WGSL_STRUCT: &'static str = #decl;
            const SIZE: usize = ::core::mem::size_of::<#ident>();
            const ALIGN: usize = #max_align;
            const FIELDS: &'static [(&'static str, usize)] = &[#(#field_table),*];
            #[inline]
            fn write_bytes(&self, out: &mut [u8]) -> #core::Result<()> {
                #core::gpu_type::check_len::<Self>(out.len())?;
                out.copy_from_slice(#core::__private::bytemuck::bytes_of(self));
                Ok(())
            }
            #[inline]
            fn read_bytes(bytes: &[u8]) -> #core::Result<Self> {
                #core::gpu_type::check_len::<Self>(bytes.len())?;
                Ok(#core::__private::bytemuck::pod_read_unaligned(bytes))
            }
        }
    })
}

/// A struct without `#[repr(C)]`: its Rust layout is the compiler's choice, so the
/// derive fixes the WGSL layout itself (offsets computed here, every byte belonging to
/// a field) and encodes field by field. Implicit padding is refused with the exact
/// field to add.
fn explicit_layout(
    s: &PlainStruct,
    classified: &[WgslField],
    core: &TokenStream,
    decl: &str,
    max_align: usize,
) -> syn::Result<TokenStream> {
    let ident = &s.ident;
    let wgsl_name = ident.to_string();
    let mut off = 0usize;
    let mut offsets = Vec::with_capacity(s.fields.len());
    for (f, w) in s.fields.iter().zip(classified) {
        let at = (off + w.align - 1) & !(w.align - 1);
        if at != off {
            let pads = offsets.len();
            return Err(syn::Error::new_spanned(
                &f.member,
                format!(
                    "#[derive(GpuType)]: WGSL places `{}` ({}) at offset {at}, but the fields before \
                     it end at {off}: add an explicit padding field `_pad{pads}: u32` before `{}` \
                     (or order the fields largest alignment first)",
                    f.name, w.wgsl, f.name
                ),
            ));
        }
        offsets.push(at);
        off = at + w.size;
    }
    let size = (off + max_align - 1) & !(max_align - 1);
    if size != off {
        return Err(syn::Error::new(
            ident.span(),
            format!(
                "#[derive(GpuType)]: WGSL rounds the size of `{ident}` up to {size} bytes (its \
                 largest member alignment is {max_align}) but its fields end at {off}: add an \
                 explicit padding field `_pad: u32` as the last field"
            ),
        ));
    }
    let size_asserts = s.fields.iter().zip(classified).map(|(f, w)| {
        let ty = &f.ty;
        let sz = w.size;
        quote!(assert!(::core::mem::size_of::<#ty>() == #sz);)
    });
    let writes = s
        .fields
        .iter()
        .zip(classified)
        .zip(&offsets)
        .map(|((f, w), &o)| {
            let member = &f.member;
            let end = o + w.size;
            quote! {
                out[#o..#end].copy_from_slice(#core::__private::bytemuck::bytes_of(&self.#member));
            }
        });
    let reads = s
        .fields
        .iter()
        .zip(classified)
        .zip(&offsets)
        .map(|((f, w), &o)| {
            let member = &f.member;
            let end = o + w.size;
            quote! {
                #member: #core::__private::bytemuck::pod_read_unaligned(&bytes[#o..#end]),
            }
        });
    let field_table = s.fields.iter().zip(&offsets).map(|(f, o)| {
        let name = &f.name;
        quote!((#name, #o))
    });
    Ok(quote! {
        const _: () = {
            #(#size_asserts)*
        };
        impl #core::gpu_type::GpuType for #ident {
            const WGSL_NAME: &'static str = #wgsl_name;
            const WGSL_STRUCT: &'static str = #decl;
            const SIZE: usize = #size;
            const ALIGN: usize = #max_align;
            const FIELDS: &'static [(&'static str, usize)] = &[#(#field_table),*];
            #[inline]
            fn write_bytes(&self, out: &mut [u8]) -> #core::Result<()> {
                #core::gpu_type::check_len::<Self>(out.len())?;
                #(#writes)*
                Ok(())
            }
            #[inline]
            fn read_bytes(bytes: &[u8]) -> #core::Result<Self> {
                #core::gpu_type::check_len::<Self>(bytes.len())?;
                Ok(#ident { #(#reads)* })
            }
        }
    })
}
