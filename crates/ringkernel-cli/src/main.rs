//! `ringkernel`: backend info, the verified end-to-end demo, and quick benchmarks.

mod bench;
mod bench_ops;
mod demo;
mod info;
mod llm;
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
    /// WaveSim: the acoustic wave simulation in a window (draw absorbers, walls and
    /// sources with the mouse), `--headless` PNG frames, and `wavesim bench`.
    Wavesim(wavesim::WavesimCmd),
    /// Generate a reply with SmolLM2-135M (GGUF, quantized) and print tokens/s.
    Generate(llm::GenerateArgs),
    /// Chat with SmolLM2-135M: one message per line on standard input.
    Chat(llm::ChatArgs),
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
    /// SmolLM2 decode tokens/s and time to first token on the chosen device.
    Llm(llm::LlmBenchArgs),
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
                Some(BenchSub::Llm(a)) => {
                    return match llm::bench_llm(&a) {
                        Ok(()) => ExitCode::SUCCESS,
                        Err(e) => fail(&e),
                    }
                }
            };
            match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e.to_string()),
            }
        }
        Command::Generate(a) => match llm::generate(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
        Command::Chat(a) => match llm::chat(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
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

    #[test]
    fn generate_and_chat_parse() {
        let cli = Cli::try_parse_from(["ringkernel", "generate", "--prompt", "hi"]).unwrap();
        let Command::Generate(g) = cli.command else {
            panic!("not generate")
        };
        assert_eq!(g.prompt, "hi");
        assert_eq!(g.model.on.device, Backend::Auto);
        assert_eq!(g.model.temperature, 0.0);
        assert!(Cli::try_parse_from(["ringkernel", "generate"]).is_err());
        let cli = Cli::try_parse_from([
            "ringkernel",
            "chat",
            "--device",
            "cpu",
            "--temperature",
            "0.7",
            "--top-k",
            "40",
            "--top-p",
            "0.9",
            "--seed",
            "3",
            "--model",
            "m.gguf",
        ])
        .unwrap();
        let Command::Chat(c) = cli.command else {
            panic!("not chat")
        };
        assert_eq!((c.model.top_k, c.model.seed), (40, 3));
        assert_eq!(c.model.on.device, Backend::Cpu);
        assert!(Cli::try_parse_from(["ringkernel", "chat", "--device", "tpu"]).is_err());
    }

    #[test]
    fn llm_devices_open_or_say_why_not() {
        let cpu = llm::open_device(Backend::Cpu, Some(1)).unwrap();
        assert!(cpu.name().contains("1 thread"));
        assert!(llm::open_device(Backend::Cpu, Some(0)).is_err());
        for b in [Backend::Cuda, Backend::Metal] {
            // no CUDA GPU or Metal here: an error naming the device flag
            if let Err(e) = llm::open_device(b, None) {
                assert!(e.contains(b.as_str()), "{e}");
            }
        }
        let cli = Cli::try_parse_from([
            "ringkernel",
            "bench",
            "llm",
            "--device",
            "cpu",
            "--runs",
            "2",
        ])
        .unwrap();
        let Command::Bench(BenchCmd {
            sub: Some(BenchSub::Llm(a)),
            ..
        }) = cli.command
        else {
            panic!("not bench llm")
        };
        assert_eq!(
            (a.runs, a.prompt_tokens, a.on.device),
            (2, 128, Backend::Cpu)
        );
    }
}
