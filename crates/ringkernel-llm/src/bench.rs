//! Decode speed and time to first token, measured the same way on every device: a
//! prompt of a fixed number of tokens (a fixed English text tokenized, repeated and cut
//! to length, no chat template), greedy decoding of a fixed number of tokens without
//! stopping at end-of-turn tokens.
//!
//! ```no_run
//! use ringkernel::compute::Device;
//! use ringkernel_llm::{bench, Session};
//! let mut s = Session::open_on("model.gguf", 2048, &Device::cpu())?;
//! let r = bench::run(&mut s, 128, 64)?;
//! println!("{:.0} ms to the first token, {:.1} tokens/s", r.ttft_ms(), r.decode_tokens_per_s());
//! # Ok::<(), ringkernel_llm::LlmError>(())
//! ```

use crate::error::{LlmError, Result};
use crate::generate::Session;
use crate::sample::argmax;
use std::time::{Duration, Instant};

/// The text the prompt is cut from.
pub const PROMPT_TEXT: &str = "The history of computing is a story of machines that grew \
smaller, faster and cheaper while the problems people asked them to solve grew larger. \
Early computers filled rooms and ran one program at a time; today a phone holds more \
memory than all of them together, and graphics processors run thousands of threads at \
once to train and serve language models. ";

/// Replays of the decode step that time it after a run
/// ([`BenchResult::step_device`]); greedy steps run the positions after the run's, so
/// a cache with this many more positions than the run needs times all of them.
pub const REPLAYS: usize = 64;

/// One measured run.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    /// The device, as `Device`'s `Display` writes it.
    pub device: String,
    /// How decode steps ran ([`crate::model::KvCache::step_mode`]).
    pub step_mode: String,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// From the start of the prompt to the first new token's logits on the host.
    pub ttft: Duration,
    /// Tokens decoded after the first (one step each).
    pub decoded: usize,
    /// Time of those steps, each with the argmax of its logits (on the device, reading
    /// back the index, or on the host from the logits read back: [`Argmax`]).
    pub decode: Duration,
    /// The generated ids (greedy), the first one included.
    pub tokens: Vec<u32>,
    /// Device time of one decode step where steps are recorded
    /// ([`crate::model::Model::replay_time`], [`REPLAYS`] replays after the run, fewer
    /// where the cache has fewer free positions).
    pub step_device: Option<Duration>,
}

impl BenchResult {
    /// Time to first token in milliseconds.
    pub fn ttft_ms(&self) -> f64 {
        self.ttft.as_secs_f64() * 1e3
    }

    /// Decode steps per second.
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode.is_zero() {
            0.0
        } else {
            self.decoded as f64 / self.decode.as_secs_f64()
        }
    }
}

/// The first `n` tokens of [`PROMPT_TEXT`] repeated (beginning-of-text first when the
/// vocabulary has one).
pub fn prompt_ids(s: &Session, n: usize) -> Vec<u32> {
    let text = s.tokenizer().encode(PROMPT_TEXT, false);
    let mut ids: Vec<u32> = s.tokenizer().bos().into_iter().collect();
    while ids.len() < n {
        ids.extend(&text);
    }
    ids.truncate(n);
    ids
}

/// Where a decode step's greedy token is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argmax {
    /// On the device, each step feeding the next and the host reading the index of step
    /// k after queueing step k+1 ([`Model::decode_greedy`](crate::model::Model::decode_greedy)).
    Device,
    /// On the device, the host reading back each step's index before it queues the next
    /// ([`Model::forward_greedy`](crate::model::Model::forward_greedy)).
    DeviceEachStep,
    /// On the host, from the logits read back ([`Model::forward`](crate::model::Model::forward)).
    Host,
}

/// Runs a prompt of `prompt_tokens` tokens on a fresh cache, then `new_tokens` greedy
/// tokens (the first from the prompt's logits, each later one a decode step whose
/// argmax is taken on the device).
pub fn run(s: &mut Session, prompt_tokens: usize, new_tokens: usize) -> Result<BenchResult> {
    run_with(s, prompt_tokens, new_tokens, Argmax::Device)
}

/// [`run`], with the decode steps' argmax taken where `argmax_on` says.
pub fn run_with(
    s: &mut Session,
    prompt_tokens: usize,
    new_tokens: usize,
    argmax_on: Argmax,
) -> Result<BenchResult> {
    if prompt_tokens == 0 || new_tokens == 0 {
        return Err(LlmError::InvalidArgument(
            "the benchmark needs at least one prompt token and one new token".into(),
        ));
    }
    let ids = prompt_ids(s, prompt_tokens);
    s.reset();
    let (model, cache) = s.model_and_cache();
    if prompt_tokens + new_tokens > cache.capacity() {
        return Err(LlmError::InvalidArgument(format!(
            "{prompt_tokens} prompt + {new_tokens} new tokens exceed the context of {}",
            cache.capacity()
        )));
    }
    let t0 = Instant::now();
    let logits = model.prefill(&ids, cache)?;
    let mut next = argmax(&logits) as u32;
    let ttft = t0.elapsed();
    let mut tokens = vec![next];
    let t1 = Instant::now();
    match argmax_on {
        Argmax::Device => {
            model.decode_greedy(next, cache, new_tokens - 1, |t| {
                tokens.push(t);
                true
            })?;
        }
        Argmax::DeviceEachStep | Argmax::Host => {
            for _ in 1..new_tokens {
                next = if argmax_on == Argmax::Host {
                    argmax(&model.forward(next, cache)?) as u32
                } else {
                    model.forward_greedy(next, cache)?
                };
                tokens.push(next);
            }
        }
    }
    let decode = t1.elapsed();
    let step_mode = cache.step_mode();
    let step_device = model.replay_time(cache, REPLAYS)?;
    s.reset();
    Ok(BenchResult {
        device: s.model().device().to_string(),
        step_mode,
        prompt_tokens,
        ttft,
        decoded: new_tokens - 1,
        decode,
        tokens,
        step_device,
    })
}
