//! Every construct of the subset, translated to both targets: the CUDA text has the
//! expected structure, the WGSL is validated by naga and translated to MSL.

mod common;
mod kernels;

use common::{check_cuda_syntax, check_wgsl};
use ringkernel_codegen::{
    transpile_global_kernel, transpile_global_kernel_wgsl, transpile_global_kernel_wgsl_with,
    transpile_stencil_kernel, transpile_stencil_kernel_wgsl, BindingKind, ParamValue, ScalarType,
    StencilConfig,
};
use syn::parse_quote;

/// Both targets; checks the WGSL with naga (and MSL); returns (CUDA, WGSL).
fn both(f: &syn::ItemFn) -> (String, String) {
    let cuda = transpile_global_kernel(f).unwrap_or_else(|e| panic!("CUDA: {e}"));
    let w = transpile_global_kernel_wgsl(f).unwrap_or_else(|e| panic!("WGSL: {e}"));
    check_wgsl(&w);
    check_cuda_syntax(&cuda);
    assert_eq!(
        cuda.matches('{').count(),
        cuda.matches('}').count(),
        "unbalanced braces:\n{cuda}"
    );
    (cuda, w.source)
}

#[test]
fn signature_and_bindings() {
    let f: syn::ItemFn = parse_quote! {
        fn k(a: f32, x: &[f32], flag: bool, y: &mut [i32], n: u32, z: &mut [u32]) {
            let i = thread_idx_x() as u32;
            if flag && i < n {
                y[i as usize] = x[i as usize] as i32 + a as i32;
                z[i as usize] = n;
            }
        }
    };
    let (cuda, _) = both(&f);
    assert!(cuda.starts_with(
        "extern \"C\" __global__ void k(float a, const float* x, bool flag, int* y, unsigned \
         int n, unsigned int* z) {"
    ));
    let w = transpile_global_kernel_wgsl(&f).unwrap();
    let kinds: Vec<(u32, &str, BindingKind)> = w
        .bindings
        .iter()
        .map(|b| (b.binding, b.name.as_str(), b.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (0, "rk_params", BindingKind::Params),
            (
                1,
                "x",
                BindingKind::Storage {
                    elem: ScalarType::F32,
                    read_only: true,
                    atomic: false
                }
            ),
            (
                2,
                "y",
                BindingKind::Storage {
                    elem: ScalarType::I32,
                    read_only: false,
                    atomic: false
                }
            ),
            (
                3,
                "z",
                BindingKind::Storage {
                    elem: ScalarType::U32,
                    read_only: false,
                    atomic: false
                }
            ),
        ]
    );
    let fields: Vec<(&str, ScalarType, u32)> = w
        .params
        .iter()
        .map(|p| (p.name.as_str(), p.ty, p.offset))
        .collect();
    assert_eq!(
        fields,
        vec![
            ("a", ScalarType::F32, 0),
            ("flag", ScalarType::Bool, 4),
            ("n", ScalarType::U32, 8)
        ]
    );
    assert_eq!(w.params_size, 16);
    assert!(w.source.contains("var<storage, read> x: array<f32>;"));
    assert!(w.source.contains("let flag: bool = rk_params.flag != 0u;"));
    let bytes = w
        .pack_params(&[
            ParamValue::F32(1.5),
            ParamValue::Bool(true),
            ParamValue::U32(7),
        ])
        .unwrap();
    assert_eq!(&bytes[0..4], &1.5f32.to_le_bytes());
    assert_eq!(&bytes[4..8], &1u32.to_le_bytes());
    assert_eq!(&bytes[8..12], &7u32.to_le_bytes());
    assert!(w.pack_params(&[ParamValue::F32(1.0)]).is_err());
    assert!(w
        .pack_params(&[
            ParamValue::I32(1),
            ParamValue::Bool(true),
            ParamValue::U32(7)
        ])
        .is_err());
}

