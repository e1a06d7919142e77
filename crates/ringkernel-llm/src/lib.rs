//! RingKernel's language-model runtime: a GGUF reader, a byte-level BPE tokenizer read
//! from the GGUF vocabulary, and a llama-architecture decoder (SmolLM2) on any RingKernel
//! [`Device`](ringkernel::compute::Device) (CPU, CUDA, WebGPU, Metal): weights uploaded
//! once in their quantized block formats and multiplied there, a KV cache on the device,
//! batched prompts, decode steps recorded once where the backend can (a CUDA graph),
//! sampling and a chat session.

#![warn(missing_docs)]

pub mod bench;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod locate;
pub mod model;
pub mod quant;
pub mod sample;
pub mod tokenizer;
pub mod weights;

pub use error::{LlmError, Result};
pub use generate::{ChatTemplate, GenerationStats, Message, Session};
pub use sample::SamplerConfig;
