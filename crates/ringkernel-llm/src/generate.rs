//! Chat formatting and the decode loop: prompt in, tokens streamed out, timings kept.
//!
//! ```no_run
//! use ringkernel_llm::generate::{ChatTemplate, Message, Session};
//! use ringkernel_llm::sample::SamplerConfig;
//! let mut s = Session::open("model.gguf", 2048)?; // or Session::open_on(.., &device)
//! let prompt = s.template().render(&[Message::user("Hi!")], true);
//! let stats = s.generate(&prompt, 64, SamplerConfig::greedy(), |text| print!("{text}"))?;
//! println!("\n{:.1} tokens/s", stats.decode_tokens_per_s());
//! # Ok::<(), ringkernel_llm::LlmError>(())
//! ```

use crate::error::{LlmError, Result};
use crate::gguf::GgufFile;
use crate::model::{estimate_memory, KvCache, LlamaConfig, Model};
use crate::sample::{Sampler, SamplerConfig};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use ringkernel::compute::Device;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }
    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: "assistant".into(),
            content: content.into(),
        }
    }
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: "system".into(),
            content: content.into(),
        }
    }
}

/// ChatML (`<|im_start|>role\n…<|im_end|>\n`), the format of SmolLM2's template, with the
/// system message the template inserts when a conversation starts without one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The system message used when the first message is not a system message.
    pub default_system: Option<String>,
}

impl ChatTemplate {
    /// The template of a GGUF file: [`LlmError::Unsupported`] unless
    /// `tokenizer.chat_template` is ChatML; the default system message is taken from it.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let t = f.get_str("tokenizer.chat_template")?;
        if !t.contains("<|im_start|>") || !t.contains("<|im_end|>") {
            return Err(LlmError::Unsupported {
                device: "chat".into(),
                what: "tokenizer.chat_template is not ChatML (<|im_start|>/<|im_end|>)".into(),
            });
        }
        let marker = "<|im_start|>system\n";
        let default_system = t.find(marker).and_then(|i| {
            let rest = &t[i + marker.len()..];
            rest.find("<|im_end|>").map(|j| rest[..j].to_string())
        });
        Ok(Self { default_system })
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends with the
    /// opening of the assistant's turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> String {
        let mut s = String::new();
        if messages.first().is_none_or(|m| m.role != "system") {
            if let Some(sys) = &self.default_system {
                s += &format!("<|im_start|>system\n{sys}<|im_end|>\n");
            }
        }
        for m in messages {
            s += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
        }
        if add_generation_prompt {
            s += "<|im_start|>assistant\n";
        }
        s
    }
}

/// Timings of one [`Session::generate`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationStats {
    /// Prompt tokens run.
    pub prompt_tokens: usize,
    /// Time for the prompt up to the first new token's logits (time to first token).
    pub prefill: Duration,
    /// Tokens generated.
    pub generated: usize,
    /// Time spent generating after the first token.
    pub decode: Duration,
    /// Whether it stopped at an end-of-turn token (else at the token limit).
    pub stopped: bool,
}

impl GenerationStats {
    /// Decode speed: tokens after the first over the time they took.
    pub fn decode_tokens_per_s(&self) -> f64 {
        let n = self.generated.saturating_sub(1) as f64;
        if self.decode.is_zero() {
            0.0
        } else {
            n / self.decode.as_secs_f64()
        }
    }
}

/// A loaded model with its tokenizer, chat template and a KV cache: a conversation.
#[derive(Debug)]
pub struct Session {
    model: Model,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    cache: KvCache,
    /// Tokens in the cache, to reuse a common prefix between turns.
    history: Vec<u32>,
    stop: Vec<u32>,
}

impl Session {
    /// Opens `path` on the CPU; see [`Session::open_on`].
    pub fn open(path: impl AsRef<Path>, context: usize) -> Result<Self> {
        Self::open_on(path, context, &Device::cpu())
    }

    /// Opens `path`, estimates weights + KV cache for `context` positions against the
    /// memory the device says is free (refusing with [`LlmError::OutOfMemory`] before
    /// anything is uploaded), and loads the model onto `device`.
    pub fn open_on(path: impl AsRef<Path>, context: usize, device: &Device) -> Result<Self> {
        let file = Arc::new(GgufFile::open(path)?);
        let cfg = LlamaConfig::from_gguf(&file)?;
        let est = estimate_memory(&file, &cfg, context.min(cfg.context_length));
        if let Some(avail) = device.backend().memory_available() {
            est.check_fits(avail)?;
        }
        Self::from_file_on(file, context, device)
    }

    /// Builds a session on a parsed file, on the CPU (no memory check).
    pub fn from_file(file: Arc<GgufFile>, context: usize) -> Result<Self> {
        Self::from_file_on(file, context, &Device::cpu())
    }

    /// Builds a session on a parsed file, on `device` (no memory check).
    pub fn from_file_on(file: Arc<GgufFile>, context: usize, device: &Device) -> Result<Self> {
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        let ctx = context.min(LlamaConfig::from_gguf(&file)?.context_length);
        let model = Model::load_on(device, file, ctx)?;
        let cache = model.new_cache(ctx)?;
        let mut stop = vec![tokenizer.eos()];
        for t in ["<|im_end|>", "<|endoftext|>"] {
            if let Some(id) = tokenizer.token_id(t) {
                stop.push(id);
            }
        }
        Ok(Self {
            model,
            tokenizer,
            template,
            cache,
            history: Vec::new(),
            stop,
        })
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }
    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    /// The chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The KV cache (its [`KvCache::step_mode`] says whether steps are recorded).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The model and the session's cache, for running steps directly ([`crate::bench`]);
    /// call [`Session::reset`] afterwards so the session forgets what they put there.
    pub fn model_and_cache(&mut self) -> (&Model, &mut KvCache) {
        (&self.model, &mut self.cache)
    }

