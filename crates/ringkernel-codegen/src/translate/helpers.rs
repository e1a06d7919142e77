//! Helper functions: plain `fn`s with scalar parameters and a scalar result, called from
//! a kernel (or from each other) and translated as CUDA `__device__` functions and WGSL
//! module functions.

use super::*;

/// The signature of a helper as callers see it.
#[derive(Debug, Clone)]
pub(crate) struct HelperSig {
    pub(crate) emitted: String,
    pub(crate) params: Vec<ScalarType>,
    pub(crate) ret: ScalarType,
}

pub(crate) type Helpers = Rc<HashMap<String, HelperSig>>;

const HELPER_RULES: &str =
    "helper functions take scalar parameters (f32, i32, u32, bool; f64, i64 \
     and u64 on CUDA) and return a scalar";

/// The helpers defined at the top level of `f`'s body (`fn name(..) -> T { .. }` items).
pub(crate) fn nested_helpers(f: &syn::ItemFn) -> Vec<&syn::ItemFn> {
    f.block
        .stmts
        .iter()
        .filter_map(|s| match s {
            Stmt::Item(syn::Item::Fn(h)) => Some(h),
            _ => None,
        })
        .collect()
}

fn signature(h: &syn::ItemFn, target: Target, structs: &Structs) -> Res<HelperSig> {
    let sig = &h.sig;
    plain_signature(sig, "helper functions")?;
    let mut params = Vec::new();
    for arg in &sig.inputs {
        let syn::FnArg::Typed(pt) = arg else {
            return err(
                arg,
                "helper functions are free functions; `self` is not supported",
            );
        };
        match &*pt.pat {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {}
            other => return err(other, "parameters must be plain names (`x: f32`)"),
        }
        match parse_type(&pt.ty, target, structs)? {
            Ty::Scalar(s) if s != ScalarType::Usize => params.push(s),
            _ => return err(&pt.ty, HELPER_RULES),
        }
    }
    let ret = match &sig.output {
        syn::ReturnType::Type(_, t) => match parse_type(t, target, structs)? {
            Ty::Scalar(s) if s != ScalarType::Usize => s,
            _ => return err(t, HELPER_RULES),
        },
        syn::ReturnType::Default => {
            return err(
                &sig.ident,
                format!("a helper function returns a value; {HELPER_RULES}"),
            )
        }
    };
    Ok(HelperSig {
        emitted: format!("rk_fn_{}", syn::ext::IdentExt::unraw(&sig.ident)),
        params,
        ret,
    })
}

/// Names of the helpers `tokens` call (`name(` with `name` in `known`).
fn callees(
    tokens: proc_macro2::TokenStream,
    known: &HashMap<String, HelperSig>,
    out: &mut Vec<String>,
) {
    use proc_macro2::TokenTree;
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    for (k, tt) in tts.iter().enumerate() {
        match tt {
            TokenTree::Ident(i) => {
                let name = i.to_string();
                let called = matches!(tts.get(k + 1), Some(TokenTree::Group(g))
                    if g.delimiter() == proc_macro2::Delimiter::Parenthesis);
                if called && known.contains_key(&name) && !out.contains(&name) {
                    out.push(name);
                }
            }
            TokenTree::Group(g) => callees(g.stream(), known, out),
            _ => {}
        }
    }
}

/// Translates `helpers` for `target`: their signatures (for the kernel's calls) and the
/// text of their definitions (CUDA: prototypes first). Recursion is an error.
pub(crate) fn translate_helpers(
    helpers: &[&syn::ItemFn],
    target: Target,
    structs: &Rc<Structs>,
) -> Res<(Helpers, String)> {
    let mut sigs = HashMap::new();
    for h in helpers {
        let name = h.sig.ident.to_string();
        if sigs
            .insert(name.clone(), signature(h, target, structs)?)
            .is_some()
        {
            return err(&h.sig.ident, format!("helper `{name}` is defined twice"));
        }
    }
    // Recursion (direct or through other helpers) has no GPU form.
    let graph: HashMap<String, Vec<String>> = helpers
        .iter()
        .map(|h| {
            let mut c = Vec::new();
            callees(h.block.to_token_stream(), &sigs, &mut c);
            (h.sig.ident.to_string(), c)
        })
        .collect();
    for h in helpers {
        let start = h.sig.ident.to_string();
        let mut stack = graph[&start].clone();
        let mut seen = HashSet::new();
        while let Some(n) = stack.pop() {
            if n == start {
                return err(
                    &h.sig.ident,
                    format!("helper `{start}` calls itself (directly or through other helpers): recursion is not supported on the GPU"),
                );
            }
            if seen.insert(n.clone()) {
                stack.extend(graph[&n].iter().cloned());
            }
        }
    }
    let sigs = Rc::new(sigs);
    let mut text = String::new();
    if target == Target::Cuda {
        for h in helpers {
            let s = &sigs[&h.sig.ident.to_string()];
            let _ = writeln!(text, "{};", cuda_head(h, s, &mut Names::default())?);
        }
        text.push('\n');
    }
    for h in helpers {
        let mut tx = Tx::new(target, DEFAULT_HELPER_WG);
        tx.helpers = sigs.clone();
        tx.structs = structs.clone();
        text.push_str(&tx.helper(h, &sigs[&h.sig.ident.to_string()])?);
        text.push('\n');
    }
    Ok((sigs, text))
}

