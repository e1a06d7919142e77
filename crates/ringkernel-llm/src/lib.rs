//! RingKernel's language-model runtime: a GGUF reader, ggml's quantized block formats
//! with matrix-vector products on the quantized weights, a byte-level BPE tokenizer read
//! from the GGUF vocabulary, and a llama-architecture decoder (SmolLM2) with a KV cache
//! and sampling.

#![warn(missing_docs)]

pub mod error;
pub mod generate;
pub mod gguf;
pub mod locate;
pub mod model;
pub mod quant;
pub mod sample;
pub mod tokenizer;

pub use error::{LlmError, Result};
pub use generate::{ChatTemplate, GenerationStats, Message, Session};
pub use sample::SamplerConfig;
