//! Math methods, `GridPos` neighbours and atomics.

use super::*;

impl Tx {
    pub(super) fn is_atomic(&self, base: &Var) -> bool {
        self.target == Target::Wgsl
            && matches!(base.ty, Ty::Slice { .. })
            && self.atomics.contains(&base.emitted)
    }

    /// `atomic_add(&mut data[i], v)` and the other atomics: the element's old value.
    pub(super) fn atomic_call(
        &mut self,
        c: &syn::ExprCall,
        name: &str,
        cuda_fn: &str,
        wgsl_fn: &str,
    ) -> Res<Val> {
        let usage = || {
            err(
                c,
                format!(
                    "atomics take an element of a `&mut [u32]` or `&mut [i32]` parameter and a \
                     value: `{name}(&mut data[i], v)`"
                ),
            )
        };
        if c.args.len() != 2 {
            return usage();
        }
        let Expr::Reference(r) = peel(&c.args[0]) else {
            return usage();
        };
        let Expr::Index(ix) = peel(&r.expr) else {
            return usage();
        };
        if r.mutability.is_none() {
            return usage();
        }
        let (code, ty, base) = self.index(ix)?;
        let elem = match base.ty {
            Ty::Slice {
                elem: e @ (ScalarType::U32 | ScalarType::I32),
                mutable: true,
            } => e,
            _ => return usage(),
        };
        let (v, vt) = self.expr(&c.args[1], Some(&ty))?;
        self.expect_ty(&vt, &ty, &c.args[1])?;
        let f = if self.cuda() { cuda_fn } else { wgsl_fn };
        Ok((format!("{f}(&{code}, {v})"), Ty::Scalar(elem)))
    }

