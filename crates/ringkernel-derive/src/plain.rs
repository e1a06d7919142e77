//! Plain-data checks shared by `#[derive(RingMessage)]` and `#[derive(GpuType)]`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, Member, Type};

/// One field of a plain-data struct.
pub struct Field {
    /// `name` or `0` (for `offset_of!` and field access).
    pub member: Member,
    /// The name as text (`f0`, `f1`... for tuple fields).
    pub name: String,
    /// Its type.
    pub ty: Type,
}

/// A struct that passed the syntactic checks.
pub struct PlainStruct {
    /// Type name.
    pub ident: Ident,
    /// Fields in declaration order.
    pub fields: Vec<Field>,
}

/// Checks that `input` is a non-generic `#[repr(C)]` (or `#[repr(transparent)]`) struct
/// and collects its fields. `derive` names the derive in error messages.
pub fn parse_plain(input: &DeriveInput, derive: &str) -> syn::Result<PlainStruct> {
    let data = match &input.data {
        Data::Struct(s) => s,
        Data::Enum(e) => {
            return Err(syn::Error::new(
                e.enum_token.span,
                format!(
                "#[derive({derive})] supports structs only: an enum has no fixed plain-data layout"
            ),
            ))
        }
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span,
                format!("#[derive({derive})] supports structs only, not unions"),
            ))
        }
    };
    reject_generics(input, derive)?;
    check_repr(input, derive)?;
    Ok(collect_fields(input, data))
}

/// The struct's fields, without the `repr` check (for layouts the derive makes explicit
/// itself). Enums, unions and generic types are errors, as for [`parse_plain`].
pub fn parse_any_repr(input: &DeriveInput, derive: &str) -> syn::Result<PlainStruct> {
    match &input.data {
        Data::Struct(data) => {
            reject_generics(input, derive)?;
            Ok(collect_fields(input, data))
        }
        _ => parse_plain(input, derive),
    }
}

fn collect_fields(input: &DeriveInput, data: &syn::DataStruct) -> PlainStruct {
    let ident = input.ident.clone();
    let fields = match &data.fields {
        Fields::Named(named) => named
            .named
            .iter()
            .map(|f| {
                let id = f.ident.clone().expect("named fields have names");
                Field {
                    name: unraw(&id),
                    member: Member::Named(id),
                    ty: f.ty.clone(),
                }
            })
            .collect(),
        Fields::Unnamed(unnamed) => unnamed
            .unnamed
            .iter()
            .enumerate()
            .map(|(i, f)| Field {
                member: Member::Unnamed(syn::Index::from(i)),
                name: format!("f{i}"),
                ty: f.ty.clone(),
            })
            .collect(),
        Fields::Unit => Vec::new(),
    };
    PlainStruct { ident, fields }
}

/// An identifier without a leading `r#`.
fn unraw(id: &Ident) -> String {
    let s = id.to_string();
    s.strip_prefix("r#").map(str::to_string).unwrap_or(s)
}

/// A clear error for a generic type (a message or GPU type needs one fixed layout).
pub fn reject_generics(input: &DeriveInput, derive: &str) -> syn::Result<()> {
    if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
        return Err(syn::Error::new(
            input.generics.span(),
            format!(
                "#[derive({derive})] cannot be used on a generic type: its layout must be fixed \
                 (define a concrete struct per instantiation instead)"
            ),
        ));
    }
    Ok(())
}

/// Whether the struct is `#[repr(C)]` or `#[repr(transparent)]`.
pub fn has_fixed_repr(input: &DeriveInput) -> syn::Result<bool> {
    let mut fixed = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("repr")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("C") || meta.path.is_ident("transparent") {
                fixed = true;
            }
            // Skip the arguments of `align(N)` / `packed(N)`.
            if meta.input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in meta.input);
                let _: TokenStream = content.parse()?;
            }
            Ok(())
        })?;
    }
    Ok(fixed)
}

/// Requires `#[repr(C)]` or `#[repr(transparent)]`.
fn check_repr(input: &DeriveInput, derive: &str) -> syn::Result<()> {
    if has_fixed_repr(input)? {
        Ok(())
    } else {
        Err(syn::Error::new(
            input.ident.span(),
            format!(
                "#[derive({derive})] needs #[repr(C)] (or #[repr(transparent)]): the default Rust layout \
                 may reorder fields, so it cannot be shared with other processes or a GPU"
            ),
        ))
    }
}

/// Compile-time checks that every field is `Pod` and that the struct has no padding.
pub fn pod_checks(s: &PlainStruct, core: &TokenStream, derive: &str) -> TokenStream {
    let ident = &s.ident;
    let asserts = s.fields.iter().map(|f| {
        let ty = &f.ty;
        // The span makes "`X: Pod` is not satisfied" point at the offending field.
        quote_spanned! {ty.span()=> __rk_assert_pod::<#ty>(); }
    });
    let sizes = s.fields.iter().map(|f| {
        let ty = &f.ty;
        quote!(+ ::core::mem::size_of::<#ty>())
    });
    let msg = format!(
        "#[derive({derive})]: `{ident}` has padding bytes (its size is larger than the sum of its \
         fields' sizes). Padding is not plain data: reorder the fields (largest alignment first) \
         or add explicit padding fields"
    );
    quote! {
        const _: () = {
            #[allow(dead_code)]
            fn __rk_assert_pod<T: #core::gpu_type::PlainField>() {}
            #[allow(dead_code)]
            fn __rk_fields_are_pod() {
                #(#asserts)*
            }
            assert!(::core::mem::size_of::<#ident>() == 0 #(#sizes)*, #msg);
        };
    }
}

/// `unsafe impl Zeroable + Pod`, emitted after [`pod_checks`].
pub fn pod_impls(s: &PlainStruct, core: &TokenStream) -> TokenStream {
    let ident = &s.ident;
    // SAFETY (of the generated impls): the struct is `#[repr(C)]`/`#[repr(transparent)]`
    // (checked by `parse_plain`), not generic, every field is `Pod` (checked by the
    // generated `__rk_fields_are_pod`), and its size is the sum of its fields' sizes, so
    // it has no padding (checked by the generated const assertion). `Pod` additionally
    // requires `Copy + 'static`, which the compiler checks on these impls. Those are
    // exactly bytemuck's requirements for `Zeroable` and `Pod` on a struct.
    quote! {
        unsafe impl #core::__private::bytemuck::Zeroable for #ident {}
        unsafe impl #core::__private::bytemuck::Pod for #ident {}
    }
}
