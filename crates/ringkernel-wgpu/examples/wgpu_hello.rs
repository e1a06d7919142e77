//! Runs one actor (`rk.echo`) and one op (a vector add) on whatever wgpu adapter is found.
//!
//! ```text
//! cargo run -p ringkernel-wgpu --example wgpu_hello
//! RINGKERNEL_WGPU_ADAPTER=software cargo run -p ringkernel-wgpu --example wgpu_hello
//! ```
//!
//! Exits 0 with a message when the machine has no adapter.

use ringkernel_core::builtin::{Token, ECHO};
use ringkernel_core::compute::{BinaryOp, ComputeBackend};
use ringkernel_core::options::LaunchOptions;
use ringkernel_core::registry::KernelRegistry;
use ringkernel_core::runtime::RingKernelRuntime;
use ringkernel_core::Error;
use ringkernel_wgpu::{probe, WgpuCompute, WgpuRuntime};
use std::time::Duration;

fn main() -> Result<(), Error> {
    let adapters = probe()?;
    for a in &adapters {
        println!("adapter: {a}");
    }
    let gpu = match WgpuCompute::new() {
        Ok(g) => g,
        Err(e @ Error::BackendUnavailable { .. }) => {
            println!("no usable wgpu adapter, nothing to run: {e}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    println!("compute on {}", gpu.device_name());
    let a = gpu.upload(&[1.0, 2.0, 3.0, 4.0])?;
    let b = gpu.upload(&[10.0, 20.0, 30.0, 40.0])?;
    let c = gpu.alloc(4)?;
    gpu.binary(BinaryOp::Add, &*a, &*b, &*c, 4)?;
    let mut out = [0.0f32; 4];
    gpu.read(&*c, 0, &mut out)?;
    println!("[1,2,3,4] + [10,20,30,40] = {out:?}");

    pollster::block_on(async {
        let rt = WgpuRuntime::with_context(KernelRegistry::new(), gpu.context().clone());
        println!("runtime: {}", rt.device_info());
        let echo = rt.launch(ECHO, LaunchOptions::default()).await?;
        let reply: Token = echo
            .call(Token::new(1, 21.0), Duration::from_secs(10))
            .await?;
        println!(
            "rk.echo replied value {} after {} hop(s)",
            reply.value, reply.hops
        );
        let report = rt.shutdown().await?;
        println!("shut down {} kernel(s)", report.kernels);
        Ok(())
    })
}
