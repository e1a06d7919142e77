//! `#[gpu_fn]`: a helper function that `#[gpu_kernel]` functions of the same module (below
//! it) may call; translated as a device function together with each kernel that calls it.
//!
//! A proc macro sees only its own item, so the helper hands its tokens over through a
//! `macro_rules!` macro named `__rk_gpu_fn_<name>`: a kernel that calls unknown functions
//! expands to a chain of those macros, each adding its helper's tokens, and the last one
//! invokes `#[gpu_kernel]` again with the helpers (`__rk_expanded (attr) [fn ..]`).

use proc_macro2::{TokenStream, TokenTree};
use quote::{format_ident, quote, ToTokens};
use syn::ItemFn;

/// Identifiers that are followed by `(` without being calls.
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "box", "break", "const", "continue", "crate", "dyn", "else", "enum",
    "extern", "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move",
    "mut", "pub", "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true",
    "type", "unsafe", "use", "where", "while",
];

/// Functions of the dsl (and the `f32::sqrt(x)` forms are paths, skipped anyway).
const DSL: &[&str] = &[
    "thread_idx_x",
    "thread_idx_y",
    "thread_idx_z",
    "block_idx_x",
    "block_idx_y",
    "block_idx_z",
    "block_dim_x",
    "block_dim_y",
    "block_dim_z",
    "grid_dim_x",
    "grid_dim_y",
    "grid_dim_z",
    "atomic_add",
    "atomic_sub",
    "atomic_min",
    "atomic_max",
    "atomic_and",
    "atomic_or",
    "atomic_xor",
    "atomic_exchange",
    "sync_threads",
    "shared_array",
];

/// The name of a helper's hand-over macro.
pub fn carrier(name: &syn::Ident) -> syn::Ident {
    format_ident!("__rk_gpu_fn_{}", name, span = name.span())
}

/// Names `f(` called in `tokens` that are not methods (`.f(`), paths (`a::f(`), macros,
/// keywords or dsl functions.
pub fn free_calls(tokens: TokenStream, out: &mut Vec<syn::Ident>) {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    for (k, tt) in tts.iter().enumerate() {
        match tt {
            TokenTree::Ident(i) => {
                let called = matches!(tts.get(k + 1), Some(TokenTree::Group(g))
                    if g.delimiter() == proc_macro2::Delimiter::Parenthesis);
                let qualified = k > 0
                    && matches!(&tts[k - 1], TokenTree::Punct(p) if p.as_char() == '.' || p.as_char() == ':');
                let name = i.to_string();
                // `Some(x)`, `KernelId(n)`: tuple structs and variants, not helpers.
                let camel = name.starts_with(|c: char| c.is_ascii_uppercase());
                if called
                    && !qualified
                    && !camel
                    && !KEYWORDS.contains(&name.as_str())
                    && !DSL.contains(&name.as_str())
                    && !out.iter().any(|o| *o == name)
                {
                    out.push(i.clone());
                }
            }
            TokenTree::Group(g) => free_calls(g.stream(), out),
            _ => {}
        }
    }
}

/// A helper as a nested item: attributes and visibility dropped.
pub fn bare(f: &ItemFn) -> ItemFn {
    let mut f = f.clone();
    f.attrs.clear();
    f.vis = syn::Visibility::Inherited;
    f
}

/// Expands `#[gpu_fn]` on `item`.
pub fn expand(attr: TokenStream, item: ItemFn) -> syn::Result<TokenStream> {
    if !attr.is_empty() {
        return Err(syn::Error::new_spanned(
            attr,
            "#[gpu_fn] takes no arguments",
        ));
    }
    let helper = bare(&item);
    // Checked now, at the helper, through a kernel that holds it (CUDA: the target with
    // every type; a kernel translated to WGSL reports f64 where it calls the helper). A
    // helper that calls other helpers is checked with the kernels that call it.
    let mut calls = Vec::new();
    free_calls(item.block.to_token_stream(), &mut calls);
    let mut errors = TokenStream::new();
    if calls.is_empty() {
        let probe: ItemFn = syn::parse_quote!(fn gpu_fn_probe() { #helper });
        if let Err(e) = ringkernel_codegen::transpile_global_kernel(&probe) {
            errors = syn::Error::new(e.span(), format!("#[gpu_fn]: {e}")).into_compile_error();
        }
    }
    let mac = carrier_macro(&carrier(&item.sig.ident), quote!(#helper));
    Ok(quote! {
        #errors
        #item
        #mac
    })
}

/// The hand-over macro `name` that adds `item` (a helper function or a struct) to the
/// items a kernel's expansion collects, then passes on to the next macro of the chain or,
/// last, invokes the kernel's attribute again with them (`__rk_expanded (attr) [items]`).
pub fn carrier_macro(name: &syn::Ident, item: TokenStream) -> TokenStream {
    quote! {
        #[doc(hidden)]
        #[allow(unused_macros)]
        macro_rules! #name {
            ([$next:ident $(, $rest:ident)*] [$($acc:tt)*] {$($path:tt)*} ($($attr:tt)*) $($kernel:tt)*) => {
                $next! { [$($rest),*] [$($acc)* #item] {$($path)*} ($($attr)*) $($kernel)* }
            };
            ([] [$($acc:tt)*] {$($path:tt)*} ($($attr:tt)*) $($kernel:tt)*) => {
                #[$($path)*(__rk_expanded ($($attr)*) [$($acc)* #item])]
                $($kernel)*
            };
        }
    }
}

/// The name of a `GpuType` struct's hand-over macro.
pub fn type_carrier(name: &syn::Ident) -> syn::Ident {
    format_ident!("__rk_gpu_type_{}", name, span = name.span())
}

/// Names that look like types but are not structs to hand over.
const NOT_STRUCTS: &[&str] = &[
    "Self",
    "GridPos",
    "GridPos3",
    "Some",
    "None",
    "Option",
    "Ok",
    "Err",
    "Result",
    "KernelContext",
    "KernelId",
];

/// CamelCase names (types; not `ALL_CAPS` constants) used in `tokens` without a path
/// in front (`a::B` is not collected): the structs a kernel may need handed over.
pub fn type_names(tokens: TokenStream, out: &mut Vec<syn::Ident>) {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    for (k, tt) in tts.iter().enumerate() {
        match tt {
            TokenTree::Ident(i) => {
                let name = i.to_string();
                let camel = name.starts_with(|c: char| c.is_ascii_uppercase())
                    && name.chars().any(|c| c.is_ascii_lowercase());
                let colon = |j: usize| matches!(&tts[j], TokenTree::Punct(p) if p.as_char() == ':');
                let qualified = k > 1 && colon(k - 1) && colon(k - 2);
                if camel
                    && !qualified
                    && !NOT_STRUCTS.contains(&name.as_str())
                    && !out.iter().any(|o| *o == name)
                {
                    out.push(i.clone());
                }
            }
            TokenTree::Group(g) => type_names(g.stream(), out),
            _ => {}
        }
    }
}