    /// Forgets the conversation.
    pub fn reset(&mut self) {
        self.cache.clear();
        self.history.clear();
    }

    /// Tokenizes `prompt` (control tokens recognised), runs it, then samples up to
    /// `max_tokens` tokens, calling `on_text` with each piece of text as it is decoded;
    /// stops at an end-of-turn token. The cache keeps the longest prefix the new prompt
    /// shares with what it already holds (a chat's earlier turns are not run again).
    pub fn generate(
        &mut self,
        prompt: &str,
        max_tokens: usize,
        sampling: SamplerConfig,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerationStats> {
        let ids = self.tokenizer.encode(prompt, true);
        let mut dec = StreamDecoder::new();
        let stats = self.generate_ids(&ids, max_tokens, sampling, |tok, id| {
            if !tok.is_special(id) {
                on_text(&dec.push(tok, id));
            }
        })?;
        on_text(&dec.finish());
        Ok(stats)
    }

    /// Like [`Self::generate`] on token ids, streaming each new token id (with the
    /// tokenizer, to decode it) as soon as it is sampled.
    pub fn generate_ids(
        &mut self,
        ids: &[u32],
        max_tokens: usize,
        sampling: SamplerConfig,
        mut on_token: impl FnMut(&Tokenizer, u32),
    ) -> Result<GenerationStats> {
        sampling.validate()?;
        if ids.is_empty() {
            return Err(LlmError::InvalidArgument("empty prompt".into()));
        }
        if ids.len() + max_tokens > self.cache.capacity() {
            return Err(LlmError::InvalidArgument(format!(
                "prompt of {} tokens + {max_tokens} new ones exceeds the context of {}",
                ids.len(),
                self.cache.capacity()
            )));
        }
        // Reuse the cached prefix, but always run at least the last prompt token.
        let common = self
            .history
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1);
        self.cache_truncate(common);
        let mut sampler = Sampler::new(sampling);
        let t0 = Instant::now();
        let mut logits = self.model.prefill(&ids[common..], &mut self.cache)?;
        self.history.extend_from_slice(&ids[common..]);
        let mut stats = GenerationStats {
            prompt_tokens: ids.len(),
            ..Default::default()
        };
        let mut t_first = None;
        let mut next = sampler.sample(&logits);
        if sampling.is_greedy() && max_tokens > 0 {
            // Greedy decoding takes the argmax on the device, each step feeding the next
            // there (Model::decode_greedy): one word read back a step, after the next
            // step is queued.
            stats.prefill = t0.elapsed();
            let t_first = Instant::now();
            stats.generated += 1;
            on_token(&self.tokenizer, next);
            let mut last = next;
            if !self.stop.contains(&next) && max_tokens > 1 {
                let mut produced = Vec::new();
                let stop = &self.stop;
                let tokenizer = &self.tokenizer;
                self.model
                    .decode_greedy(next, &mut self.cache, max_tokens - 1, |t| {
                        on_token(tokenizer, t);
                        produced.push(t);
                        !stop.contains(&t)
                    })?;
                stats.generated += produced.len();
                // The cache ran the first token and every new one but the last.
                self.history.push(next);
                if let Some((&l, run)) = produced.split_last() {
                    self.history.extend_from_slice(run);
                    last = l;
                }
            }
            if self.stop.contains(&last) {
                stats.stopped = true;
                // Keep the end-of-turn token in the conversation.
                if self.cache.len() < self.cache.capacity() {
                    self.model.forward(last, &mut self.cache)?;
                    self.history.push(last);
                }
            }
            stats.decode = t_first.elapsed();
            return Ok(stats);
        }
        for i in 0..max_tokens {
            if i == 0 {
                stats.prefill = t0.elapsed();
                t_first = Some(Instant::now());
            }
            stats.generated += 1;
            on_token(&self.tokenizer, next);
            if self.stop.contains(&next) {
                stats.stopped = true;
                // Keep the end-of-turn token in the conversation.
                if self.cache.len() < self.cache.capacity() {
                    self.model.forward(next, &mut self.cache)?;
                    self.history.push(next);
                }
                break;
            }
            if i + 1 < max_tokens {
                let token = next;
                logits = self.model.forward(token, &mut self.cache)?;
                next = sampler.sample(&logits);
                self.history.push(token);
            }
        }
        if let Some(t) = t_first {
            stats.decode = t.elapsed();
        }
        Ok(stats)
    }

    fn cache_truncate(&mut self, n: usize) {
        self.history.truncate(n);
        self.cache.truncate(n);
    }

    /// Whether a token ends a turn.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_with_default_system() {
        let t = ChatTemplate {
            default_system: Some("Be nice".into()),
        };
        assert_eq!(
            t.render(&[Message::user("Hi")], true),
            "<|im_start|>system\nBe nice<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&[Message::system("S"), Message::user("Q"), Message::assistant("A")], false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        );
    }
}