#[test]
fn no_scalars_means_no_params_block() {
    let f: syn::ItemFn = parse_quote! {
        fn copy(src: &[f32], dst: &mut [f32]) {
            let i = (block_idx_x() * block_dim_x() + thread_idx_x()) as usize;
            dst[i] = src[i];
        }
    };
    let (_, wgsl) = both(&f);
    let w = transpile_global_kernel_wgsl(&f).unwrap();
    assert!(w.params.is_empty());
    assert_eq!(w.params_size, 0);
    assert_eq!(w.bindings[0].binding, 1);
    assert!(!wgsl.contains("rk_params"));
}

#[test]
fn indices_all_axes_and_workgroup_size() {
    let f: syn::ItemFn = parse_quote! {
        fn idx(out: &mut [i32]) {
            let t = thread_idx_x() + thread_idx_y() * 2 + thread_idx_z() * 3;
            let b = block_idx_x() + block_idx_y() + block_idx_z();
            let d = block_dim_x() * block_dim_y() * block_dim_z();
            let g = grid_dim_x() + grid_dim_y() + grid_dim_z();
            out[(t + b * d) as usize] = g;
        }
    };
    let (cuda, _) = both(&f);
    for s in ["threadIdx.z", "blockIdx.y", "blockDim.z", "gridDim.x"] {
        assert!(cuda.contains(s), "{s} missing");
    }
    let w = transpile_global_kernel_wgsl_with(&f, [8, 4, 2]).unwrap();
    check_wgsl(&w);
    assert!(w.source.contains("@workgroup_size(8, 4, 2)"));
    assert!(w.source.contains("((8i * 4i) * 2i)"));
    assert!(transpile_global_kernel_wgsl_with(&f, [512, 1, 1]).is_err());
    assert!(transpile_global_kernel_wgsl_with(&f, [u32::MAX, 2, 1]).is_err());
    assert!(transpile_global_kernel_wgsl_with(&f, [1, 1, 0]).is_err());
}

#[test]
fn arithmetic_bits_shifts_casts() {
    let f: syn::ItemFn = parse_quote! {
        fn ops(fi: &mut [f32], ii: &mut [i32], uu: &mut [u32], n: i32) {
            let i = thread_idx_x();
            let a = ii[0] * 3 - 7 / 2 + 9 % 4;
            let b = (a & 0xff) | (a ^ 3) << 2 >> 1;
            let u = uu[0] << 3u32 | !uu[1] & 7;
            let neg = !(a > 0) || a == 0 && b != 1;
            let x = fi[0] % 1.5 - -(2.5f32 * a as f32);
            let y = x as i32 as u32 as f32 + (neg as i32) as f32 + (u as usize) as f32;
            let mut m = 5;
            m += 1; m -= 2; m *= 3; m /= 2; m %= 7; m <<= 1; m >>= 1; m &= 15; m |= 16; m ^= 1;
            let mut fm = 2.0;
            fm += y; fm -= 1.0; fm *= 0.5; fm /= 4.0; fm %= 3.0;
            ii[1] = b + m + i + n;
            uu[2] = u;
            fi[1] = fm;
        }
    };
    let (cuda, wgsl) = both(&f);
    assert!(cuda.contains("fmodf(fi[0ull], 1.5f)"));
    assert!(cuda.contains("(~uu[1ull])"));
    assert!(cuda.contains("((int)(neg))"));
    assert!(wgsl.contains("<< u32(1i)"), "{wgsl}");
    assert!(wgsl.contains("f32(u32(i32(x)))"));
}

