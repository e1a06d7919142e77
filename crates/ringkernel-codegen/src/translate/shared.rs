//! Shared (workgroup) memory and barriers: `let mut s = shared_array::<T, N>();` and
//! `sync_threads();`.

use super::*;
use crate::types::check_shared_len;

/// The last path segment of a call of a dsl function named `name` (`name(..)` or
/// `dsl::name(..)`, any prefix ending in `dsl`).
pub(super) fn dsl_call<'c>(c: &'c syn::ExprCall, name: &str) -> Option<&'c syn::PathSegment> {
    let Expr::Path(p) = peel(&c.func) else {
        return None;
    };
    let segs = &p.path.segments;
    let last = segs.last()?;
    let dsl = segs.len() == 1 || segs.iter().rev().nth(1).is_some_and(|s| s.ident == "dsl");
    (dsl && p.qself.is_none() && last.ident == name).then_some(last)
}

/// The line a WGSL `sync_threads()` starts with until the kernel's end decides whether
/// it is `storageBarrier();` or nothing.
pub(super) const STORAGE_BARRIER_MARK: &str = "rk_storage_barrier_mark;";

impl Tx {
    /// `let mut name = shared_array::<T, N>();` at the kernel's top level: one array per
    /// block (CUDA `__shared__`, WGSL `var<workgroup>` at module scope).
    pub(super) fn shared_local(
        &mut self,
        pi: &syn::PatIdent,
        annot: Option<&Ty>,
        call: &syn::ExprCall,
        seg: &syn::PathSegment,
    ) -> Res<()> {
        let usage = "shared arrays are declared as `let mut name = shared_array::<T, N>();` \
                     with a scalar element type T and a literal length N";
        if !call.args.is_empty() {
            return err(
                &call.args,
                format!("`shared_array` takes no arguments; {usage}"),
            );
        }
        if self.stencil.is_some() {
            return err(
                call,
                "shared arrays and barriers are not available in stencil kernels (their \
                 out-of-grid threads return early); write a global kernel",
            );
        }
        if self.scopes.len() != 1 || self.loops > 0 {
            return err(
                call,
                "shared arrays are declared at the top level of the kernel body (not inside \
                 `if`, loops or blocks): they exist once per block",
            );
        }
        if pi.mutability.is_none() {
            return err(
                pi,
                format!("a shared array must be declared `let mut`; {usage}"),
            );
        }
        let syn::PathArguments::AngleBracketed(ab) = &seg.arguments else {
            return err(call, usage);
        };
        let args: Vec<&syn::GenericArgument> = ab.args.iter().collect();
        let [syn::GenericArgument::Type(t), len_arg] = args.as_slice() else {
            return err(ab, usage);
        };
        let len_expr = match len_arg {
            syn::GenericArgument::Const(e) => e,
            other => return err(other, usage),
        };
        let len = match peel(len_expr) {
            Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            }) => i.base10_parse::<usize>()?,
            Expr::Block(b) => match b.block.stmts.as_slice() {
                [Stmt::Expr(
                    Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i),
                        ..
                    }),
                    None,
                )] => i.base10_parse::<usize>()?,
                _ => return err(len_expr, usage),
            },
            _ => return err(len_expr, usage),
        };
        check_shared_len(len, len_arg)?;
        let elem = match self.parse_ty(t)? {
            Ty::Scalar(ScalarType::Usize) => {
                return err(
                    t,
                    "`usize` has no fixed size on the GPU; use `u32` or `i32`",
                )
            }
            Ty::Scalar(ScalarType::Bool) if !self.cuda() => {
                return err(
                    t,
                    "`bool` cannot be in WGSL workgroup memory; use `u32` (0 or 1)",
                )
            }
            Ty::Scalar(s) => s,
            _ => return err(t, "shared array elements must be scalars"),
        };
        let ty = Ty::Array { elem, len };
        if let Some(a) = annot {
            if !matches!(a, Ty::Array { .. }) {
                return err(pi, usage);
            }
            self.expect_ty(&ty, a, call)?;
        }
        let name = self.declare(&pi.ident, ty, true)?;
        let tname = self.sname(elem, t)?;
        if self.cuda() {
            self.line(&format!("__shared__ {tname} {name}[{len}];"));
        } else {
            let _ = writeln!(
                self.workgroup_globals,
                "var<workgroup> {name}: array<{tname}, {len}>;"
            );
        }
        Ok(())
    }

    /// `sync_threads();`: a barrier of the block (CUDA `__syncthreads()`, WGSL
    /// `workgroupBarrier()`, which also orders workgroup memory).
    pub(super) fn sync_stmt(&mut self, c: &syn::ExprCall) -> Res<()> {
        if !c.args.is_empty() {
            return err(&c.args, "`sync_threads()` takes no arguments");
        }
        if self.stencil.is_some() {
            return err(
                c,
                "shared arrays and barriers are not available in stencil kernels (their \
                 out-of-grid threads return early); write a global kernel",
            );
        }
        if self.cuda() {
            self.line("__syncthreads();");
        } else {
            // Storage writes too, where the kernel may need them (CUDA's barrier orders
            // global memory within the block): decided once the whole kernel is known,
            // see `barrier`.
            self.line(STORAGE_BARRIER_MARK);
            self.line("workgroupBarrier();");
        }
        Ok(())
    }
}
