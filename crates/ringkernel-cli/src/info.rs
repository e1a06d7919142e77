//! `ringkernel info`: what each backend would run on, or why it cannot.

use ringkernel::{probe_backends, Availability};

/// Arguments of `ringkernel info`.
#[derive(Debug, Clone, clap::Args)]
pub struct InfoArgs {}

/// Prints one block per backend; returns how many are available.
pub fn run(_args: &InfoArgs) -> usize {
    println!(
        "RingKernel {} backends (in Auto's order of preference)",
        env!("CARGO_PKG_VERSION")
    );
    let mut available = 0;
    for p in probe_backends() {
        match &p.availability {
            Availability::Available { device } => {
                available += 1;
                println!("  {:<6} available    {device}", p.backend.as_str());
            }
            Availability::Unavailable { reason } => {
                println!("  {:<6} unavailable  {reason}", p.backend.as_str());
            }
        }
        for d in &p.details {
            println!("  {:<6}   {d}", "");
        }
    }
    available
}
