//! Shared by the examples (not an example itself): the `--backend` and `--device` flags,
//! and reporting an error in words.
//!
//! A GPU backend needs its cargo feature (`--features cuda`, `wgpu`, `metal` or `full`);
//! asking for one left out of the build ends with "not compiled in: enable feature ...".

#![allow(dead_code)] // each example uses some of these

use ringkernel::compute::Device;
use ringkernel::{Backend, Error, Result};
use std::process::ExitCode;

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