#[test]
fn literals_and_constants() {
    let f: syn::ItemFn = parse_quote! {
        fn lits(out: &mut [f32], iv: &mut [i32], uv: &mut [u32]) {
            out[0] = 1e30 + 2.5e-3 + 7.0 + f32::MAX + f32::MIN + f32::EPSILON;
            out[1] = f32::consts::PI + std::f32::consts::E + f32::INFINITY;
            out[2] = f32::NEG_INFINITY;
            iv[0] = i32::MIN + i32::MAX + -2147483648 + 0x10 + 1_000;
            uv[0] = u32::MAX - 0xffff_ffff + 4_000_000_000 - u32::MIN;
        }
    };
    let (cuda, wgsl) = both(&f);
    assert!(cuda.contains("1.0e30f"), "{cuda}");
    assert!(cuda.contains("(-2147483647 - 1)"));
    assert!(wgsl.contains("(-2147483647i - 1i)"));
    assert!(wgsl.contains("4000000000u"));
    assert!(wgsl.contains("bitcast<f32>(0x7f800000u)"));
}

#[test]
fn f64_is_cuda_only() {
    let f: syn::ItemFn = parse_quote! {
        fn dbl(x: &mut [f64], s: f64) {
            let i = thread_idx_x() as usize;
            let v: f64 = x[i] * s + 1.0;
            x[i] = v.sqrt().max(f64::EPSILON).mul_add(2.0, 0.5f64);
        }
    };
    let cuda = transpile_global_kernel(&f).unwrap();
    check_cuda_syntax(&cuda);
    assert!(cuda.contains("void dbl(double* x, double s)"));
    assert!(
        cuda.contains("fma(fmax(sqrt(v), 2.220446049250313e-16), 2.0, 0.5)"),
        "{cuda}"
    );
    let e = transpile_global_kernel_wgsl(&f).unwrap_err();
    assert!(
        e.to_string()
            .contains("type `f64` is not available in WGSL"),
        "{e}"
    );
}

#[test]
fn math_functions() {
    let f: syn::ItemFn = parse_quote! {
        fn math(x: &mut [f32], k: &mut [i32]) {
            let v = x[0];
            let a = v.sqrt() + v.exp() + v.exp2() + v.ln() + v.log2() + v.sin() + v.cos();
            let b = v.tan() + v.tanh() + v.sinh() + v.cosh() + v.asin() + v.acos() + v.atan();
            let c = v.atan2(a) + v.abs() + v.floor() + v.ceil() + v.trunc() + v.recip();
            let d = v.powf(b) + v.min(c) + v.max(a) + v.clamp(-1.0, 1.0) + v.mul_add(a, b);
            let e = f32::sqrt(d) + f32::max(a, b);
            x[1] = a + b + c + d + e;
            let j = k[0];
            k[1] = j.min(3) + j.max(-3) + j.abs() + j.clamp(0, 9) + i32::min(j, 2)
                + j.wrapping_add(5).wrapping_sub(1).wrapping_mul(3);
        }
    };
    let (cuda, wgsl) = both(&f);
    for s in [
        "sqrtf(v)",
        "expf(v)",
        "exp2f(v)",
        "logf(v)",
        "log2f(v)",
        "tanhf(v)",
        "atan2f(v, a)",
        "fabsf(v)",
        "truncf(v)",
        "(1.0f / v)",
        "powf(v, b)",
        "fminf(v, c)",
        "fminf(fmaxf(v, (-1.0f)), 1.0f)",
        "fmaf(v, a, b)",
        "min(j, 3)",
        "abs(j)",
        "(unsigned int)",
    ] {
        assert!(cuda.contains(s), "CUDA lacks {s}:\n{cuda}");
    }
    for s in [
        "log(v)",
        "clamp(v, (-1.0f), 1.0f)",
        "fma(v, a, b)",
        "pow(v, b)",
        "clamp(j, 0i, 9i)",
    ] {
        assert!(wgsl.contains(s), "WGSL lacks {s}:\n{wgsl}");
    }
}

