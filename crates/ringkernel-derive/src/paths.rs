//! Where the generated code finds `ringkernel-core`.

use proc_macro2::{Span, TokenStream};
use proc_macro_crate::{crate_name, FoundCrate};
use quote::quote;

/// The path of `ringkernel-core` as the user's crate sees it: `::ringkernel_core` (or
/// its renamed form) when the user depends on it directly, `::ringkernel::core` (or the
/// facade's renamed form) when the user depends only on the `ringkernel` facade.
pub fn core_path() -> TokenStream {
    match crate_name("ringkernel-core") {
        // Inside ringkernel-core's own tests, examples and doc tests the crate is an
        // extern crate under its own name.
        Ok(FoundCrate::Itself) => quote!(::ringkernel_core),
        Ok(FoundCrate::Name(n)) => {
            let id = syn::Ident::new(&n, Span::call_site());
            quote!(::#id)
        }
        Err(_) => match crate_name("ringkernel") {
            Ok(FoundCrate::Itself) => quote!(::ringkernel::core),
            Ok(FoundCrate::Name(n)) => {
                let id = syn::Ident::new(&n, Span::call_site());
                quote!(::#id::core)
            }
            // Neither found (e.g. an unusual build system): assume the direct name.
            Err(_) => quote!(::ringkernel_core),
        },
    }
}
