//! `#[derive(RingMessage)]`.

use crate::paths::core_path;
use crate::plain::{parse_plain, pod_checks, pod_impls};
use proc_macro2::TokenStream;
use quote::quote;
use syn::{DeriveInput, Expr, LitStr};

/// The arguments of `#[message(type_id = N, name = "...")]`.
struct MessageArgs {
    type_id: Expr,
    name: Option<LitStr>,
}

fn parse_args(input: &DeriveInput) -> syn::Result<MessageArgs> {
    let mut type_id: Option<Expr> = None;
    let mut name: Option<LitStr> = None;
    let mut seen = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("message")) {
        if seen {
            return Err(syn::Error::new_spanned(
                attr,
                "duplicate #[message(...)] attribute",
            ));
        }
        seen = true;
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("type_id") {
                if type_id.is_some() {
                    return Err(meta.error("duplicate `type_id`"));
                }
                type_id = Some(meta.value()?.parse()?);
                Ok(())
            } else if meta.path.is_ident("name") {
                if name.is_some() {
                    return Err(meta.error("duplicate `name`"));
                }
                name = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error(
                    "unknown #[message] argument: expected `type_id = N` or `name = \"...\"`",
                ))
            }
        })?;
    }
    match type_id {
        Some(type_id) => Ok(MessageArgs { type_id, name }),
        None => Err(syn::Error::new(
            input.ident.span(),
            "#[derive(RingMessage)] needs a stable message type id: add #[message(type_id = N)] \
             (a u32 unique among the message types of your program)",
        )),
    }
}

/// Expands `#[derive(RingMessage)]`.
pub fn derive(input: DeriveInput) -> syn::Result<TokenStream> {
    let args = parse_args(&input)?;
    let s = parse_plain(&input, "RingMessage")?;
    let core = core_path();
    let ident = &s.ident;
    let type_id = &args.type_id;
    let name = args
        .name
        .map(|n| n.value())
        .unwrap_or_else(|| ident.to_string());
    let checks = pod_checks(&s, &core, "RingMessage");
    let impls = pod_impls(&s, &core);
    Ok(quote! {
        #checks
        #impls
        impl #core::message::RingMessage for #ident {
            const TYPE_ID: u32 = #type_id;
            const NAME: &'static str = #name;
        }
    })
}