#[test]
fn control_flow() {
    let f: syn::ItemFn = parse_quote! {
        fn flow(out: &mut [i32], n: i32) {
            let i = thread_idx_x();
            if i >= n {
                return;
            }
            let mut acc = 0;
            for j in 0..n {
                if j == 3 { continue; }
                if j > 10 { break; }
                acc += j;
            }
            for j in 1..=4 { acc += j; }
            for _ in (0..n).step_by(3) { acc += 1; }
            let mut w = 0;
            while w < 5 && acc > 0 { w += 1; }
            loop {
                w -= 1;
                if w < 0 { break; }
            }
            {
                let inner = acc * 2;
                acc = inner;
            }
            if acc > 100 { acc = 100; } else if acc < -100 { acc = -100; } else { acc += 1; }
            out[i as usize] = acc + w;
        }
    };
    let (cuda, wgsl) = both(&f);
    assert!(
        cuda.contains("for (int j = 0; j < rk_end0; j += 1) {"),
        "{cuda}"
    );
    assert!(cuda.contains("for (int j_1 = 1; j_1 <= rk_end1; j_1 += 1) {"));
    assert!(cuda.contains("for (;;) {"));
    assert!(cuda.contains("while (((w < 5) && (acc > 0))) {"));
    assert!(cuda.contains("} else if ((acc < (-100))) {"));
    assert!(wgsl.contains("loop {"));
    assert!(wgsl.contains("for (var j: i32 = 0i; j < rk_end0; j += 1i) {"));
    assert!(wgsl.contains("rk_step0"));
}

#[test]
fn match_to_switch_and_values() {
    let f: syn::ItemFn = parse_quote! {
        fn sw(codes: &[u32], out: &mut [f32]) {
            let i = thread_idx_x() as usize;
            let c = codes[i];
            match c {
                0 => out[i] = 1.0,
                1 | 2 | 3 => {
                    out[i] = 2.0;
                }
                _ => return,
            }
            let v = match c { 7 => 1.5, 8 => { let t = 2.0; t * t } 9 => { return; } _ => 0.0 };
            let w: f32 = if c > 3 { let q = v * 2.0; q + 1.0 } else { v };
            let k = if c > 4 { let a = 1; a * 2 } else { 3 };
            let k2 = match c { 0 => { let b = 2u32; b } _ => c };
            out[i] += v + w + k as f32 + k2 as f32;
        }
    };
    let (cuda, wgsl) = both(&f);
    assert!(cuda.contains("int k;"), "{cuda}");
    assert!(cuda.contains("unsigned int k2;"), "{cuda}");
    assert!(cuda.contains("switch (c) {"));
    assert!(cuda.contains("case 1u:\n"));
    assert!(cuda.contains("case 3u: {"));
    assert!(cuda.contains("default: {"));
    assert!(wgsl.contains("case 1u, 2u, 3u: {"));
    assert!(wgsl.contains("var v: f32;"));
    // A `break` in an arm inside a loop leaves the loop, so no switch there.
    let g: syn::ItemFn = parse_quote! {
        fn brk(out: &mut [i32]) {
            let mut k = 0;
            loop {
                match k { 4 => break, 2 => { k += 2; continue; } _ => k += 1 }
            }
            out[0] = k;
        }
    };
    let (cuda, wgsl) = both(&g);
    assert!(!cuda.contains("switch"), "{cuda}");
    assert!(cuda.contains("if (rk_m0 == 4) {"));
    assert!(!wgsl.contains("switch"));
}

#[test]
fn locals_arrays_shadowing_and_names() {
    let f: syn::ItemFn = parse_quote! {
        fn names(out: &mut [f32], float: f32, n_u: u32) {
            let x = 1.0;
            let x = x + float;
            let mut arr = [0.0f32; 4];
            let fixed = [1.0, 2.0, x];
            let ints = [1, n_u, 3];
            let mut late: f32;
            late = fixed[2];
            for k in 0..4usize { arr[k] = fixed[k % 3] * late; }
            let _ = arr[0];
            let var = arr[1] + arr[3];
            let r#loop = var;
            out[0] = x + r#loop + ints[2] as f32;
        }
    };
    let (cuda, wgsl) = both(&f);
    assert!(cuda.contains("float float_"), "{cuda}");
    assert!(cuda.contains("float x_1 = (x + float_);"));
    assert!(cuda.contains("float arr[4] = {0.0f, 0.0f, 0.0f, 0.0f};"));
    assert!(
        cuda.contains("unsigned int ints[3] = {1u, n_u, 3u};"),
        "{cuda}"
    );
    assert!(wgsl.contains("var arr: array<f32, 4> = array<f32, 4>(0.0f, 0.0f, 0.0f, 0.0f);"));
    assert!(wgsl.contains("let var_: f32"));
    assert!(wgsl.contains("let loop_: f32"));
    assert!(wgsl.contains("_ = arr[0u];"));
}

