//! Expressions, literals and constants.

use super::*;

impl Tx {
    /// Translates `a` and `b` that must have one type: an untyped literal side takes the
    /// other side's type.
    pub(super) fn pair(&mut self, a: &Expr, b: &Expr, expected: Option<&Ty>) -> Res<(Val, Val)> {
        if is_untyped(a) && !is_untyped(b) {
            let vb = self.expr(b, expected)?;
            let va = self.expr(a, Some(&vb.1))?;
            Ok((va, vb))
        } else {
            let va = self.expr(a, expected)?;
            let vb = self.expr(b, Some(&va.1))?;
            Ok((va, vb))
        }
    }

    pub(super) fn expr(&mut self, e: &Expr, expected: Option<&Ty>) -> Res<Val> {
        // A 64-bit field may be read on WGSL only as the whole value of a field
        // assignment (see `wide_move`); the flag holds for this expression, not its parts.
        let wide = std::mem::replace(&mut self.wide_move, false);
        match e {
            Expr::Lit(l) => self.literal(&l.lit, expected),
            Expr::Paren(p) => {
                self.wide_move = wide;
                let (c, t) = self.expr(&p.expr, expected)?;
                Ok((format!("({c})"), t))
            }
            Expr::Group(g) => {
                self.wide_move = wide;
                self.expr(&g.expr, expected)
            }
            Expr::Path(p) => self.path_value(p),
            Expr::Field(f)
                if matches!(&f.member, syn::Member::Unnamed(i) if i.index == 0)
                    && self.is_ctx_call(&f.base, "kernel_id") =>
            {
                Ok((self.ctx_kernel_id(), Ty::Scalar(ScalarType::U32)))
            }
            Expr::Unary(u) if matches!(u.op, UnOp::Deref(_)) && self.handler.is_some() => {
                match self.deref_state(u) {
                    Some(r) => {
                        let r = r?;
                        Ok((r.code, r.ty))
                    }
                    None => self.unary(u, expected),
                }
            }
            Expr::Field(_) => {
                let r = self.place_ref(e)?;
                self.check_wide(&r.ty, wide, e)?;
                Ok((r.code, r.ty))
            }
            Expr::Struct(st) => self.struct_literal(st),
            Expr::Binary(b) => {
                if compound_op(&b.op).is_some() {
                    return err(e, "compound assignment is a statement, not a value");
                }
                self.binary(b, expected)
            }
            Expr::Unary(u) => self.unary(u, expected),
            Expr::Cast(c) => self.cast(c),
            Expr::Index(ix) => {
                let (code, ty, base) = self.index(ix)?;
                self.check_wide(&ty, wide, e)?;
                if self.is_atomic(&base) {
                    return Ok((format!("atomicLoad(&{code})"), ty));
                }
                Ok((code, ty))
            }
            Expr::MethodCall(mc) => self.method_call(mc, expected),
            Expr::Call(c) => self.call(c, expected),
            Expr::If(i) if self.is_simple_if(e) => self.if_value(i, expected),
            Expr::Block(b) if b.label.is_none() => match b.block.stmts.as_slice() {
                [Stmt::Expr(inner, None)] => {
                    let (c, t) = self.expr(inner, expected)?;
                    Ok((format!("({c})"), t))
                }
                _ => err(
                    e,
                    "a block with statements is a value only as a `let` initializer or the \
                     right side of an assignment",
                ),
            },
            Expr::If(_) | Expr::Match(_) => err(
                e,
                "an `if` with statements in its branches, or a `match`, is a value only as a \
                 `let` initializer or the right side of an assignment",
            ),
            Expr::Assign(_) => err(e, "assignment is a statement, not a value"),
            Expr::Array(_) | Expr::Repeat(_) => {
                err(e, "array values are supported as `let` initializers only")
            }
            Expr::Reference(_) => err(
                e,
                "references are not supported here (`&buf` is accepted as a GridPos neighbour \
                 argument only)",
            ),
            Expr::Closure(_) => err(
                e,
                format!("closures are not supported in kernels; supported expressions: {SUPPORTED_EXPRS}"),
            ),
            Expr::Macro(m) => err(
                m,
                format!("macros are not supported in kernels; supported expressions: {SUPPORTED_EXPRS}"),
            ),
            Expr::Tuple(_) => err(e, "tuples are not supported in the kernel subset"),
            Expr::Range(_) => err(e, "ranges are supported as `for` loop iterators only"),
            Expr::Return(_) | Expr::Break(_) | Expr::Continue(_) => err(
                e,
                "`return`, `break` and `continue` are statements here, not values",
            ),
            Expr::Try(_) => err(e, "`?` is not supported in kernels"),
            Expr::Unsafe(_) => err(e, "`unsafe` blocks are not supported in kernels"),
            _ => err(
                e,
                format!("unsupported expression; supported expressions: {SUPPORTED_EXPRS}"),
            ),
        }
    }