    /// `recv.method(args)` for the math methods; `ty` is the type named in the
    /// `f32::method(recv, ...)` form.
    pub(super) fn math(
        &mut self,
        ty: Option<ScalarType>,
        recv: &Expr,
        method: &syn::Ident,
        args: &[&Expr],
        whole: &dyn ToTokens,
        expected: Option<&Ty>,
    ) -> Res<Val> {
        let hint = ty.map(Ty::Scalar).or_else(|| expected.cloned());
        let (r, rt) = self.expr(recv, hint.as_ref())?;
        let Some(s) = rt.scalar() else {
            if method == "len" && matches!(rt, Ty::Slice { .. }) {
                return err(
                    method,
                    "`len()` is not supported (a CUDA pointer has no length); pass the length \
                     as a parameter",
                );
            }
            return err(
                recv,
                format!("`{}` has no methods in the kernel subset", rt.describe()),
            );
        };
        if let Some(t) = ty {
            self.expect_ty(&rt, &Ty::Scalar(t), recv)?;
        }
        let m = method.to_string();
        let arity = |n: usize| -> Res<()> {
            if args.len() != n {
                return err(
                    whole,
                    format!("`{m}` takes {n} argument{}", if n == 1 { "" } else { "s" }),
                );
            }
            Ok(())
        };
        let mut a = Vec::new();
        for x in args {
            let (c, t) = self.expr(x, Some(&rt))?;
            self.expect_ty(&t, &rt, x)?;
            a.push(c);
        }
        let cuda = self.cuda();
        if s.is_float() {
            let f32 = s == ScalarType::F32;
            // (rust name, C name, WGSL name, arity)
            let unary: &[(&str, &str, &str)] = &[
                ("sqrt", "sqrt", "sqrt"),
                ("exp", "exp", "exp"),
                ("exp2", "exp2", "exp2"),
                ("ln", "log", "log"),
                ("log2", "log2", "log2"),
                ("sin", "sin", "sin"),
                ("cos", "cos", "cos"),
                ("tan", "tan", "tan"),
                ("tanh", "tanh", "tanh"),
                ("sinh", "sinh", "sinh"),
                ("cosh", "cosh", "cosh"),
                ("asin", "asin", "asin"),
                ("acos", "acos", "acos"),
                ("atan", "atan", "atan"),
                ("abs", "fabs", "abs"),
                ("floor", "floor", "floor"),
                ("ceil", "ceil", "ceil"),
                ("trunc", "trunc", "trunc"),
            ];
            let binary: &[(&str, &str, &str)] = &[
                ("powf", "pow", "pow"),
                ("min", "fmin", "min"),
                ("max", "fmax", "max"),
                ("atan2", "atan2", "atan2"),
            ];
            let cname = |c: &str| if f32 { format!("{c}f") } else { c.to_string() };
            if let Some((_, c, w)) = unary.iter().find(|(n, _, _)| *n == m) {
                arity(0)?;
                let f = if cuda { cname(c) } else { (*w).to_string() };
                return Ok((format!("{f}({r})"), rt));
            }
            if let Some((_, c, w)) = binary.iter().find(|(n, _, _)| *n == m) {
                arity(1)?;
                let f = if cuda { cname(c) } else { (*w).to_string() };
                return Ok((format!("{f}({r}, {})", a[0]), rt));
            }
            match m.as_str() {
                "mul_add" => {
                    arity(2)?;
                    let f = if cuda { cname("fma") } else { "fma".into() };
                    return Ok((format!("{f}({r}, {}, {})", a[0], a[1]), rt));
                }
                "clamp" => {
                    arity(2)?;
                    return Ok(if cuda {
                        (
                            format!(
                                "{}({}({r}, {}), {})",
                                cname("fmin"),
                                cname("fmax"),
                                a[0],
                                a[1]
                            ),
                            rt,
                        )
                    } else {
                        (format!("clamp({r}, {}, {})", a[0], a[1]), rt)
                    });
                }
                "recip" => {
                    arity(0)?;
                    let one = self.float_literal(1.0, s, whole)?;
                    return Ok((format!("({one} / {r})"), rt));
                }
                _ => {}
            }
        } else if s.is_int() {
            match m.as_str() {
                "min" | "max" => {
                    arity(1)?;
                    return Ok((format!("{m}({r}, {})", a[0]), rt));
                }
                "abs" if s == ScalarType::I32 => {
                    arity(0)?;
                    return Ok((format!("abs({r})"), rt));
                }
                "abs" if s == ScalarType::I64 => {
                    arity(0)?;
                    return Ok((format!("llabs({r})"), rt));
                }
                "clamp" => {
                    arity(2)?;
                    return Ok(if cuda {
                        (format!("min(max({r}, {}), {})", a[0], a[1]), rt)
                    } else {
                        (format!("clamp({r}, {}, {})", a[0], a[1]), rt)
                    });
                }
                "wrapping_add" | "wrapping_sub" | "wrapping_mul" => {
                    arity(1)?;
                    let op = match m.as_str() {
                        "wrapping_add" => "+",
                        "wrapping_sub" => "-",
                        _ => "*",
                    };
                    if cuda && s == ScalarType::I32 {
                        // Signed overflow is undefined in C: wrap through unsigned.
                        return Ok((
                            format!("((int)((unsigned int)({r}) {op} (unsigned int)({})))", a[0]),
                            rt,
                        ));
                    }
                    if cuda && s == ScalarType::I64 {
                        return Ok((
                            format!(
                                "((long long)((unsigned long long)({r}) {op} (unsigned long long)({})))",
                                a[0]
                            ),
                            rt,
                        ));
                    }
                    return Ok((format!("({r} {op} {})", a[0]), rt));
                }
                _ => {}
            }
        }
        err(
            method,
            format!(
                "unsupported method `{m}` on `{}`; supported: float sqrt, exp, exp2, ln, log2, \
                 sin, cos, tan, tanh, sinh, cosh, asin, acos, atan, atan2, abs, floor, ceil, \
                 trunc, recip, powf, min, max, clamp, mul_add; integer min, max, clamp, abs \
                 (i32, i64), wrapping_add/sub/mul",
                s.rust_name()
            ),
        )
    }