#[test]
fn if_values_nest() {
    let f: syn::ItemFn = parse_quote! {
        fn sel(out: &mut [f32], a: f32) {
            let v = if a > 1.0 { 1.0 } else if a < -1.0 { -1.0 } else { a };
            out[0] = v + if a == 0.0 { 2.0 } else { 3.0 };
        }
    };
    let (cuda, wgsl) = both(&f);
    assert!(cuda.contains("? 1.0f : "), "{cuda}");
    assert!(wgsl.contains("select("));
}

#[test]
fn stencil_cuda_and_wgsl() {
    let f: syn::ItemFn = parse_quote! {
        fn blur(pos: GridPos, src: &[f32], dst: &mut [f32], w: f32) {
            let s = pos.north(&src) + pos.south(src) + pos.east(src) + pos.west(src);
            let far = pos.at(&src, -2, 2) + pos.at(src, pos.x() % 2, 0);
            dst[pos.idx()] = w * s + far + (pos.nx() + pos.ny() + pos.y()) as f32;
        }
    };
    let cfg = StencilConfig::new(2);
    let cuda = transpile_stencil_kernel(&f, &cfg).unwrap();
    check_cuda_syntax(&cuda);
    assert!(cuda.starts_with(
        "extern \"C\" __global__ void blur(const float* src, float* dst, float w, int rk_nx, \
         int rk_ny) {"
    ));
    assert!(cuda.contains("if (rk_x >= rk_nx || rk_y >= rk_ny) { return; }"));
    assert!(cuda.contains("src[rk_idx - rk_sy]"));
    assert!(cuda.contains("(unsigned long long)(rk_nx + 4)"));
    let w = transpile_stencil_kernel_wgsl(&f, &cfg).unwrap();
    check_wgsl(&w);
    let names: Vec<&str> = w.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["w", "rk_nx", "rk_ny"]);
    assert!(w.source.contains("@workgroup_size(16, 16, 1)"));
    // Offsets past the halo are refused at their span.
    let g: syn::ItemFn = parse_quote! {
        fn far(pos: GridPos, src: &[f32], dst: &mut [f32]) {
            dst[pos.idx()] = pos.at(&src, 3, 0);
        }
    };
    let e = transpile_stencil_kernel(&g, &cfg).unwrap_err();
    assert!(
        e.to_string()
            .contains("offset 3 reaches past the halo of 2 cells"),
        "{e}"
    );
    // 3-D.
    let h: syn::ItemFn = parse_quote! {
        fn vol(pos: GridPos3, src: &[f32], dst: &mut [f32]) {
            dst[pos.idx()] = pos.up(src) - pos.down(src) + pos.at(src, 1, 0, -1)
                + (pos.z() + pos.nz()) as f32;
        }
    };
    let cfg3 = StencilConfig::new_3d(1);
    let cuda = transpile_stencil_kernel(&h, &cfg3).unwrap();
    check_cuda_syntax(&cuda);
    assert!(cuda.contains("int rk_nx, int rk_ny, int rk_nz)"));
    assert!(cuda.contains("src[rk_idx + rk_sz]"));
    let w = transpile_stencil_kernel_wgsl(&h, &cfg3).unwrap();
    check_wgsl(&w);
    assert_eq!(w.params_size, 16);
}