    pub(super) fn int_literal(
        &self,
        v: i128,
        s: ScalarType,
        span_of: &dyn ToTokens,
    ) -> Res<String> {
        let (lo, hi): (i128, i128) = match s {
            ScalarType::I32 => (i32::MIN as i128, i32::MAX as i128),
            ScalarType::U32 => (0, u32::MAX as i128),
            ScalarType::Usize if self.target == Target::Wgsl => (0, u32::MAX as i128),
            ScalarType::Usize => (0, u64::MAX as i128),
            ScalarType::I64 => (i64::MIN as i128, i64::MAX as i128),
            ScalarType::U64 => (0, u64::MAX as i128),
            _ => return err(span_of, "an integer literal cannot have this type"),
        };
        if v < lo || v > hi {
            return err(
                span_of,
                format!("literal {v} does not fit in `{}`", s.rust_name()),
            );
        }
        if s == ScalarType::I64 || s == ScalarType::U64 {
            if self.target == Target::Wgsl {
                return Err(crate::types::no_wgsl_type(s, span_of));
            }
            return Ok(match (s, v == i64::MIN as i128) {
                (ScalarType::U64, _) => format!("{v}ull"),
                (_, true) => "(-9223372036854775807ll - 1ll)".to_string(),
                _ if v < 0 => format!("({v}ll)"),
                _ => format!("{v}ll"),
            });
        }
        if v < 0 {
            // Only i32 reaches here; i32::MIN has no positive literal to negate.
            let text = match (self.target, v == i32::MIN as i128) {
                (Target::Cuda, true) => "-2147483647 - 1".to_string(),
                (Target::Wgsl, true) => "-2147483647i - 1i".to_string(),
                (Target::Cuda, false) => format!("{v}"),
                (Target::Wgsl, false) => format!("{v}i"),
            };
            return Ok(format!("({text})"));
        }
        Ok(match (self.target, s) {
            (Target::Cuda, ScalarType::I32) => format!("{v}"),
            (Target::Cuda, ScalarType::U32) => format!("{v}u"),
            (Target::Cuda, _) => format!("{v}ull"),
            (Target::Wgsl, ScalarType::I32) => format!("{v}i"),
            (Target::Wgsl, _) => format!("{v}u"),
        })
    }

    pub(super) fn float_literal(
        &self,
        v: f64,
        s: ScalarType,
        span_of: &dyn ToTokens,
    ) -> Res<String> {
        if !v.is_finite() {
            return err(span_of, "float literal out of range");
        }
        Ok(match s {
            ScalarType::F32 => {
                let f = v as f32;
                if !f.is_finite() {
                    return err(span_of, "literal does not fit in `f32`");
                }
                let mut t = format!("{f:?}");
                if !t.contains(['.', 'e']) {
                    t.push_str(".0");
                }
                if self.cuda() && !t.contains('.') {
                    // `1e30f` is not valid C; give it a point.
                    t = t.replacen('e', ".0e", 1);
                }
                format!("{t}f")
            }
            ScalarType::F64 => {
                if self.target == Target::Wgsl {
                    return Err(crate::types::f64_error(span_of));
                }
                let mut t = format!("{v:?}");
                if !t.contains('.') {
                    t = if t.contains('e') {
                        t.replacen('e', ".0e", 1)
                    } else {
                        format!("{t}.0")
                    };
                }
                t
            }
            _ => return err(span_of, "a float literal cannot have this type"),
        })
    }

    pub(super) fn literal(&self, lit: &syn::Lit, expected: Option<&Ty>) -> Res<Val> {
        match lit {
            syn::Lit::Bool(b) => Ok((b.value.to_string(), Ty::Scalar(ScalarType::Bool))),
            syn::Lit::Int(i) => {
                let s = match i.suffix() {
                    "" => match expected.and_then(Ty::scalar) {
                        Some(s) if s.is_int() => s,
                        _ => ScalarType::I32,
                    },
                    suf => match ScalarType::from_name(suf) {
                        Some(s) if s.is_int() => s,
                        Some(s) if s.is_float() => {
                            let v: f64 = i.base10_parse()?;
                            return Ok((self.float_literal(v, s, i)?, Ty::Scalar(s)));
                        }
                        _ => {
                            return err(
                                i,
                                format!(
                                    "literal suffix `{suf}` is not supported; integers are i32, \
                                     u32, i64, u64 or usize"
                                ),
                            )
                        }
                    },
                };
                let v: i128 = i.base10_parse()?;
                Ok((self.int_literal(v, s, i)?, Ty::Scalar(s)))
            }
            syn::Lit::Float(f) => {
                let s = match f.suffix() {
                    "" => match expected.and_then(Ty::scalar) {
                        Some(s) if s.is_float() => s,
                        _ => ScalarType::F32,
                    },
                    "f32" => ScalarType::F32,
                    "f64" => ScalarType::F64,
                    suf => return err(f, format!("literal suffix `{suf}` is not supported")),
                };
                let v: f64 = f.base10_parse()?;
                Ok((self.float_literal(v, s, f)?, Ty::Scalar(s)))
            }
            other => err(
                other,
                "only integer, float and bool literals are supported in kernels",
            ),
        }
    }