const DEFAULT_HELPER_WG: [u32; 3] = [1, 1, 1];

fn cuda_head(h: &syn::ItemFn, s: &HelperSig, names: &mut Names) -> Res<String> {
    let mut args = Vec::new();
    for (arg, t) in h.sig.inputs.iter().zip(&s.params) {
        let syn::FnArg::Typed(pt) = arg else {
            unreachable!("checked by signature()")
        };
        let Pat::Ident(pi) = &*pt.pat else {
            unreachable!("checked by signature()")
        };
        args.push(format!("{} {}", t.cuda_name(), names.fresh(&pi.ident)?));
    }
    Ok(format!(
        "__device__ {} {}({})",
        s.ret.cuda_name(),
        s.emitted,
        args.join(", ")
    ))
}

impl Tx {
    /// One helper's definition.
    fn helper(mut self, h: &syn::ItemFn, s: &HelperSig) -> Res<String> {
        let ret = Ty::Scalar(s.ret);
        self.func_ret = Some(ret.clone());
        let mut params = Vec::new();
        for (arg, t) in h.sig.inputs.iter().zip(&s.params) {
            let syn::FnArg::Typed(pt) = arg else {
                unreachable!("checked by signature()")
            };
            let Pat::Ident(pi) = &*pt.pat else {
                unreachable!("checked by signature()")
            };
            let emitted = self.declare(&pi.ident, Ty::Scalar(*t), pi.mutability.is_some())?;
            params.push((emitted, *t, pi.mutability.is_some(), pi.ident.clone()));
        }
        let head = if self.cuda() {
            let args: Vec<String> = params
                .iter()
                .map(|(n, t, _, _)| format!("{} {n}", t.cuda_name()))
                .collect();
            format!(
                "__device__ {} {}({})",
                s.ret.cuda_name(),
                s.emitted,
                args.join(", ")
            )
        } else {
            let mut args = Vec::new();
            for (n, t, m, id) in &params {
                // WGSL parameters are immutable: a `mut` one is copied into a `var`.
                let name = if *m { format!("rk_arg_{n}") } else { n.clone() };
                args.push(format!("{name}: {}", self.sname(*t, id)?));
            }
            format!(
                "fn {}({}) -> {}",
                s.emitted,
                args.join(", "),
                self.sname(s.ret, &h.sig.output)?
            )
        };
        if !self.cuda() {
            for (n, t, m, id) in &params {
                if *m {
                    let tn = self.sname(*t, id)?;
                    self.line(&format!("var {n}: {tn} = rk_arg_{n};"));
                }
            }
        }
        let ret_var = self.names.temp("ret");
        let d = self.decl(&ret_var, &ret, &h.sig.output)?;
        self.line(&if self.cuda() {
            format!("{d} = {};", self.zero_of(s.ret))
        } else {
            format!("var {d};")
        });
        self.block_stmts(&h.block, Some((&ret_var, &ret)))?;
        self.line(&format!("return {ret_var};"));
        Ok(format!("{head} {{\n{}}}\n", self.out))
    }

    fn zero_of(&self, s: ScalarType) -> &'static str {
        match s {
            ScalarType::F32 => "0.0f",
            ScalarType::F64 => "0.0",
            ScalarType::Bool => "false",
            _ => "0",
        }
    }

    /// `name(args)` of a helper.
    pub(super) fn helper_call(&mut self, c: &syn::ExprCall, h: &HelperSig) -> Res<Val> {
        if c.args.len() != h.params.len() {
            return err(
                c,
                format!(
                    "this helper takes {} argument{}",
                    h.params.len(),
                    if h.params.len() == 1 { "" } else { "s" }
                ),
            );
        }
        let mut args = Vec::new();
        for (a, t) in c.args.iter().zip(&h.params) {
            let want = Ty::Scalar(*t);
            let (code, got) = self.expr(a, Some(&want))?;
            self.expect_ty(&got, &want, a)?;
            args.push(code);
        }
        Ok((
            format!("{}({})", h.emitted, args.join(", ")),
            Ty::Scalar(h.ret),
        ))
    }
}