    pub(super) fn grid_pos(&mut self, dims: u8, mc: &syn::ExprMethodCall) -> Res<Val> {
        let st = self
            .stencil
            .as_ref()
            .expect("GridPos only exists in stencil kernels");
        let halo = st.halo as i128;
        let m = mc.method.to_string();
        let i32t = Ty::Scalar(ScalarType::I32);
        let no_args = |what: &str| -> Res<()> {
            if !mc.args.is_empty() {
                return err(&mc.args, format!("`{what}()` takes no arguments"));
            }
            Ok(())
        };
        let simple = match (m.as_str(), dims) {
            ("x", _) => Some(("rk_x", i32t.clone())),
            ("y", _) => Some(("rk_y", i32t.clone())),
            ("z", 3) => Some(("rk_z", i32t.clone())),
            ("nx", _) => Some(("rk_nx", i32t.clone())),
            ("ny", _) => Some(("rk_ny", i32t.clone())),
            ("nz", 3) => Some(("rk_nz", i32t.clone())),
            ("idx", _) => Some(("rk_idx", Ty::Scalar(ScalarType::Usize))),
            _ => None,
        };
        if let Some((code, ty)) = simple {
            no_args(&m)?;
            return Ok((code.to_string(), ty));
        }
        // Neighbours: (method, dx, dy, dz).
        let fixed: &[(&str, i32, i32, i32)] = &[
            ("north", 0, -1, 0),
            ("south", 0, 1, 0),
            ("west", -1, 0, 0),
            ("east", 1, 0, 0),
            ("down", 0, 0, -1),
            ("up", 0, 0, 1),
        ];
        let buf_of = |this: &Self, e: &Expr| -> Res<Var> {
            let inner = match peel(e) {
                Expr::Reference(r) if r.mutability.is_none() => peel(&r.expr),
                other => other,
            };
            let Expr::Path(p) = inner else {
                return err(
                    e,
                    "the neighbour's buffer must be a slice parameter (`&buf`)",
                );
            };
            let v = this.lookup(path_ident(p)?)?;
            if !matches!(v.ty, Ty::Slice { .. }) {
                return err(
                    e,
                    "the neighbour's buffer must be a slice parameter (`&buf`)",
                );
            }
            Ok(v)
        };
        if let Some((_, dx, dy, dz)) = fixed
            .iter()
            .find(|(n, _, _, dz)| *n == m && (dims == 3 || *dz == 0))
        {
            if mc.args.len() != 1 {
                return err(mc, format!("`{m}` takes the buffer: `pos.{m}(&buf)`"));
            }
            let v = buf_of(self, &mc.args[0])?;
            let Ty::Slice { elem, .. } = v.ty else {
                unreachable!()
            };
            let (off, sign) = match (dx, dy, dz) {
                (1, _, _) | (-1, _, _) => (if self.cuda() { "1ull" } else { "1u" }, *dx),
                (_, 1, _) | (_, -1, _) => ("rk_sy", *dy),
                _ => ("rk_sz", *dz),
            };
            let op = if sign > 0 { "+" } else { "-" };
            return Ok((
                format!("{}[rk_idx {op} {off}]", v.emitted),
                Ty::Scalar(elem),
            ));
        }
        if m == "at" {
            let want = dims as usize + 1;
            if mc.args.len() != want {
                let form = if dims == 2 {
                    "pos.at(&buf, dx, dy)"
                } else {
                    "pos.at(&buf, dx, dy, dz)"
                };
                return err(
                    mc,
                    format!("`at` takes the buffer and {dims} offsets: `{form}`"),
                );
            }
            let v = buf_of(self, &mc.args[0])?;
            let Ty::Slice { elem, .. } = v.ty else {
                unreachable!()
            };
            let mut offs = Vec::new();
            for a in mc.args.iter().skip(1) {
                let lit = match peel(a) {
                    Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i),
                        ..
                    }) => Some(i.base10_parse::<i128>()?),
                    Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => match peel(&u.expr) {
                        Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Int(i),
                            ..
                        }) => Some(-i.base10_parse::<i128>()?),
                        _ => None,
                    },
                    _ => None,
                };
                if let Some(l) = lit {
                    if l.abs() > halo {
                        return err(
                            a,
                            format!("offset {l} reaches past the halo of {halo} cells"),
                        );
                    }
                }
                let (c, t) = self.expr(a, Some(&i32t))?;
                self.expect_ty(&t, &i32t, a)?;
                offs.push(c);
            }
            let strides = ["", "rk_sy", "rk_sz"];
            let idx = if self.cuda() {
                let mut s = "(long long)rk_idx".to_string();
                for (k, o) in offs.iter().enumerate() {
                    if k == 0 {
                        let _ = write!(s, " + (long long)({o})");
                    } else {
                        let _ = write!(s, " + (long long)({o}) * (long long){}", strides[k]);
                    }
                }
                format!("(unsigned long long)({s})")
            } else {
                let mut s = "i32(rk_idx)".to_string();
                for (k, o) in offs.iter().enumerate() {
                    if k == 0 {
                        let _ = write!(s, " + {o}");
                    } else {
                        let _ = write!(s, " + {o} * i32({})", strides[k]);
                    }
                }
                format!("u32({s})")
            };
            return Ok((format!("{}[{idx}]", v.emitted), Ty::Scalar(elem)));
        }
        let list = if dims == 2 {
            "x, y, nx, ny, idx, north, south, west, east, at"
        } else {
            "x, y, z, nx, ny, nz, idx, north, south, west, east, up, down, at"
        };
        err(
            &mc.method,
            format!("unsupported `GridPos` method `{m}`; supported: {list}"),
        )
    }
}