#[test]
fn atomics() {
    let f: syn::ItemFn = parse_quote! {
        fn histo(vals: &[u32], hist: &mut [u32], lows: &mut [i32], n: u32) {
            let i = thread_idx_x() as u32;
            if i >= n {
                return;
            }
            let v = vals[i as usize];
            let old = atomic_add(&mut hist[(v % 8) as usize], 1);
            atomic_max(&mut hist[8], v);
            atomic_min(&mut lows[0], -(v as i32));
            atomic_sub(&mut lows[1], 1);
            atomic_and(&mut hist[9], old | 1);
            atomic_or(&mut hist[10], 4);
            atomic_xor(&mut hist[11], v);
            let prev = atomic_exchange(&mut lows[2], 7);
            hist[12] = hist[12] + 1;
            hist[13] += prev as u32;
        }
    };
    let (cuda, wgsl) = both(&f);
    for s in [
        "atomicAdd(&hist[((unsigned long long)(((v % 8u))))], 1u)",
        "atomicMax(&hist[8ull], v);",
        "atomicMin(&lows[0ull], (-(((int)(v)))));",
        "atomicExch(&lows[2ull], 7)",
        "hist[12ull] = (hist[12ull] + 1u);",
    ] {
        assert!(cuda.contains(s), "CUDA lacks {s}:\n{cuda}");
    }
    for s in [
        "var<storage, read_write> hist: array<atomic<u32>>;",
        "var<storage, read_write> lows: array<atomic<i32>>;",
        "var<storage, read> vals: array<u32>;",
        "atomicAdd(&hist[u32(((v % 8u)))], 1u)",
        "atomicExchange(&lows[2u], 7i)",
        "atomicStore(&hist[12u], (atomicLoad(&hist[12u]) + 1u));",
        "atomicStore(&hist[13u], (atomicLoad(&hist[13u]) + u32(prev)));",
    ] {
        assert!(wgsl.contains(s), "WGSL lacks {s}:\n{wgsl}");
    }
    let w = transpile_global_kernel_wgsl(&f).unwrap();
    let atomic: Vec<bool> = w
        .bindings
        .iter()
        .filter_map(|b| match b.kind {
            BindingKind::Storage { atomic, .. } => Some(atomic),
            BindingKind::Params | BindingKind::Structs { .. } => None,
        })
        .collect();
    assert_eq!(atomic, [false, true, true]);
}

/// The kernels the execution tests run, CUDA side: valid C++ with the CUDA shim (NVRTC
/// runs them in the ignored CUDA tests).
#[test]
fn execution_kernels_cuda_type_checks() {
    let cfg = StencilConfig::new(1);
    for f in [
        kernels::saxpy::source(),
        kernels::branchy::source(),
        kernels::classify::source(),
        kernels::loops::source(),
        kernels::mixed::source(),
        kernels::histogram::source(),
        kernels::control::source(),
        kernels::block_reduce::source(),
        kernels::tile_transpose::source(),
        kernels::with_helpers::source(),
    ] {
        check_cuda_syntax(&transpile_global_kernel(&f).unwrap());
    }
    check_cuda_syntax(&transpile_stencil_kernel(&kernels::laplace::source(), &cfg).unwrap());
    let cfg3 = StencilConfig::new_3d(1);
    check_cuda_syntax(&transpile_stencil_kernel(&kernels::heat3::source(), &cfg3).unwrap());
}

