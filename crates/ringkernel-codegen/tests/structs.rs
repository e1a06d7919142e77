//! `GpuType` structs in kernels: struct parameters (slices and values), locals, field
//! access, struct literals with `..base`, 64-bit fields copied whole on WGSL. Translated
//! to both targets (naga validation and MSL, a C++ syntax check of the CUDA), executed on
//! a wgpu adapter (lavapipe in CI) against the same Rust on the CPU, and the errors.

mod common;
mod kernels;

use common::{check_cuda_syntax, check_wgsl, gpu, run, Data, Rng};
use kernels::{particles, random_particles};
use ringkernel_codegen::dsl::launch;
use ringkernel_codegen::{
    kernel_params, transpile_global_kernel, transpile_global_kernel_wgsl, BindingKind, ParamKind,
};

fn words_of<T: bytemuck::Pod>(v: &[T]) -> Vec<u32> {
    bytemuck::cast_slice(v).to_vec()
}

#[test]
fn struct_kernel_translates_to_both_targets() {
    let f = particles::source();
    let cuda = transpile_global_kernel(&f).unwrap();
    check_cuda_syntax(&cuda);
    assert!(
        cuda.contains("struct Particle {\n    unsigned long long id;\n    float pos[3];"),
        "{cuda}"
    );
    assert!(
        cuda.contains("void step(Particle* ps, const Params* rk_ref_params, Particle* out)"),
        "{cuda}"
    );
    assert!(cuda.contains("Params params = rk_ref_params[0];"), "{cuda}");
    let w = transpile_global_kernel_wgsl(&f).unwrap();
    let msl = check_wgsl(&w);
    assert!(msl.contains("Particle"), "{msl}");
    assert!(w.source.contains("id: vec2<u32>,"), "{}", w.source);
    let kinds: Vec<BindingKind> = w.bindings.iter().map(|b| b.kind).collect();
    assert_eq!(
        kinds,
        [
            BindingKind::Structs {
                ty: "Particle",
                size: 40,
                read_only: false
            },
            BindingKind::Structs {
                ty: "Params",
                size: 16,
                read_only: true
            },
            BindingKind::Structs {
                ty: "Particle",
                size: 40,
                read_only: false
            },
        ]
    );
    assert_eq!(w.params_size, 0);
    let params = kernel_params(&f).unwrap();
    assert_eq!(
        params[1].kind,
        ParamKind::Struct {
            name: "Params",
            size: 16
        }
    );
    assert_eq!(
        params[0].kind,
        ParamKind::StructSlice {
            name: "Particle",
            size: 40,
            mutable: true
        }
    );
}

