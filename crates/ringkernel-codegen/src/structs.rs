//! `GpuType` structs in kernels: their definitions (struct items at the top of a kernel's
//! body, where `#[gpu_kernel]` and `#[ring_kernel(gpu)]` put the structs a kernel names),
//! their layout (WGSL's storage rules, which `#[derive(GpuType)]` enforces) and their
//! CUDA C and WGSL declarations.

use crate::names::Names;
use crate::types::{parse_type, StructSizes, Ty};
use crate::{ScalarType, Target};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::rc::Rc;

/// One field of a [`StructDef`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldDef {
    /// The Rust name.
    pub(crate) name: String,
    /// The name in CUDA C and WGSL (a `_` appended to reserved words).
    pub(crate) emitted: String,
    /// A scalar or an array of scalars.
    pub(crate) ty: Ty,
    /// Byte offset.
    pub(crate) offset: u32,
}

/// A struct a kernel uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StructDef {
    pub(crate) name: String,
    pub(crate) fields: Vec<FieldDef>,
    pub(crate) size: u32,
    pub(crate) align: u32,
}

/// The structs of one translation, by name, in definition order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Structs {
    order: Vec<String>,
    defs: HashMap<String, Rc<StructDef>>,
}

const FIELD_RULES: &str = "fields of a GpuType struct are u32, i32, f32, u64, i64 or arrays \
     [T; N] of them (N a literal), as #[derive(GpuType)] accepts";

impl Structs {
    /// The struct items at the top level of `f`'s body.
    pub(crate) fn of(f: &syn::ItemFn) -> syn::Result<Structs> {
        let mut s = Structs::default();
        for st in &f.block.stmts {
            if let syn::Stmt::Item(syn::Item::Struct(item)) = st {
                s.add(item)?;
            }
        }
        Ok(s)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Rc<StructDef>> {
        self.defs.get(name)
    }

    /// Definitions in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Rc<StructDef>> {
        self.order.iter().map(|n| &self.defs[n])
    }

    fn add(&mut self, item: &syn::ItemStruct) -> syn::Result<()> {
        let name = item.ident.to_string();
        if !item.generics.params.is_empty() {
            return Err(syn::Error::new_spanned(
                &item.generics,
                "structs used in kernels cannot be generic",
            ));
        }
        if Names::is_reserved(&name)
            || name.starts_with("Rk")
            || name.starts_with("rk_")
            || name.starts_with("__")
        {
            return Err(syn::Error::new_spanned(
                &item.ident,
                format!(
                    "`{name}` cannot name a struct used in a kernel: it is reserved in CUDA C or \
                     WGSL (names starting with `Rk` belong to RingKernel's templates)"
                ),
            ));
        }
        if self.defs.contains_key(&name) {
            // The same struct handed over twice (a helper and a kernel naming it): keep one.
            return Ok(());
        }
        let syn::Fields::Named(named) = &item.fields else {
            return Err(syn::Error::new_spanned(
                &item.fields,
                "structs used in kernels have named fields (`struct P { x: f32 }`)",
            ));
        };
        let mut fields = Vec::new();
        let mut offset = 0u32;
        let mut align = 4u32;
        for f in &named.named {
            let ident = f.ident.as_ref().expect("named fields have names");
            // Every target type checks the same: f64 is refused by GpuType itself.
            let ty = match parse_type(&f.ty, Target::Cuda, &Structs::default()) {
                Ok(t @ Ty::Scalar(s)) if field_scalar(s) => t,
                Ok(t @ Ty::Array { elem, .. }) if field_scalar(elem) => t,
                _ => return Err(syn::Error::new_spanned(&f.ty, FIELD_RULES)),
            };
            let (size, a) = size_align(&ty);
            if !offset.is_multiple_of(a) {
                return Err(syn::Error::new_spanned(
                    f,
                    format!(
                        "field `{ident}` would start after {} byte(s) of implicit padding; a \
                         GpuType struct has none: add a `u32` padding field before it or \
                         reorder the fields",
                        a - offset % a
                    ),
                ));
            }
            align = align.max(a);
            let n = ident.to_string();
            let emitted = if Names::is_reserved(&n) || n.starts_with("rk_") {
                format!("{n}_")
            } else {
                syn::ext::IdentExt::unraw(ident).to_string()
            };
            fields.push(FieldDef {
                name: syn::ext::IdentExt::unraw(ident).to_string(),
                emitted,
                ty,
                offset,
            });
            offset += size;
        }
        if fields.is_empty() {
            return Err(syn::Error::new_spanned(
                &item.ident,
                "structs used in kernels have at least one field",
            ));
        }
        if !offset.is_multiple_of(align) {
            return Err(syn::Error::new_spanned(
                &item.ident,
                format!(
                    "struct `{name}` would end with {} byte(s) of implicit padding; a GpuType \
                     struct has none: add a `u32` padding field at the end",
                    align - offset % align
                ),
            ));
        }
        self.order.push(name.clone());
        self.defs.insert(
            name.clone(),
            Rc::new(StructDef {
                name,
                fields,
                size: offset,
                align,
            }),
        );
        Ok(())
    }

