//! The kernel signature, the stencil prologue and the final text of each target.

use super::*;
use crate::types::parse_param;

impl Tx {
    pub(crate) fn kernel(mut self, f: &syn::ItemFn, kind: Kind<'_>) -> Res<Output> {
        let sig = &f.sig;
        if let Some(c) = &sig.constness {
            return err(
                c,
                "`const fn` kernels are not supported; write a plain `fn`",
            );
        }
        if let Some(a) = &sig.asyncness {
            return err(
                a,
                "`async fn` kernels are not supported; write a plain `fn`",
            );
        }
        if let Some(u) = &sig.unsafety {
            return err(
                u,
                "`unsafe fn` kernels are not supported; write a plain `fn`",
            );
        }
        if let Some(a) = &sig.abi {
            return err(a, "kernels take no `extern` ABI; write a plain `fn`");
        }
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            return err(
                &sig.generics,
                "generic kernels are not supported; use concrete types",
            );
        }
        if let Some(v) = &sig.variadic {
            return err(v, "variadic kernels are not supported");
        }
        self.structs = Rc::new(Structs::of(f)?);
        for d in self.structs.iter() {
            self.names.reserve(&d.name);
        }
        if let syn::ReturnType::Type(_, t) = &sig.output {
            if self.parse_ty(t)? != Ty::Unit {
                return err(
                    t,
                    "kernels return nothing; write results into a `&mut [T]` parameter",
                );
            }
        }
        let name = sig.ident.to_string();
        if Names::is_reserved(&name) || name.starts_with("rk_") || name.starts_with("__") {
            return err(
                &sig.ident,
                format!("`{name}` cannot name a kernel: it is reserved in CUDA C or WGSL"),
            );
        }
        self.names.reserve(&name);
        let nested = helpers::nested_helpers(f);
        if !nested.is_empty() {
            let (sigs, text) = helpers::translate_helpers(&nested, self.target, &self.structs)?;
            self.helpers = sigs;
            self.helper_text = text;
        }
        let [wx, wy, wz] = self.workgroup;
        let invocations = wx as u64 * wy as u64 * wz as u64;
        if wx == 0 || wy == 0 || wz == 0 || wz > 64 || invocations > 256 {
            return err(
                &sig.ident,
                format!(
                    "workgroup size {wx}x{wy}x{wz} is out of range: each dimension at least 1, \
                     z at most 64, at most 256 invocations (WebGPU's default limits)"
                ),
            );
        }

        // Parameters.
        let mut params = Vec::new();
        for arg in &sig.inputs {
            let (pi, kind_of) = parse_param(arg, self.target, &*self.structs)?;
            let ty = Ty::from(kind_of);
            let ty_span = match arg {
                syn::FnArg::Typed(pt) => pt.ty.to_token_stream(),
                syn::FnArg::Receiver(r) => r.to_token_stream(),
            };
            match (&ty, kind) {
                (Ty::GridPos { .. }, Kind::Global) => {
                    return err(
                        &ty_span,
                        "`GridPos` parameters belong to stencil kernels; translate this \
                         function with `transpile_stencil_kernel`",
                    )
                }
                (Ty::GridPos { dims }, Kind::Stencil(cfg)) => {
                    if self.stencil.is_some() {
                        return err(
                            &ty_span,
                            "a stencil kernel has exactly one `GridPos` parameter",
                        );
                    }
                    self.stencil = Some(Stencil {
                        dims: *dims,
                        halo: cfg.halo,
                    });
                }
                _ => {}
            }
            let emitted = self.declare(&pi.ident, ty.clone(), pi.mutability.is_some())?;
            params.push(Param {
                ident: pi.ident.clone(),
                emitted,
                ty,
                mutable: pi.mutability.is_some(),
            });
        }
        if let Kind::Stencil(cfg) = kind {
            if self.stencil.is_none() {
                return err(
                    &sig.ident,
                    "a stencil kernel needs a `GridPos` (2-D) or `GridPos3` (3-D) parameter",
                );
            }
            if cfg.halo == 0 || cfg.halo > 16 {
                return err(&sig.ident, "the stencil halo must be 1 to 16 cells");
            }
        }
        for n in [
            "rk_x",
            "rk_y",
            "rk_z",
            "rk_nx",
            "rk_ny",
            "rk_nz",
            "rk_sy",
            "rk_sz",
            "rk_idx",
            "rk_bx",
            "rk_grid_x",
        ] {
            self.names.reserve(n);
        }
        if self.fold && (self.stencil.is_some() || self.cuda()) {
            return err(
                &sig.ident,
                "only the WGSL of a global kernel is translated for a folded grid",
            );
        }