/// The CUDA and WGSL names of a call of a dsl atomic function.
pub(super) fn atomic_fn(c: &syn::ExprCall) -> Option<(&'static str, &'static str)> {
    let Expr::Path(p) = peel(&c.func) else {
        return None;
    };
    let last = p.path.segments.last()?.ident.to_string();
    ATOMICS
        .iter()
        .find(|(n, _, _)| *n == last)
        .map(|(_, cu, w)| (*cu, *w))
}

/// (dsl name, CUDA function, WGSL function).
const ATOMICS: &[(&str, &str, &str)] = &[
    ("atomic_add", "atomicAdd", "atomicAdd"),
    ("atomic_sub", "atomicSub", "atomicSub"),
    ("atomic_min", "atomicMin", "atomicMin"),
    ("atomic_max", "atomicMax", "atomicMax"),
    ("atomic_and", "atomicAnd", "atomicAnd"),
    ("atomic_or", "atomicOr", "atomicOr"),
    ("atomic_xor", "atomicXor", "atomicXor"),
    ("atomic_exchange", "atomicExch", "atomicExchange"),
];

/// Names `x` of every `atomic_*(&mut x[...], ...)` in `tokens`.
pub(super) fn atomic_targets(tokens: proc_macro2::TokenStream, out: &mut HashSet<syn::Ident>) {
    use proc_macro2::TokenTree;
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    for (k, tt) in tts.iter().enumerate() {
        let TokenTree::Group(g) = tt else {
            continue;
        };
        let is_call = k > 0
            && matches!(&tts[k - 1], TokenTree::Ident(i)
                if ATOMICS.iter().any(|(n, _, _)| i == n));
        if is_call && g.delimiter() == proc_macro2::Delimiter::Parenthesis {
            let inner: Vec<TokenTree> = g.stream().into_iter().take(3).collect();
            if let [TokenTree::Punct(amp), TokenTree::Ident(m), TokenTree::Ident(name)] =
                inner.as_slice()
            {
                if amp.as_char() == '&' && m == "mut" {
                    out.insert(name.clone());
                }
            }
        }
        atomic_targets(g.stream(), out);
    }
}

/// Whether `tokens` call an atomic function anywhere.
pub(super) fn calls_atomic(tokens: proc_macro2::TokenStream) -> bool {
    use proc_macro2::TokenTree;
    tokens.into_iter().any(|tt| match tt {
        TokenTree::Ident(i) => ATOMICS.iter().any(|(n, _, _)| i == n),
        TokenTree::Group(g) => calls_atomic(g.stream()),
        _ => false,
    })
}
