//! Shared by the examples (not an example itself): the `--backend` and `--device` flags,
//! and reporting an error in words.
//!
//! A GPU backend needs its cargo feature (`--features cuda`, `wgpu`, `metal` or `full`);
//! asking for one left out of the build ends with "not compiled in: enable feature ...".

#![allow(dead_code)] // each example uses some of these

use ringkernel::compute::Device;
use ringkernel::prelude::{KernelHandle, KernelMetrics};
use ringkernel::{Backend, Error, Result, RingKernel, RingKernelBuilder};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The value of `--name VALUE` or `--name=VALUE` on the command line, if given.
fn flag(name: &str) -> Result<Option<String>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let long = format!("--{name}");
    let mut value = None;
    let mut i = 0;
    while i < args.len() {
        if let Some(v) = args[i].strip_prefix(&format!("{long}=")) {
            value = Some(v.to_string());
        } else if args[i] == long {
            let v = args
                .get(i + 1)
                .ok_or_else(|| Error::invalid(format!("{long} needs a value")))?;
            value = Some(v.clone());
            i += 1;
        }
        i += 1;
    }
    Ok(value)
}

/// `--backend auto|cpu|cuda|wgpu|metal` (default `cpu`).
pub fn backend_arg() -> Result<Backend> {
    match flag("backend")? {
        Some(v) => v.parse(),
        None => Ok(Backend::Cpu),
    }
}

/// A runtime builder on the backend `--backend` names.
pub fn builder() -> Result<RingKernelBuilder> {
    Ok(RingKernel::builder().backend(backend_arg()?))
}

/// Starts `builder` and says which backend the runtime runs on.
pub async fn start(builder: RingKernelBuilder) -> Result<RingKernel> {
    let rt = builder.build().await?;
    println!("runtime on {}", rt.backend());
    Ok(rt)
}

/// `--device auto|cpu|cuda|wgpu|metal` (default `cpu`), opened and validated.
pub fn device_arg() -> Result<Device> {
    Device::from_name(&flag("device")?.unwrap_or_else(|| "cpu".into()))
}

/// The exit status of an example's `run`: an error is printed in words
/// (e.g. "backend cuda unavailable: not compiled in: enable feature `cuda` ...").
pub fn exit(r: Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A kernel's metrics once every accepted message is accounted for as processed or
/// dropped (counters are updated just after a handler returns, so a reply can arrive a
/// moment before its message is counted); gives up waiting after five seconds.
pub async fn settled(k: &KernelHandle) -> KernelMetrics {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = k.metrics();
        if m.processed + m.dropped >= m.received || Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The `main` of an example whose work is `async fn run() -> Result<()>`: a
/// current-thread tokio runtime, and an error printed in words with a failing exit code.
#[allow(unused_macros)] // not every example has this shape
macro_rules! example_main {
    ($run:ident) => {
        #[tokio::main(flavor = "current_thread")]
        async fn main() -> std::process::ExitCode {
            common::exit($run().await)
        }
    };
}
#[allow(unused_imports)]
pub(crate) use example_main;