        // Slices that atomics touch: in WGSL their element type is `atomic<T>`.
        let mut targets = HashSet::new();
        atomic_targets(f.block.to_token_stream(), &mut targets);
        for t in targets {
            if let Some(p) = params.iter().find(|p| p.ident == t) {
                self.atomics.insert(p.emitted.clone());
            }
        }

        // Body, into self.out (indent 1). Structs passed by value are copied out of their
        // one-element buffers first.
        for p in &params {
            if let Ty::Struct(n) = &p.ty {
                self.line(&if self.cuda() {
                    format!("{n} {0} = rk_ref_{0}[0];", p.emitted)
                } else {
                    format!("var {0}: {n} = rk_ref_{0};", p.emitted)
                });
            }
        }
        self.stencil_prologue()?;
        let body_start = self.out.len();
        self.block_stmts(&f.block, None)?;
        let mut body = self.out.split_off(body_start);
        if body.contains(shared::STORAGE_BARRIER_MARK) {
            let name = |p: &Param| p.ident.to_string();
            let slices: Vec<String> = params
                .iter()
                .filter(|p| {
                    matches!(
                        p.ty,
                        Ty::Slice { mutable: true, .. } | Ty::StructSlice { mutable: true, .. }
                    )
                })
                .map(name)
                .collect();
            let scalars: Vec<String> = params
                .iter()
                .filter(|p| matches!(p.ty, Ty::Scalar(_)))
                .map(name)
                .collect();
            let storage = barrier::needs_storage_barrier(
                f,
                self.workgroup,
                &slices,
                &scalars,
                !self.atomics.is_empty(),
            );
            body = body
                .lines()
                .filter_map(
                    |l| match (l.trim() == shared::STORAGE_BARRIER_MARK, storage) {
                        (false, _) => Some(format!("{l}\n")),
                        (true, true) => Some(
                            l.replace(shared::STORAGE_BARRIER_MARK, "storageBarrier();") + "\n",
                        ),
                        (true, false) => None,
                    },
                )
                .collect();
        }
        let prologue = std::mem::take(&mut self.out);

