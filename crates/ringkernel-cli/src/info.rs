//! `ringkernel info`: each backend with its state: available (on which device),
//! unavailable (why) or not compiled in (which feature to enable).

use ringkernel::{probe_backends, BackendProbe};

/// Arguments of `ringkernel info`.
#[derive(Debug, Clone, clap::Args)]
pub struct InfoArgs {}

/// Prints one block per backend; returns how many are available.
pub fn run(_args: &InfoArgs) -> usize {
    println!(
        "RingKernel {} backends (in Auto's order of preference)",
        env!("CARGO_PKG_VERSION")
    );
    let probes = probe_backends();
    for p in &probes {
        for line in lines(p) {
            println!("{line}");
        }
    }
    probes.iter().filter(|p| p.is_available()).count()
}

/// The lines `info` prints for one backend: name, state and device or reason, then
/// any details (the wgpu adapters), indented.
fn lines(p: &BackendProbe) -> Vec<String> {
    let a = &p.availability;
    let mut out = vec![format!(
        "  {:<6} {:<16} {}",
        p.backend.as_str(),
        a.state(),
        a.detail()
    )];
    out.extend(p.details.iter().map(|d| format!("  {:<6}   {d}", "")));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringkernel::{Availability, BackendKind};

    #[test]
    fn every_backend_gets_a_line_with_its_state() {
        let probes = probe_backends();
        assert_eq!(probes.len(), BackendKind::ALL.len());
        for p in &probes {
            let first = &lines(p)[0];
            assert!(
                first.trim_start().starts_with(p.backend.as_str()),
                "{first}"
            );
            assert!(first.contains(p.availability.state()), "{first}");
            // The CLI builds every backend in.
            assert!(
                !matches!(p.availability, Availability::NotCompiledIn { .. }),
                "{first}"
            );
        }
    }

    #[test]
    fn a_backend_left_out_names_its_feature() {
        let p = BackendProbe {
            backend: BackendKind::Cuda,
            availability: Availability::NotCompiledIn { feature: "cuda" },
            details: Vec::new(),
        };
        let l = lines(&p);
        assert_eq!(l.len(), 1);
        assert!(l[0].contains("not compiled in"), "{}", l[0]);
        assert!(l[0].contains("enable feature `cuda`"), "{}", l[0]);
    }
}
