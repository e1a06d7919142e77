//! `#[gpu_kernel]` functions with `GpuType` struct parameters (a slice of structs and a
//! struct by value), struct locals, field access and struct literals, launched through
//! `Device`: the CPU runs the Rust, wgpu (lavapipe here) and CUDA the generated code;
//! results must match on fresh random inputs of awkward sizes.

#![cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]

use ringkernel::codegen::dsl::*;
use ringkernel::codegen::launch::KernelArg;
use ringkernel::compute::Device;
use ringkernel::core::util::SplitMix64;
use ringkernel::{gpu_kernel, Error, GpuType};

/// A body with an id, a position and a velocity (the `u64` is copied whole on WGSL).
#[derive(Clone, Copy, Debug, Default, PartialEq, GpuType)]
#[repr(C)]
struct Body {
    id: u64,
    pos: [f32; 2],
    vel: [f32; 2],
    mass: f32,
    bounces: u32,
}

/// The simulation's settings, passed by value.
#[derive(Clone, Copy, Debug, GpuType)]
#[repr(C)]
struct World {
    dt: f32,
    gravity: f32,
    width: f32,
    n: u32,
}

/// One explicit Euler step with bouncing walls; `trail` gets the body's old position.
#[gpu_kernel]
fn advance(bodies: &mut [Body], world: World, trail: &mut [Body]) {
    let i = block_idx_x() * block_dim_x() + thread_idx_x();
    if i as u32 >= world.n {
        return;
    }
    let old = bodies[i as usize];
    let mut b = old;
    b.vel[1] -= world.gravity * world.dt;
    for k in 0..2usize {
        b.pos[k] += b.vel[k] * world.dt;
        if b.pos[k] < 0.0 || b.pos[k] > world.width {
            b.vel[k] = -b.vel[k];
            b.pos[k] = b.pos[k].clamp(0.0, world.width);
            b.bounces += 1;
        }
    }
    bodies[i as usize] = b;
    trail[i as usize] = Body {
        vel: [0.0; 2],
        mass: old.mass * 0.5,
        ..old
    };
}

fn bodies(r: &mut SplitMix64, n: usize) -> Vec<Body> {
    (0..n)
        .map(|i| Body {
            id: r.next_u64() ^ i as u64,
            pos: [r.uniform(0.0, 10.0), r.uniform(0.0, 10.0)],
            vel: [r.uniform(-30.0, 30.0), r.uniform(-30.0, 30.0)],
            mass: r.uniform(0.5, 2.0),
            bounces: r.below(3) as u32,
        })
        .collect()
}

fn close(a: &Body, b: &Body) -> bool {
    let f = |x: f32, y: f32| x.to_bits() == y.to_bits() || (x - y).abs() <= 1e-5 * y.abs().max(1.0);
    a.id == b.id
        && a.bounces == b.bounces
        && a.pos.iter().zip(&b.pos).all(|(x, y)| f(*x, *y))
        && a.vel.iter().zip(&b.vel).all(|(x, y)| f(*x, *y))
        && f(a.mass, b.mass)
}

fn structs_match_cpu(dev: &Device) {
    let cpu = Device::cpu();
    let seed = SplitMix64::from_entropy().next_u64();
    let mut r = SplitMix64::new(seed);
    for n in [1usize, 65, 1000, 2049] {
        let start = bodies(&mut r, n);
        let world = World {
            dt: 0.05,
            gravity: 9.81,
            width: 10.0,
            n: n as u32,
        };
        let poison = Body {
            id: u64::MAX,
            pos: [f32::NAN; 2],
            vel: [-1.0; 2],
            mass: -1.0,
            bounces: 99,
        };
        let g = [(n as u32).div_ceil(64), 1, 1];
        let run = |d: &Device| {
            let mut b = start.clone();
            b.push(poison);
            let mut trail = vec![poison; n + 1];
            for _ in 0..3 {
                d.launch(
                    &ADVANCE,
                    g,
                    [64, 1, 1],
                    &mut [
                        KernelArg::structs_mut(&mut b),
                        KernelArg::value(&world),
                        KernelArg::structs_mut(&mut trail),
                    ],
                )
                .unwrap();
            }
            (b, trail)
        };
        let (cb, ct) = run(&cpu);
        let (gb, gt) = run(dev);
        for i in 0..=n {
            assert!(
                close(&gb[i], &cb[i]),
                "bodies[{i}] of {n} (seed {seed:#x}, {dev}): {:?} vs CPU {:?}",
                gb[i],
                cb[i]
            );
            assert!(
                close(&gt[i], &ct[i]),
                "trail[{i}] of {n} (seed {seed:#x}, {dev}): {:?} vs CPU {:?}",
                gt[i],
                ct[i]
            );
        }
        assert!(close(&cb[n], &poison), "the element past n is not written");
        assert!(cb[..n].iter().zip(&start).any(|(a, b)| a.pos != b.pos));
    }
}

#[test]
fn cpu_struct_kernels() {
    structs_match_cpu(&Device::cpu());
    // Wrong struct arguments are typed errors, on every device (checked before a run).
    let w = World {
        dt: 0.1,
        gravity: 1.0,
        width: 1.0,
        n: 1,
    };
    let mut b = vec![Body::default(); 2];
    let mut t = vec![Body::default(); 2];
    let not_a_world = Body::default();
    let e = Device::cpu()
        .launch(
            &ADVANCE,
            [1, 1, 1],
            [64, 1, 1],
            &mut [
                KernelArg::structs_mut(&mut b),
                KernelArg::value(&not_a_world),
                KernelArg::structs_mut(&mut t),
            ],
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(
        e.to_string()
            .contains("parameter `world` is a `World`, the argument is a `Body`"),
        "{e}"
    );
    let bodies_ro = vec![Body::default(); 2];
    let e = Device::cpu()
        .launch(
            &ADVANCE,
            [1, 1, 1],
            [64, 1, 1],
            &mut [
                KernelArg::structs(&bodies_ro),
                KernelArg::value(&w),
                KernelArg::structs_mut(&mut t),
            ],
        )
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("parameter `bodies` is a `&mut [Body]`, the argument is a `&[Body]`"),
        "{e}"
    );
    assert!(ADVANCE.cuda_source.contains("struct Body {"));
    assert!(ADVANCE.wgsl_source.unwrap().contains("id: vec2<u32>,"));
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_struct_kernels_match_the_cpu() {
    structs_match_cpu(&Device::wgpu().unwrap());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs CUDA GPU"]
fn cuda_struct_kernels_match_the_cpu() {
    structs_match_cpu(&Device::cuda(0).unwrap());
}
