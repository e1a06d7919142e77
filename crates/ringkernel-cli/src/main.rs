//! `ringkernel`: backend info, the verified end-to-end demo, and quick benchmarks.

mod bench;
mod bench_ops;
mod demo;
mod info;
mod stats;
mod wavesim;

use clap::{Parser, Subcommand};
use ringkernel::Backend;
use std::process::ExitCode;

/// RingKernel: persistent GPU actors and portable compute ops on CPU, CUDA, WebGPU and
/// Metal.
#[derive(Debug, Parser)]
#[command(name = "ringkernel", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show each backend: available and on which device, or why not.
    Info(info::InfoArgs),
    /// Push tokens through a 3-stage K2K pipeline and a pub/sub fan-out, verify that
    /// nothing was lost and that HLC order held, and print throughput and latency.
    Demo(demo::DemoArgs),
    /// Quick measurements beside peers measured in the same run.
    Bench(BenchCmd),
    /// WaveSim: the acoustic wave simulation (`--headless` writes PNG frames), and
    /// `wavesim bench`.
    Wavesim(wavesim::WavesimCmd),
}

/// `ringkernel bench [ops]`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchCmd {
    #[command(subcommand)]
    sub: Option<BenchSub>,
    #[command(flatten)]
    quick: bench::QuickArgs,
}

#[derive(Debug, Subcommand)]
enum BenchSub {
    /// Compute ops: GFLOP/s or GB/s per op and size, on the chosen device.
    Ops(bench_ops::BenchOpsArgs),
}

/// clap value parser for `--backend`.
pub(crate) fn parse_backend(s: &str) -> Result<Backend, String> {
    s.parse::<Backend>().map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Info(a) => {
            info::run(&a);
            ExitCode::SUCCESS
        }
        Command::Demo(a) => {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return fail(&format!("cannot start the tokio runtime: {e}")),
            };
            match rt.block_on(demo::run(&a)) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => fail(&e.to_string()),
            }
        }
        Command::Wavesim(w) => match wavesim::run(&w) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e.to_string()),
        },
        Command::Bench(b) => {
            let r = match b.sub {
                None => bench::run(&b.quick),
                Some(BenchSub::Ops(a)) => bench_ops::run(&a),
            };
            match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e.to_string()),
            }
        }
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn demo_defaults() {
        let cli = Cli::try_parse_from(["ringkernel", "demo"]).unwrap();
        let Command::Demo(a) = cli.command else {
            panic!("not demo")
        };
        assert_eq!(a.messages, 1_000_000);
        assert_eq!(a.backend, Backend::Auto);
        assert!(Cli::try_parse_from(["ringkernel", "demo", "--backend", "tpu"]).is_err());
        assert!(Cli::try_parse_from(["ringkernel", "demo", "--publish-percent", "101"]).is_err());
    }

    #[test]
    fn bench_and_bench_ops_parse() {
        let cli = Cli::try_parse_from(["ringkernel", "bench", "--round-trips", "10"]).unwrap();
        let Command::Bench(b) = cli.command else {
            panic!("not bench")
        };
        assert!(b.sub.is_none());
        assert_eq!(b.quick.round_trips, 10);
        let cli = Cli::try_parse_from(["ringkernel", "bench", "ops", "--help"]);
        assert!(matches!(cli, Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp));
        let cli = Cli::try_parse_from(["ringkernel", "bench", "ops"]).unwrap();
        let Command::Bench(b) = cli.command else {
            panic!("not bench")
        };
        assert!(matches!(b.sub, Some(BenchSub::Ops(_))));
    }
}