    pub(super) fn path_value(&mut self, p: &syn::ExprPath) -> Res<Val> {
        if p.qself.is_none() && p.path.segments.len() >= 2 {
            return self.constant(p);
        }
        let ident = path_ident(p)?;
        let v = self.lookup(ident)?;
        if v.by_ref {
            return err(
                p,
                format!("`{ident}` is a reference: use `*{ident}` or its fields (`{ident}.x`)"),
            );
        }
        match &v.ty {
            Ty::Scalar(_)
            | Ty::Array { .. }
            | Ty::Slice { .. }
            | Ty::Struct(_)
            | Ty::StructSlice { .. } => Ok((v.emitted, v.ty)),
            Ty::GridPos { .. } => err(
                p,
                "a `GridPos` is used through its methods (`pos.idx()`, `pos.north(&buf)`, ...)",
            ),
            Ty::Unit => err(p, "unit values are not supported"),
            Ty::Context | Ty::Reply => err(
                p,
                "a handler uses its context as `ctx.send_to(KernelId(dest), &msg)` and \
                 `ctx.kernel_id().0` only",
            ),
        }
    }

    pub(super) fn constant(&self, p: &syn::ExprPath) -> Res<Val> {
        let segs: Vec<String> = p
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
        let tail = match segs.as_slice() {
            ["std" | "core", rest @ ..] => rest,
            all => all,
        };
        let unsupported = || {
            err(
                p,
                "unsupported path; constants supported: f32/f64::{MAX, MIN, EPSILON, \
                 INFINITY, NEG_INFINITY, consts::PI, consts::E}, i32/u32::{MAX, MIN}",
            )
        };
        let (ty, name) = match tail {
            [t, n] => (*t, *n),
            [t, "consts", n] => (*t, *n),
            _ => return unsupported(),
        };
        let Some(s) = ScalarType::from_name(ty) else {
            return unsupported();
        };
        if s.is_float() {
            let v = match name {
                "MAX" => f32::MAX as f64,
                "MIN" => f32::MIN as f64,
                "EPSILON" => f32::EPSILON as f64,
                "PI" => std::f64::consts::PI,
                "E" => std::f64::consts::E,
                "INFINITY" | "NEG_INFINITY" => {
                    let sign = if name == "INFINITY" { "" } else { "-" };
                    if s == ScalarType::F64 && self.target == Target::Wgsl {
                        return Err(crate::types::f64_error(p));
                    }
                    let code = match self.target {
                        Target::Cuda if s == ScalarType::F32 => {
                            format!("({sign}__int_as_float(0x7f800000))")
                        }
                        Target::Cuda => {
                            format!("({sign}__longlong_as_double(0x7ff0000000000000ll))")
                        }
                        Target::Wgsl => format!("({sign}bitcast<f32>(0x7f800000u))"),
                    };
                    return Ok((code, Ty::Scalar(s)));
                }
                _ => return unsupported(),
            };
            let v = if s == ScalarType::F64 {
                match name {
                    "MAX" => f64::MAX,
                    "MIN" => f64::MIN,
                    "EPSILON" => f64::EPSILON,
                    _ => v,
                }
            } else {
                v
            };
            return Ok((self.float_literal(v, s, p)?, Ty::Scalar(s)));
        }
        if s.is_int() && s != ScalarType::Usize {
            let v: i128 = match (s, name) {
                (ScalarType::I32, "MAX") => i32::MAX as i128,
                (ScalarType::I32, "MIN") => i32::MIN as i128,
                (ScalarType::U32, "MAX") => u32::MAX as i128,
                (ScalarType::U32, "MIN") => 0,
                (ScalarType::I64, "MAX") => i64::MAX as i128,
                (ScalarType::I64, "MIN") => i64::MIN as i128,
                (ScalarType::U64, "MAX") => u64::MAX as i128,
                (ScalarType::U64, "MIN") => 0,
                _ => return unsupported(),
            };
            return Ok((self.int_literal(v, s, p)?, Ty::Scalar(s)));
        }
        unsupported()
    }