    /// The declarations of every struct for `target` (CUDA C or WGSL).
    pub(crate) fn declarations(&self, target: Target) -> String {
        let mut s = String::new();
        for d in self.iter() {
            let _ = writeln!(s, "struct {} {{", d.name);
            for f in &d.fields {
                let (elem, len) = match f.ty {
                    Ty::Scalar(e) => (e, None),
                    Ty::Array { elem, len } => (elem, Some(len)),
                    _ => unreachable!("fields are scalars or arrays"),
                };
                match target {
                    Target::Cuda => {
                        let t = elem.cuda_name();
                        match len {
                            None => {
                                let _ = writeln!(s, "    {t} {};", f.emitted);
                            }
                            Some(n) => {
                                let _ = writeln!(s, "    {t} {}[{n}];", f.emitted);
                            }
                        }
                    }
                    Target::Wgsl => {
                        let t = wgsl_storage_name(elem);
                        match len {
                            None => {
                                let _ = writeln!(s, "    {}: {t},", f.emitted);
                            }
                            Some(n) => {
                                let _ = writeln!(s, "    {}: array<{t}, {n}>,", f.emitted);
                            }
                        }
                    }
                }
            }
            s.push_str(if target == Target::Cuda {
                "};\n\n"
            } else {
                "}\n\n"
            });
        }
        s
    }
}

fn field_scalar(s: ScalarType) -> bool {
    matches!(
        s,
        ScalarType::U32 | ScalarType::I32 | ScalarType::F32 | ScalarType::U64 | ScalarType::I64
    )
}

/// Size and alignment of a field type.
fn size_align(t: &Ty) -> (u32, u32) {
    let scalar = |s: ScalarType| match s {
        ScalarType::U64 | ScalarType::I64 | ScalarType::F64 => 8,
        _ => 4,
    };
    match t {
        Ty::Scalar(s) => (scalar(*s), scalar(*s)),
        Ty::Array { elem, len } => (scalar(*elem) * *len as u32, scalar(*elem)),
        _ => unreachable!("fields are scalars or arrays"),
    }
}

/// The WGSL type a field of `s` is stored as: 64-bit integers are two words
/// (`vec2<u32>` / `vec2<i32>`, low word first), as `#[derive(GpuType)]` declares them.
pub(crate) fn wgsl_storage_name(s: ScalarType) -> &'static str {
    match s {
        ScalarType::U64 => "vec2<u32>",
        ScalarType::I64 => "vec2<i32>",
        other => other.wgsl_name().expect("fields have WGSL forms"),
    }
}

impl StructSizes for Structs {
    fn struct_size(&self, name: &str) -> Option<u32> {
        self.get(name).map(|d| d.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn structs(src: proc_macro2::TokenStream) -> syn::Result<Structs> {
        let f: syn::ItemFn = syn::parse2(src).unwrap();
        Structs::of(&f)
    }

    #[test]
    fn layout_and_declarations() {
        let s = structs(quote::quote! {
            fn k() {
                struct Particle { id: u64, pos: [f32; 3], mass: f32 }
                struct Tiny { float: i32 }
            }
        })
        .unwrap();
        let p = s.get("Particle").unwrap();
        assert_eq!((p.size, p.align), (24, 8));
        let offsets: Vec<u32> = p.fields.iter().map(|f| f.offset).collect();
        assert_eq!(offsets, [0, 8, 20]);
        assert_eq!(s.get("Tiny").unwrap().fields[0].emitted, "float_");
        let cuda = s.declarations(Target::Cuda);
        assert!(cuda.contains("struct Particle {\n    unsigned long long id;\n    float pos[3];\n    float mass;\n};"), "{cuda}");
        let wgsl = s.declarations(Target::Wgsl);
        assert!(
            wgsl.contains(
                "struct Particle {\n    id: vec2<u32>,\n    pos: array<f32, 3>,\n    mass: f32,\n}"
            ),
            "{wgsl}"
        );
        assert!(wgsl.contains("float_: i32,"), "{wgsl}");
    }

    #[test]
    fn padding_and_bad_fields_are_refused() {
        let e = structs(quote::quote! { fn k() { struct P { a: u32, b: u64 } } })
            .err()
            .unwrap();
        assert!(e.to_string().contains("implicit padding"), "{e}");
        let e = structs(quote::quote! { fn k() { struct P { b: u64, a: u32 } } })
            .err()
            .unwrap();
        assert!(e.to_string().contains("at the end"), "{e}");
        for bad in [
            quote::quote! { fn k() { struct P { a: f64 } } },
            quote::quote! { fn k() { struct P { a: bool } } },
            quote::quote! { fn k() { struct P(u32); } },
            quote::quote! { fn k() { struct RkThing { a: u32 } } },
        ] {
            assert!(structs(bad).is_err());
        }
    }
}