/// Rust names that are keywords, reserved words, types or built-ins of CUDA C or WGSL
/// are renamed; the output still validates and type-checks.
#[test]
fn reserved_words_become_valid_names() {
    let names = [
        "active",
        "array",
        "atomic",
        "atomicAdd",
        "bitcast",
        "bool_",
        "class",
        "double",
        "f16",
        "f32",
        "fma",
        "float",
        "int",
        "main",
        "mat2x2",
        "meta",
        "min",
        "ptr",
        "r#match",
        "r#type",
        "r#use",
        "sampler",
        "select",
        "shared",
        "sqrtf",
        "texture_2d",
        "threadIdx",
        "u32",
        "uniform",
        "unsigned",
        "var",
        "vec3",
        "vec3u",
        "wgsl",
        "workgroup",
        "__x",
        "rk_params_",
    ];
    let mut body = String::new();
    let mut sum = String::from("0.0");
    for (k, n) in names.iter().enumerate() {
        if n.starts_with("rk_") {
            continue;
        }
        body.push_str(&format!("let {n} = {k}.0f32; "));
        sum.push_str(&format!(" + {n}"));
    }
    let src = format!(
        "fn names(out: &mut [f32], vec2: f32, select_: i32) {{ {body} out[0] = {sum} + vec2 + \
         select_ as f32; }}"
    );
    let f: syn::ItemFn = syn::parse_str(&src).unwrap();
    let (cuda, wgsl) = both(&f);
    assert!(cuda.contains("float float_ = 11.0f;"), "{cuda}");
    assert!(wgsl.contains("let vec3_: f32"), "{wgsl}");
    assert!(wgsl.contains("let match_: f32"), "{wgsl}");
    assert!(wgsl.contains("let v__x: f32"), "{wgsl}");
}

#[test]
fn kernel_params_describe_the_signature() {
    use ringkernel_codegen::{kernel_params, KernelParam, ParamKind};
    let f: syn::ItemFn = parse_quote! {
        fn k(pos: GridPos3, a: f64, x: &[f32], flag: bool, y: &mut [u32]) {}
    };
    let p = kernel_params(&f).unwrap();
    let kp = |name: &str, kind| KernelParam {
        name: name.into(),
        kind,
    };
    assert_eq!(
        p,
        vec![
            kp("pos", ParamKind::GridPos { dims: 3 }),
            kp("a", ParamKind::Scalar(ScalarType::F64)),
            kp(
                "x",
                ParamKind::Slice {
                    elem: ScalarType::F32,
                    mutable: false
                }
            ),
            kp("flag", ParamKind::Scalar(ScalarType::Bool)),
            kp(
                "y",
                ParamKind::Slice {
                    elem: ScalarType::U32,
                    mutable: true
                }
            ),
        ]
    );
    let bad: syn::ItemFn = parse_quote! { fn k(n: usize) {} };
    assert!(kernel_params(&bad).is_err());
}

/// naga's MSL of every kernel the execution tests run (also where no adapter runs them):
/// workgroup memory becomes `threadgroup`, barriers `threadgroup_barrier`, helpers
/// functions of their own.
#[test]
fn execution_kernels_give_msl() {
    for f in [
        kernels::saxpy::source(),
        kernels::branchy::source(),
        kernels::classify::source(),
        kernels::loops::source(),
        kernels::mixed::source(),
        kernels::histogram::source(),
        kernels::control::source(),
        kernels::with_helpers::source(),
    ] {
        check_wgsl(&transpile_global_kernel_wgsl(&f).unwrap());
    }
    let reduce =
        transpile_global_kernel_wgsl_with(&kernels::block_reduce::source(), [256, 1, 1]).unwrap();
    assert!(reduce
        .source
        .contains("var<workgroup> part: array<f32, 256>;"));
    let msl = check_wgsl(&reduce);
    assert!(msl.contains("threadgroup"), "{msl}");
    assert!(msl.contains("threadgroup_barrier"), "{msl}");
    let tile =
        transpile_global_kernel_wgsl_with(&kernels::tile_transpose::source(), [16, 16, 1]).unwrap();
    assert!(check_wgsl(&tile).contains("threadgroup_barrier"));
    let helpers =
        check_wgsl(&transpile_global_kernel_wgsl(&kernels::with_helpers::source()).unwrap());
    assert!(helpers.contains("rk_fn_smooth"), "{helpers}");
    let cfg = StencilConfig::new(1);
    check_wgsl(&transpile_stencil_kernel_wgsl(&kernels::laplace::source(), &cfg).unwrap());
    let cfg3 = StencilConfig::new_3d(1);
    check_wgsl(&transpile_stencil_kernel_wgsl(&kernels::heat3::source(), &cfg3).unwrap());
}
