//! `#[ring_kernel]`.

use crate::paths::core_path;
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitStr, Type};

/// Expands `#[ring_kernel(name = "...")]` on `item`.
pub fn expand(attr: TokenStream, item: ItemFn) -> syn::Result<TokenStream> {
    let mut name: Option<LitStr> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("name") {
            if name.is_some() {
                return Err(meta.error("duplicate `name`"));
            }
            name = Some(meta.value()?.parse()?);
            Ok(())
        } else {
            Err(meta.error("unknown #[ring_kernel] argument: expected `name = \"...\"`"))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;

    let sig = &item.sig;
    let ident = &sig.ident;
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "#[ring_kernel] handlers cannot be generic: the registry needs one concrete handler per name",
        ));
    }
    if let Some(a) = &sig.asyncness {
        return Err(syn::Error::new(
            a.span,
            "#[ring_kernel] handlers are synchronous: they run on the kernel's own thread",
        ));
    }
    if let Some(v) = &sig.variadic {
        return Err(syn::Error::new(
            v.span(),
            "#[ring_kernel] handlers cannot be variadic",
        ));
    }
    if let Some(FnArg::Receiver(r)) = sig.inputs.first() {
        return Err(syn::Error::new(
            r.span(),
            "#[ring_kernel] goes on a free function, not a method",
        ));
    }
    let name = match name {
        Some(n) if n.value().is_empty() => {
            return Err(syn::Error::new(
                n.span(),
                "#[ring_kernel]: the kernel name must not be empty",
            ))
        }
        Some(n) => n.value(),
        None => ident.to_string(),
    };

    let core = core_path();
    let handler = match sig.inputs.len() {
        2 => match archived_param(&sig.inputs[1]) {
            Some(m) => quote!(#core::registry::archived_fn::<#m, _, _>(#ident)),
            None => quote!(#core::registry::handler_fn(#ident)),
        },
        3 => {
            let state_ty = match &sig.inputs[1] {
                FnArg::Typed(pt) => match &*pt.ty {
                    Type::Reference(r) if r.mutability.is_some() => (*r.elem).clone(),
                    other => return Err(syn::Error::new_spanned(
                        other,
                        "#[ring_kernel]: the state argument must be `&mut S` (S: Default + Send)",
                    )),
                },
                FnArg::Receiver(r) => return Err(syn::Error::new(r.span(), "unexpected receiver")),
            };
            let init = quote_spanned! {state_ty.span()=> <#state_ty as ::core::default::Default>::default() };
            match archived_param(&sig.inputs[2]) {
                Some(m) => {
                    quote!(#core::registry::stateful_archived_fn::<_, #m, _, _>(#init, #ident))
                }
                None => quote!(#core::registry::stateful_fn(#init, #ident)),
            }
        }
        _ => {
            return Err(syn::Error::new(
                sig.inputs.span(),
                "#[ring_kernel] handlers take `(ctx: &mut KernelContext<'_>, msg: Req)` or \
                 `(ctx: &mut KernelContext<'_>, state: &mut S, msg: Req)`",
            ))
        }
    };

    Ok(quote! {
        #item
        #[allow(non_upper_case_globals)]
        const _: () = {
            fn __rk_factory() -> ::std::boxed::Box<dyn #core::registry::CpuHandler> {
                ::std::boxed::Box::new(#handler)
            }
            #core::__private::inventory::submit! {
                #core::registry::StaticCpuHandler { name: #name, factory: __rk_factory }
            }
        };
    })
}

/// `M` when the parameter's type is `&Archived<M>` (a handler that reads an rkyv
/// message in place, registered through `archived_fn`).
fn archived_param(arg: &FnArg) -> Option<Type> {
    let FnArg::Typed(pt) = arg else { return None };
    let Type::Reference(r) = &*pt.ty else {
        return None;
    };
    if r.mutability.is_some() {
        return None;
    }
    let Type::Path(p) = &*r.elem else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Archived" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [syn::GenericArgument::Type(t)] => Some(t.clone()),
        _ => None,
    }
}