#[test]
fn struct_kernel_matches_cpu() {
    use particles::{Params, Particle};
    let Some(ctx) = gpu("struct_kernel_matches_cpu") else {
        return;
    };
    let mut rng = Rng::fresh("struct_kernel");
    let k = transpile_global_kernel_wgsl(&particles::source()).unwrap();
    check_wgsl(&k);
    for n in [1usize, 63, rng.usize(100, 1500)] {
        let ps = random_particles(&mut rng, n);
        let params = Params {
            dt: 0.05,
            gravity: 9.81,
            floor: rng.f32(-0.5, 0.5),
            n: n as u32,
        };
        // Poisoned outputs (and one spare element past n that must stay so).
        let poison = Particle {
            id: u64::MAX,
            pos: [f32::NAN; 3],
            vel: [-7.0; 3],
            mass: -1.0,
            hits: 77,
        };
        let mut cpu_ps = ps.clone();
        cpu_ps.push(poison);
        let mut cpu_out = vec![poison; n + 1];
        let groups = [(n as u32).div_ceil(64), 1, 1];
        launch(groups, [64, 1, 1], || {
            particles::step(&mut cpu_ps, params, &mut cpu_out)
        });
        let mut gpu_ps = ps.clone();
        gpu_ps.push(poison);
        let mut data = [
            Data::U32(words_of(&gpu_ps)),
            Data::U32(words_of(&[params])),
            Data::U32(words_of(&vec![poison; n + 1])),
        ];
        run(&ctx, &k, &[], &mut data, groups);
        let got_ps: Vec<Particle> = bytemuck::cast_slice(data[0].u32()).to_vec();
        let got_out: Vec<Particle> = bytemuck::cast_slice(data[2].u32()).to_vec();
        for (what, got, want) in [("ps", &got_ps, &cpu_ps), ("out", &got_out, &cpu_out)] {
            for (i, (g, c)) in got.iter().zip(want.iter()).enumerate() {
                assert_eq!((g.id, g.hits), (c.id, c.hits), "{what}[{i}] of {n}");
                for (a, b) in g
                    .pos
                    .iter()
                    .chain(&g.vel)
                    .chain([&g.mass])
                    .zip(c.pos.iter().chain(&c.vel).chain([&c.mass]))
                {
                    assert!(
                        a.to_bits() == b.to_bits() || (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                        "{what}[{i}] of {n}: GPU {g:?} vs CPU {c:?}"
                    );
                }
            }
        }
    }
}

fn wgsl_err(f: &syn::ItemFn) -> String {
    transpile_global_kernel_wgsl(f)
        .expect_err("an error")
        .to_string()
}

fn cuda_err(f: &syn::ItemFn) -> String {
    transpile_global_kernel(f)
        .expect_err("an error")
        .to_string()
}

#[test]
fn struct_errors_say_what_is_supported() {
    // 64-bit fields: whole copies only on WGSL; anything on CUDA.
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &mut [P]) {
            struct P { id: u64, v: f32, pad: u32 }
            let i = thread_idx_x() as usize;
            ps[i].id = ps[i].id + 1;
        }
    };
    assert!(
        wgsl_err(&f).contains("can only be copied into another `u64` field"),
        "{}",
        wgsl_err(&f)
    );
    check_cuda_syntax(&transpile_global_kernel(&f).unwrap());
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &mut [P]) {
            struct P { id: u64, v: f32, pad: u32 }
            let id = ps[0].id;
        }
    };
    assert!(
        wgsl_err(&f).contains("can only be copied"),
        "{}",
        wgsl_err(&f)
    );
    // Unknown fields, missing fields, read-only places.
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &[P]) {
            struct P { v: f32 }
            let x = ps[0].w;
        }
    };
    assert!(
        cuda_err(&f).contains("struct `P` has no field `w` (its fields: v)"),
        "{}",
        cuda_err(&f)
    );
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &mut [P]) {
            struct P { v: f32, w: f32 }
            ps[0] = P { v: 1.0 };
        }
    };
    assert!(
        cuda_err(&f).contains("missing field `w` of struct `P`"),
        "{}",
        cuda_err(&f)
    );
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &[P]) {
            struct P { v: f32 }
            ps[0].v = 1.0;
        }
    };
    assert!(
        cuda_err(&f).contains("cannot assign into a `&[T]` parameter"),
        "{}",
        cuda_err(&f)
    );
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &[P]) {
            struct P { v: f32 }
            let p = ps[0];
            p.v = 2.0;
        }
    };
    assert!(
        cuda_err(&f).contains("cannot assign to a field of `p`: it is not declared `mut`"),
        "{}",
        cuda_err(&f)
    );
    // A struct nobody defined, and implicit padding.
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &[Q]) {}
    };
    assert!(
        cuda_err(&f).contains("unknown type `Q`: a struct used in a kernel derives `GpuType`"),
        "{}",
        cuda_err(&f)
    );
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &[P]) {
            struct P { a: u32, b: u64 }
        }
    };
    assert!(
        cuda_err(&f).contains("implicit padding"),
        "{}",
        cuda_err(&f)
    );
    // Whole arrays are not values.
    let f: syn::ItemFn = syn::parse_quote! {
        fn k(ps: &mut [P]) {
            struct P { a: [f32; 2] }
            let mut q = ps[0];
            q.a = ps[1].a;
        }
    };
    assert!(
        cuda_err(&f).contains("a whole array cannot be assigned"),
        "{}",
        cuda_err(&f)
    );
}