        match self.target {
            Target::Cuda => Ok(Output::Cuda(
                self.finish_cuda(&name, &params, &prologue, &body)?,
            )),
            Target::Wgsl => Ok(Output::Wgsl(
                self.finish_wgsl(&name, &params, &prologue, &body)?,
            )),
        }
    }

    pub(super) fn hidden_dims(&self) -> &'static [&'static str] {
        match &self.stencil {
            None if self.fold => &["rk_grid_x"],
            None => &[],
            Some(s) if s.dims == 2 => &["rk_nx", "rk_ny"],
            Some(_) => &["rk_nx", "rk_ny", "rk_nz"],
        }
    }

    pub(super) fn stencil_prologue(&mut self) -> Res<()> {
        if self.fold {
            // The launcher dispatched (x, y, 1) workgroups for a grid of rk_grid_x: the
            // linear index of this one, and nothing to do past the grid. Uniform in the
            // workgroup, so barriers after it stay valid.
            self.line("let rk_bx: u32 = rk_wid.x + rk_wid.y * rk_nwg.x;");
            self.line("if (rk_bx >= rk_grid_x) { return; }");
        }
        let Some(st) = &self.stencil else {
            return Ok(());
        };
        let (dims, h) = (st.dims, st.halo);
        let axes: &[(&str, &str, &str)] = if dims == 2 {
            &[("rk_x", "x", "rk_nx"), ("rk_y", "y", "rk_ny")]
        } else {
            &[
                ("rk_x", "x", "rk_nx"),
                ("rk_y", "y", "rk_ny"),
                ("rk_z", "z", "rk_nz"),
            ]
        };
        let mut bounds = Vec::new();
        if self.cuda() {
            for (v, c, n) in axes {
                self.line(&format!(
                    "int {v} = (int)(blockIdx.{c} * blockDim.{c} + threadIdx.{c});"
                ));
                bounds.push(format!("{v} >= {n}"));
            }
            self.line(&format!("if ({}) {{ return; }}", bounds.join(" || ")));
            self.line(&format!(
                "unsigned long long rk_sy = (unsigned long long)(rk_nx + {});",
                2 * h
            ));
            let mut idx = format!(
                "(unsigned long long)(rk_y + {h}) * rk_sy + (unsigned long long)(rk_x + {h})"
            );
            if dims == 3 {
                self.line(&format!(
                    "unsigned long long rk_sz = rk_sy * (unsigned long long)(rk_ny + {});",
                    2 * h
                ));
                idx = format!("(unsigned long long)(rk_z + {h}) * rk_sz + {idx}");
            }
            self.line(&format!("unsigned long long rk_idx = {idx};"));
        } else {
            let [wx, wy, wz] = self.workgroup;
            self.line(&format!(
                "let rk_gid: vec3<u32> = rk_wid * vec3<u32>({wx}u, {wy}u, {wz}u) + rk_lid;"
            ));
            for (v, c, n) in axes {
                self.line(&format!("let {v}: i32 = i32(rk_gid.{c});"));
                bounds.push(format!("{v} >= {n}"));
            }
            self.line(&format!("if ({}) {{ return; }}", bounds.join(" || ")));
            self.line(&format!("let rk_sy: u32 = u32(rk_nx + {}i);", 2 * h));
            let mut idx = format!("u32(rk_y + {h}i) * rk_sy + u32(rk_x + {h}i)");
            if dims == 3 {
                self.line(&format!(
                    "let rk_sz: u32 = rk_sy * u32(rk_ny + {}i);",
                    2 * h
                ));
                idx = format!("u32(rk_z + {h}i) * rk_sz + {idx}");
            }
            self.line(&format!("let rk_idx: u32 = {idx};"));
        }
        Ok(())
    }

    pub(super) fn finish_cuda(
        &self,
        name: &str,
        params: &[Param],
        prologue: &str,
        body: &str,
    ) -> Res<String> {
        let mut args = Vec::new();
        for p in params {
            match &p.ty {
                Ty::Scalar(s) => args.push(format!("{} {}", s.cuda_name(), p.emitted)),
                Ty::Slice { elem, mutable } => args.push(format!(
                    "{}{}* {}",
                    if *mutable { "" } else { "const " },
                    elem.cuda_name(),
                    p.emitted
                )),
                Ty::StructSlice { name, mutable } => args.push(format!(
                    "{}{name}* {}",
                    if *mutable { "" } else { "const " },
                    p.emitted
                )),
                Ty::Struct(name) => args.push(format!("const {name}* rk_ref_{}", p.emitted)),
                _ => {}
            }
        }
        for d in self.hidden_dims() {
            args.push(format!("int {d}"));
        }
        let mut s = self.structs.declarations(Target::Cuda);
        s.push_str(&self.helper_text);
        let _ = writeln!(
            s,
            "extern \"C\" __global__ void {name}({}) {{",
            args.join(", ")
        );
        s.push_str(prologue);
        s.push_str(body);
        s.push_str("}\n");
        Ok(s)
    }

    pub(super) fn finish_wgsl(
        &self,
        name: &str,
        params: &[Param],
        prologue: &str,
        body: &str,
    ) -> Res<WgslKernel> {
        let mut fields: Vec<ParamField> = Vec::new();
        let mut bindings = Vec::new();
        let mut globals = String::new();
        let mut locals = String::new();
        let mut slice_no = 0u32;
        for p in params {
            match &p.ty {
                Ty::Scalar(s) => {
                    let offset = 4 * fields.len() as u32;
                    fields.push(ParamField {
                        name: p.emitted.clone(),
                        ty: *s,
                        offset,
                    });
                    let kw = if p.mutable { "var" } else { "let" };
                    let t = self.sname(*s, &p.ident)?;
                    if *s == ScalarType::Bool {
                        let _ = writeln!(
                            locals,
                            "    {kw} {0}: bool = rk_params.{0} != 0u;",
                            p.emitted
                        );
                    } else {
                        let _ = writeln!(locals, "    {kw} {0}: {t} = rk_params.{0};", p.emitted);
                    }
                }
                Ty::Slice { elem, mutable } => {
                    slice_no += 1;
                    let t = self.sname(*elem, &p.ident)?;
                    let access = if *mutable { "read_write" } else { "read" };
                    let atomic = self.atomics.contains(&p.emitted);
                    let elem_t = if atomic {
                        format!("atomic<{t}>")
                    } else {
                        t.to_string()
                    };
                    let _ = writeln!(
                        globals,
                        "@group(0) @binding({slice_no}) var<storage, {access}> {}: array<{elem_t}>;",
                        p.emitted
                    );
                    bindings.push(WgslBinding {
                        binding: slice_no,
                        name: p.emitted.clone(),
                        kind: BindingKind::Storage {
                            elem: *elem,
                            read_only: !mutable,
                            atomic,
                        },
                    });
                }
                Ty::StructSlice { name, mutable } => {
                    slice_no += 1;
                    let access = if *mutable { "read_write" } else { "read" };
                    let _ = writeln!(
                        globals,
                        "@group(0) @binding({slice_no}) var<storage, {access}> {}: array<{name}>;",
                        p.emitted
                    );
                    bindings.push(WgslBinding {
                        binding: slice_no,
                        name: p.emitted.clone(),
                        kind: BindingKind::Structs {
                            ty: crate::intern(name),
                            size: self.struct_def(name).size,
                            read_only: !mutable,
                        },
                    });
                }
                Ty::Struct(name) => {
                    slice_no += 1;
                    let _ = writeln!(
                        globals,
                        "@group(0) @binding({slice_no}) var<storage, read> rk_ref_{}: {name};",
                        p.emitted
                    );
                    bindings.push(WgslBinding {
                        binding: slice_no,
                        name: format!("rk_ref_{}", p.emitted),
                        kind: BindingKind::Structs {
                            ty: crate::intern(name),
                            size: self.struct_def(name).size,
                            read_only: true,
                        },
                    });
                }
                _ => {}
            }
        }
        for d in self.hidden_dims() {
            let offset = 4 * fields.len() as u32;
            let ty = if *d == "rk_grid_x" {
                ScalarType::U32
            } else {
                ScalarType::I32
            };
            fields.push(ParamField {
                name: (*d).to_string(),
                ty,
                offset,
            });
            let t = ty.wgsl_name().expect("32-bit");
            let _ = writeln!(locals, "    let {d}: {t} = rk_params.{d};");
        }
        let mut src = self.structs.declarations(Target::Wgsl);
        let mut params_size = 0;
        if !fields.is_empty() {
            src.push_str("struct RkParams {\n");
            for f in &fields {
                let t = if f.ty == ScalarType::Bool {
                    "u32"
                } else {
                    f.ty.wgsl_name()
                        .expect("f64 rejected when the type was parsed")
                };
                let _ = writeln!(src, "    {}: {t},", f.name);
            }
            let n = fields.len();
            let padded = n.div_ceil(4) * 4;
            for i in n..padded {
                let _ = writeln!(src, "    rk_pad{}: u32,", i - n);
            }
            src.push_str("}\n\n");
            src.push_str("@group(0) @binding(0) var<uniform> rk_params: RkParams;\n");
            params_size = 4 * padded as u32;
            bindings.insert(
                0,
                WgslBinding {
                    binding: 0,
                    name: "rk_params".into(),
                    kind: BindingKind::Params,
                },
            );
        }
        src.push_str(&globals);
        src.push_str(&self.workgroup_globals);
        let [wx, wy, wz] = self.workgroup;
        let _ = write!(
            src,
            "\n@compute @workgroup_size({wx}, {wy}, {wz})\nfn {name}(\
             @builtin(local_invocation_id) rk_lid: vec3<u32>, \
             @builtin(workgroup_id) rk_wid: vec3<u32>, \
             @builtin(num_workgroups) rk_nwg: vec3<u32>) {{\n"
        );
        src.push_str(&locals);
        src.push_str(prologue);
        src.push_str(body);
        src.push_str("}\n");
        if !self.helper_text.is_empty() {
            src.push('\n');
            src.push_str(&self.helper_text);
        }
        Ok(WgslKernel {
            source: src,
            entry_point: name.to_string(),
            workgroup_size: self.workgroup,
            bindings,
            params: fields,
            params_size,
        })
    }
}