    pub(super) fn binary(&mut self, b: &syn::ExprBinary, expected: Option<&Ty>) -> Res<Val> {
        match &b.op {
            BinOp::And(_) | BinOp::Or(_) => {
                let bool_ty = Ty::Scalar(ScalarType::Bool);
                let (l, lt) = self.expr(&b.left, Some(&bool_ty))?;
                let (r, rt) = self.expr(&b.right, Some(&bool_ty))?;
                self.expect_ty(&lt, &bool_ty, &b.left)?;
                self.expect_ty(&rt, &bool_ty, &b.right)?;
                let op = if matches!(b.op, BinOp::And(_)) {
                    "&&"
                } else {
                    "||"
                };
                Ok((format!("({l} {op} {r})"), bool_ty))
            }
            BinOp::Shl(_) | BinOp::Shr(_) => {
                let (l, lt) = self.expr(&b.left, expected)?;
                let (r, rt) = self.expr(&b.right, None)?;
                self.binop_code(&b.op, (&l, &lt), (&r, &rt), &b.right)
            }
            BinOp::Eq(_)
            | BinOp::Ne(_)
            | BinOp::Lt(_)
            | BinOp::Le(_)
            | BinOp::Gt(_)
            | BinOp::Ge(_) => {
                let ((l, lt), (r, rt)) = self.pair(&b.left, &b.right, None)?;
                self.expect_ty(&rt, &lt, &b.right)?;
                let s = lt.scalar().ok_or_else(|| {
                    syn::Error::new_spanned(&b.left, "only scalars can be compared")
                })?;
                let op = match b.op {
                    BinOp::Eq(_) => "==",
                    BinOp::Ne(_) => "!=",
                    BinOp::Lt(_) => "<",
                    BinOp::Le(_) => "<=",
                    BinOp::Gt(_) => ">",
                    _ => ">=",
                };
                if s == ScalarType::Bool && !matches!(b.op, BinOp::Eq(_) | BinOp::Ne(_)) {
                    return err(&b.op, "bools can be compared with `==` and `!=` only");
                }
                Ok((format!("({l} {op} {r})"), Ty::Scalar(ScalarType::Bool)))
            }
            _ => {
                let ((l, lt), (r, rt)) = self.pair(&b.left, &b.right, expected)?;
                self.binop_code(&b.op, (&l, &lt), (&r, &rt), &b.right)
            }
        }
    }

    /// Code for `l op r` (arithmetic, bit and shift operators) with type checks.
    pub(super) fn binop_code(
        &self,
        op: &BinOp,
        (l, lt): (&str, &Ty),
        (r, rt): (&str, &Ty),
        rspan: &dyn ToTokens,
    ) -> Res<Val> {
        let ls = lt
            .scalar()
            .ok_or_else(|| syn::Error::new_spanned(op, "operators apply to scalars only"))?;
        let rs = rt
            .scalar()
            .ok_or_else(|| syn::Error::new_spanned(rspan, "operators apply to scalars only"))?;
        match op {
            BinOp::Shl(_) | BinOp::Shr(_) => {
                if !ls.is_int() || !rs.is_int() {
                    return err(op, "shifts apply to integers only");
                }
                let sym = if matches!(op, BinOp::Shl(_)) {
                    "<<"
                } else {
                    ">>"
                };
                let r = if self.cuda() {
                    r.to_string()
                } else {
                    self.convert(r, rs, ScalarType::U32)
                };
                return Ok((format!("({l} {sym} {r})"), lt.clone()));
            }
            _ => {}
        }
        self.expect_ty(rt, lt, rspan)?;
        if let Some(sym) = arith_op(op) {
            if ls == ScalarType::Bool {
                return err(op, "arithmetic does not apply to `bool`");
            }
            if sym == "%" && ls.is_float() && self.cuda() {
                let f = if ls == ScalarType::F32 {
                    "fmodf"
                } else {
                    "fmod"
                };
                return Ok((format!("{f}({l}, {r})"), lt.clone()));
            }
            return Ok((format!("({l} {sym} {r})"), lt.clone()));
        }
        let sym = match op {
            BinOp::BitAnd(_) => "&",
            BinOp::BitOr(_) => "|",
            BinOp::BitXor(_) => "^",
            _ => return err(op, "unsupported operator"),
        };
        if ls.is_float() {
            return err(op, "bit operators apply to integers and bools only");
        }
        if ls == ScalarType::Bool && sym == "^" {
            return Ok((format!("({l} != {r})"), lt.clone()));
        }
        Ok((format!("({l} {sym} {r})"), lt.clone()))
    }

