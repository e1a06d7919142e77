//! The three macros: `#[derive(RingMessage)]`, `#[derive(GpuType)]` and `#[ring_kernel]`.
//!
//! ```text
//! cargo run -p ringkernel --example derive_macros
//! ```
//!
//! * `RingMessage` turns a `#[repr(C)]` plain-data struct into a message with a stable
//!   type id, checked at compile time (no padding, every field plain data).
//! * `GpuType` checks that a struct has the same layout in Rust and in a WGSL storage
//!   buffer, and writes its WGSL declaration.
//! * `#[ring_kernel]` registers a function as a CPU handler by name, so `launch` finds
//!   it without any registry code.
//!
//! `#[ring_kernel]` handlers are CPU handlers, so this example always runs on the CPU.

use ringkernel::prelude::*;
use std::time::Duration;

/// A request: scale `value` by `factor`.
#[derive(Clone, Copy, Debug, RingMessage)]
#[message(type_id = 0x4458_0001)]
#[repr(C)]
struct Scale {
    id: u64,
    factor: f32,
    value: f32,
}

/// The reply.
#[derive(Clone, Copy, Debug, RingMessage)]
#[message(type_id = 0x4458_0002, name = "Scaled")]
#[repr(C)]
struct Scaled {
    id: u64,
    value: f32,
    calls: u32,
}

/// A particle as a GPU kernel would see it in a storage buffer.
#[derive(Clone, Copy, Debug, GpuType)]
#[repr(C)]
struct Particle {
    id: u64,
    pos: [f32; 3],
    mass: f32,
}

/// Stateless handler: registered as "scale".
#[ring_kernel(name = "scale")]
fn scale(_ctx: &mut KernelContext<'_>, m: Scale) -> Option<Scaled> {
    Some(Scaled {
        id: m.id,
        value: m.value * m.factor,
        calls: 0,
    })
}

/// Stateful handler (one `u32` per launched kernel, starting at 0): registered under
/// its function name, "counting_scale".
#[ring_kernel]
fn counting_scale(_ctx: &mut KernelContext<'_>, calls: &mut u32, m: Scale) -> Option<Scaled> {
    *calls += 1;
    Some(Scaled {
        id: m.id,
        value: m.value * m.factor,
        calls: *calls,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    // RingMessage: ids and names are constants of the type.
    assert_eq!(Scale::TYPE_ID, 0x4458_0001);
    assert_eq!(<Scaled as RingMessage>::NAME, "Scaled");
    assert_eq!(std::mem::size_of::<Scale>(), 16);
    println!(
        "Scale: type_id {:#x}, {} bytes",
        Scale::TYPE_ID,
        std::mem::size_of::<Scale>()
    );

    // GpuType: the WGSL declaration and a layout WGSL's own rules agree with.
    print!("Particle in WGSL:\n{}", Particle::WGSL_STRUCT);
    let wgsl = ringkernel::core::gpu_type::wgsl_struct_layout(Particle::WGSL_STRUCT)?;
    assert_eq!(wgsl.size, std::mem::size_of::<Particle>());
    assert_eq!(
        wgsl.fields.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
        vec![0, 8, 20]
    );
    assert_eq!(Particle::FIELDS, &[("id", 0), ("pos", 8), ("mass", 20)]);

    // #[ring_kernel]: no registration code; launch by name.
    let rt = RingKernel::builder().backend(Backend::Cpu).build().await?;
    assert!(rt.registry().cpu_names().iter().any(|n| n == "scale"));
    let k = rt.launch("scale", LaunchOptions::default()).await?;
    let r: Scaled = k
        .call(
            Scale {
                id: 1,
                factor: 2.0,
                value: 21.0,
            },
            Duration::from_secs(5),
        )
        .await?;
    println!("scale(21 x 2) = {}", r.value);
    assert_eq!((r.id, r.value), (1, 42.0));

    let c = rt
        .launch("counting_scale", LaunchOptions::default())
        .await?;
    for i in 1..=3u32 {
        let r: Scaled = c
            .call(
                Scale {
                    id: i as u64,
                    factor: 0.5,
                    value: 8.0,
                },
                Duration::from_secs(5),
            )
            .await?;
        assert_eq!((r.value, r.calls), (4.0, i));
    }
    println!("counting_scale kept its state: 3 calls counted");

    rt.shutdown().await?;
    println!("ok");
    Ok(())
}