    pub(super) fn unary(&mut self, u: &syn::ExprUnary, expected: Option<&Ty>) -> Res<Val> {
        match u.op {
            UnOp::Neg(_) => {
                // `-2147483648` is a valid i32 literal in Rust: fold the sign in.
                if let Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(li),
                    ..
                }) = peel(&u.expr)
                {
                    let s = match li.suffix() {
                        "" => match expected.and_then(Ty::scalar) {
                            Some(s) if s.is_int() => s,
                            _ => ScalarType::I32,
                        },
                        suf => ScalarType::from_name(suf).unwrap_or(ScalarType::I32),
                    };
                    if s.is_int() {
                        if !s.is_signed() {
                            return err(u, format!("cannot negate a `{}`", s.rust_name()));
                        }
                        let v: i128 = li.base10_parse()?;
                        return Ok((self.int_literal(-v, s, u)?, Ty::Scalar(s)));
                    }
                }
                let (c, t) = self.expr(&u.expr, expected)?;
                match t.scalar() {
                    Some(s) if s.is_signed() => Ok((format!("(-{c})"), t)),
                    _ => err(
                        u,
                        format!("cannot negate a value of type `{}`", t.describe()),
                    ),
                }
            }
            UnOp::Not(_) => {
                let (c, t) = self.expr(&u.expr, expected)?;
                match t.scalar() {
                    Some(ScalarType::Bool) => Ok((format!("(!{c})"), t)),
                    Some(s) if s.is_int() => Ok((format!("(~{c})"), t)),
                    _ => err(u, format!("`!` does not apply to `{}`", t.describe())),
                }
            }
            UnOp::Deref(_) => err(u, "dereferencing (`*x`) is not supported in kernels"),
            _ => err(u, "unsupported unary operator"),
        }
    }

    pub(super) fn cast(&mut self, c: &syn::ExprCast) -> Res<Val> {
        let to = self.parse_ty(&c.ty)?;
        let Some(ts) = to.scalar() else {
            return err(&c.ty, "`as` casts to scalar types only");
        };
        if ts == ScalarType::Bool {
            return err(
                &c.ty,
                "casting to `bool` is not allowed; compare with `!= 0`",
            );
        }
        let hint = if is_untyped(&c.expr) { None } else { Some(&to) };
        let (code, from) = self.expr(&c.expr, hint)?;
        let Some(fs) = from.scalar() else {
            return err(&c.expr, "only scalars can be cast with `as`");
        };
        if fs == ScalarType::Bool && ts.is_float() {
            return err(c, "a `bool` casts to integers only");
        }
        if self.cuda() {
            Ok((format!("(({})({code}))", ts.cuda_name()), to))
        } else {
            let t = self.sname(ts, &c.ty)?;
            Ok((format!("{t}({code})"), to))
        }
    }

    /// `base[i]`: code, element type, and the variable the place starts from.
    pub(super) fn index(&mut self, ix: &syn::ExprIndex) -> Res<(String, Ty, Var)> {
        let r = self.index_ref(ix)?;
        Ok((r.code, r.ty, r.root))
    }

    /// A place expression: a variable, an element of a slice or array (`a[i]`), a field
    /// of a struct (`p.x`, `ps[i].pos[2]`).
    pub(super) fn place_ref(&mut self, e: &Expr) -> Res<PlaceRef> {
        match peel(e) {
            Expr::Unary(u) if self.deref_state_ok(u) => self.deref_state(u).expect("checked"),
            Expr::Path(p) => {
                let v = self.lookup(path_ident(p)?)?;
                Ok(PlaceRef {
                    code: v.emitted.clone(),
                    ty: v.ty.clone(),
                    root: v,
                    root_expr: e.clone(),
                })
            }
            Expr::Index(ix) => self.index_ref(ix),
            Expr::Field(f) => {
                let base = self.place_ref(&f.base)?;
                let syn::Member::Named(member) = &f.member else {
                    return err(
                        &f.member,
                        "tuple fields (`.0`) are not supported; GpuType structs have named fields",
                    );
                };
                let Ty::Struct(sname) = &base.ty else {
                    return err(
                        &f.base,
                        format!(
                            "a `{}` has no fields (fields belong to GpuType structs)",
                            base.ty.describe()
                        ),
                    );
                };
                let def = self.struct_def(sname);
                let m = syn::ext::IdentExt::unraw(member).to_string();
                let Some(fd) = def.fields.iter().find(|fd| fd.name == m) else {
                    let names: Vec<&str> = def.fields.iter().map(|f| f.name.as_str()).collect();
                    return err(
                        member,
                        format!(
                            "struct `{sname}` has no field `{m}` (its fields: {})",
                            names.join(", ")
                        ),
                    );
                };
                Ok(PlaceRef {
                    code: format!("{}.{}", base.code, fd.emitted),
                    ty: fd.ty.clone(),
                    root: base.root,
                    root_expr: base.root_expr,
                })
            }
            other => err(
                other,
                "only variables, their elements (`data[i]`) and struct fields (`p.x`) can be \
                 indexed or have fields read",
            ),
        }
    }

    fn index_ref(&mut self, ix: &syn::ExprIndex) -> Res<PlaceRef> {
        let base = match peel(&ix.expr) {
            b @ (Expr::Path(_) | Expr::Field(_) | Expr::Index(_)) => self.place_ref(b)?,
            other => {
                return err(
                    other,
                    "only slices and arrays named by a variable can be indexed (`data[i]`)",
                )
            }
        };
        let elem = match &base.ty {
            Ty::Slice { elem, .. } | Ty::Array { elem, .. } => Ty::Scalar(*elem),
            Ty::StructSlice { name, .. } => Ty::Struct(name.clone()),
            other => {
                return err(
                    &ix.expr,
                    format!("a `{}` cannot be indexed", other.describe()),
                )
            }
        };
        if let Expr::Range(r) = peel(&ix.index) {
            return err(
                r,
                "sub-slices (`data[a..b]`) are not supported; index elements",
            );
        }
        let (i, it) = self.expr(&ix.index, Some(&Ty::Scalar(ScalarType::Usize)))?;
        if it.scalar().is_none_or(|s| !s.is_int()) {
            return err(&ix.index, "indices must be integers (usize, u32, i32)");
        }
        Ok(PlaceRef {
            code: format!("{}[{i}]", base.code),
            ty: elem,
            root: base.root,
            root_expr: base.root_expr,
        })
    }

    /// On WGSL a 64-bit value (a `u64`/`i64` field, stored as two words) can only be
    /// copied whole into another field (`wide` says that is what happens).
    fn check_wide(&self, ty: &Ty, wide: bool, span_of: &dyn ToTokens) -> Res<()> {
        if self.cuda() || wide {
            return Ok(());
        }
        match ty.scalar() {
            Some(s @ (ScalarType::U64 | ScalarType::I64)) => err(
                span_of,
                format!(
                    "a `{}` field can only be copied into another `{}` field in WGSL (a \
                     GpuType stores it as two 32-bit words; WGSL has no 64-bit arithmetic): \
                     `out.id = msg.id` or `Reply {{ id: msg.id, .. }}`",
                    s.rust_name(),
                    s.rust_name()
                ),
            ),
            _ => Ok(()),
        }
    }

    /// The value for a destination of type `want`: 64-bit fields are moved whole (see
    /// [`check_wide`](Self::check_wide)), everything else as usual.
    pub(super) fn value_for(&mut self, e: &Expr, want: &Ty) -> Res<Val> {
        self.wide_move = matches!(want.scalar(), Some(ScalarType::U64 | ScalarType::I64));
        let r = self.expr(e, Some(want));
        self.wide_move = false;
        r
    }

    /// `Name { field: value, .., ..base }` of a GpuType struct: a WGSL constructor call
    /// or a C++ aggregate, fields in declaration order.
    pub(super) fn struct_literal(&mut self, st: &syn::ExprStruct) -> Res<Val> {
        if st.qself.is_some() || st.path.segments.len() != 1 {
            return err(
                &st.path,
                "struct literals name a GpuType struct: `Name { .. }`",
            );
        }
        let name = st.path.segments[0].ident.to_string();
        let Some(def) = self.structs.get(&name).cloned() else {
            return err(
                &st.path,
                format!(
                    "unknown struct `{name}`: a struct used in a kernel derives `GpuType` and \
                     is defined above the kernel in the same module"
                ),
            );
        };
        let base = match &st.rest {
            Some(b) => {
                let r = self.place_ref(b)?;
                self.expect_ty(&r.ty, &Ty::Struct(name.clone()), b)?;
                Some(r.code)
            }
            None => None,
        };
        let mut given: HashMap<String, &Expr> = HashMap::new();
        for fv in &st.fields {
            let syn::Member::Named(m) = &fv.member else {
                return err(&fv.member, "GpuType structs have named fields");
            };
            let m = syn::ext::IdentExt::unraw(m).to_string();
            if !def.fields.iter().any(|f| f.name == m) {
                return err(&fv.member, format!("struct `{name}` has no field `{m}`"));
            }
            if calls_atomic(fv.expr.to_token_stream()) {
                return err(
                    &fv.expr,
                    "a field value cannot call an atomic (fields are set in declaration order, \
                     not in the order written); compute it into a `let` first",
                );
            }
            if given.insert(m.clone(), &fv.expr).is_some() {
                return err(&fv.member, format!("field `{m}` is given twice"));
            }
        }
        let mut parts = Vec::new();
        for fd in &def.fields {
            let code = match given.get(&fd.name) {
                None => match &base {
                    Some(b) => match (&fd.ty, self.cuda()) {
                        (Ty::Array { len, .. }, true) => {
                            let items: Vec<String> = (0..*len)
                                .map(|k| format!("{b}.{}[{k}]", fd.emitted))
                                .collect();
                            format!("{{{}}}", items.join(", "))
                        }
                        _ => format!("{b}.{}", fd.emitted),
                    },
                    None => {
                        return err(
                            st,
                            format!("missing field `{}` of struct `{name}`", fd.name),
                        )
                    }
                },
                Some(v) => self.field_value(v, &fd.ty)?,
            };
            parts.push(code);
        }
        let code = if self.cuda() {
            format!("{name}{{{}}}", parts.join(", "))
        } else {
            format!("{name}({})", parts.join(", "))
        };
        Ok((code, Ty::Struct(name)))
    }

    /// The value of a struct literal's field of type `want`: an array field takes an
    /// array literal or an array place (element by element in CUDA C).
    fn field_value(&mut self, v: &Expr, want: &Ty) -> Res<String> {
        if let Ty::Array { len, .. } = want {
            return match peel(v) {
                a @ (Expr::Array(_) | Expr::Repeat(_)) => Ok(self.array_init(a, Some(want))?.0),
                other => {
                    let r = self.place_ref(other)?;
                    self.expect_ty(&r.ty, want, other)?;
                    Ok(if self.cuda() {
                        let items: Vec<String> =
                            (0..*len).map(|k| format!("{}[{k}]", r.code)).collect();
                        format!("{{{}}}", items.join(", "))
                    } else {
                        r.code
                    })
                }
            };
        }
        let (c, t) = self.value_for(v, want)?;
        self.expect_ty(&t, want, v)?;
        Ok(c)
    }

    pub(super) fn if_value(&mut self, i: &syn::ExprIf, expected: Option<&Ty>) -> Res<Val> {
        let c = self.cond(&i.cond)?;
        let Some(Stmt::Expr(then, None)) = i.then_branch.stmts.first() else {
            return err(i, "unexpected `if` form");
        };
        let Some((_, el)) = &i.else_branch else {
            return err(i, "an `if` used as a value needs an `else` branch");
        };
        let el_expr: &Expr = match peel(el) {
            Expr::Block(b) => match b.block.stmts.first() {
                Some(Stmt::Expr(x, None)) => x,
                _ => return err(el, "unexpected `else` form"),
            },
            other => other,
        };
        let ((a, at), (b, bt)) = self.pair(then, el_expr, expected)?;
        self.expect_ty(&bt, &at, el_expr)?;
        if at.scalar().is_none() {
            return err(then, "`if` values must be scalars");
        }
        Ok(if self.cuda() {
            (format!("({c} ? {a} : {b})"), at)
        } else {
            (format!("select({b}, {a}, {c})"), at)
        })
    }

    pub(super) fn call(&mut self, c: &syn::ExprCall, expected: Option<&Ty>) -> Res<Val> {
        let Expr::Path(p) = peel(&c.func) else {
            return err(
                &c.func,
                "only dsl functions and `f32::sqrt(x)`-style calls are supported",
            );
        };
        let segs: Vec<String> = p
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        let last = segs.last().cloned().unwrap_or_default();
        // `f32::sqrt(x)`, `i32::max(a, b)`: method calls in disguise.
        if segs.len() == 2 {
            if let Some(s) = ScalarType::from_name(&segs[0]) {
                let mut args = c.args.iter();
                let Some(recv) = args.next() else {
                    return err(c, "missing receiver argument");
                };
                let rest: Vec<&Expr> = args.collect();
                let method = &p.path.segments[1].ident;
                return self.math(Some(s), recv, method, &rest, c, expected);
            }
        }
        let is_dsl = segs.len() == 1 || segs.iter().rev().nth(1).is_some_and(|s| s == "dsl");
        if segs.len() == 1 {
            if let Some(h) = self.helpers.get(&last).cloned() {
                return self.helper_call(c, &h);
            }
        }
        let in_helper = self.func_ret.is_some();
        if in_helper && is_dsl && ["sync_threads", "shared_array"].contains(&last.as_str()) {
            return err(
                c,
                "helper functions cannot use shared arrays or barriers; keep them in the kernel",
            );
        }
        if is_dsl && last == "sync_threads" {
            return err(
                c,
                "`sync_threads()` is a statement (`sync_threads();`), not a value",
            );
        }
        if is_dsl && last == "shared_array" {
            return err(
                c,
                "`shared_array::<T, N>()` is the initializer of a top-level                  `let mut name = shared_array::<T, N>();` only",
            );
        }
        if let (Some((cuda_fn, wgsl_fn)), true) = (atomic_fn(c), is_dsl) {
            return self.atomic_call(c, &last, cuda_fn, wgsl_fn);
        }
        let dims = ["x", "y", "z"];
        let builtin = ["thread_idx", "block_idx", "block_dim", "grid_dim"]
            .iter()
            .find_map(|b| {
                dims.iter()
                    .position(|d| last == format!("{b}_{d}"))
                    .map(|k| (*b, k))
            });
        match builtin {
            Some(_) if is_dsl && self.handler.is_some() => err(
                c,
                "thread and block indices are not available in actor handlers (one message, \
                 one call)",
            ),
            Some(_) if is_dsl && in_helper => err(
                c,
                "thread and block indices are not available in helper functions; pass them \
                 as parameters",
            ),
            Some((b, k)) if is_dsl => {
                if !c.args.is_empty() {
                    return err(&c.args, format!("`{last}()` takes no arguments"));
                }
                if self.stencil.is_some() {
                    return err(
                        c,
                        "thread and block indices are not available in stencil kernels; use \
                         the `GridPos` parameter (`pos.x()`, `pos.idx()`, ...)",
                    );
                }
                let d = dims[k];
                let code = if self.cuda() {
                    let v = match b {
                        "thread_idx" => "threadIdx",
                        "block_idx" => "blockIdx",
                        "block_dim" => "blockDim",
                        _ => "gridDim",
                    };
                    format!("((int){v}.{d})")
                } else {
                    match (b, self.fold, k) {
                        ("thread_idx", _, _) => format!("i32(rk_lid.{d})"),
                        ("block_dim", _, _) => format!("{}i", self.workgroup[k]),
                        // A folded 1-D grid: the linear block index, the true grid size.
                        ("block_idx", true, 0) => "i32(rk_bx)".to_string(),
                        ("block_idx", true, _) => "0i".to_string(),
                        ("block_idx", false, _) => format!("i32(rk_wid.{d})"),
                        (_, true, 0) => "i32(rk_grid_x)".to_string(),
                        (_, true, _) => "1i".to_string(),
                        _ => format!("i32(rk_nwg.{d})"),
                    }
                };
                Ok((code, Ty::Scalar(ScalarType::I32)))
            }
            _ => err(
                c,
                format!(
                    "unsupported call `{}`: kernels can call the dsl index functions \
                     (thread_idx_x(), block_idx_x(), block_dim_x(), grid_dim_x() and their y/z \
                     forms), math methods and helper functions defined at the top level of the kernel's \
                     body (`fn name(x: f32) -> f32 {{ .. }}`)",
                    segs.join("::")
                ),
            ),
        }
    }

    pub(super) fn method_call(
        &mut self,
        mc: &syn::ExprMethodCall,
        expected: Option<&Ty>,
    ) -> Res<Val> {
        if let Some(t) = &mc.turbofish {
            return err(t, "turbofish is not supported");
        }
        // GridPos methods.
        if let Expr::Path(p) = peel(&mc.receiver) {
            if let Ok(ident) = path_ident(p) {
                if let Ok(v) = self.lookup(ident) {
                    if let Ty::GridPos { dims } = v.ty {
                        return self.grid_pos(dims, mc);
                    }
                    if v.ty == Ty::Context {
                        return err(
                            mc,
                            if mc.method == "send_to" {
                                "`ctx.send_to(..)` is a statement (`ctx.send_to(..);` or \
                                 `let _ = ctx.send_to(..);`), not a value"
                            } else {
                                "a handler's context offers `ctx.send_to(KernelId(dest), &msg)` \
                                 and `ctx.kernel_id().0` in GPU handlers"
                            },
                        );
                    }
                }
            }
        }
        let args: Vec<&Expr> = mc.args.iter().collect();
        self.math(None, &mc.receiver, &mc.method, &args, mc, expected)
    }
}
