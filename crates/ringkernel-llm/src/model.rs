//! The llama architecture (SmolLM2, Llama 2/3 style) on a RingKernel [`Device`] (CPU,
//! CUDA, WebGPU or Metal): RMSNorm, rotary embeddings, grouped-query attention over a KV
//! cache kept on the device, SwiGLU; every matrix product runs on the stored weight
//! blocks ([`ComputeBackend::qmatmul`]). The weights are uploaded once; a step writes the
//! token ids and positions to the device, runs the ops there and reads back only the
//! logits. A prompt runs as one batch per chunk of up to [`PREFILL_CHUNK`] tokens
//! (matrix-matrix products); a decode step is recorded once where the backend can
//! ([`ComputeBackend::record`]: a CUDA graph, so a token costs one graph launch) and
//! replayed at every position.
//!
//! Greedy decoding ([`Model::decode_greedy`]) records steps that feed each other on the
//! device ([`ComputeBackend::greedy_feed`]: the argmax, the token's embedding, the next
//! position), several to a replay ([`KvCache::set_steps_per_replay`]), and the host
//! reads the tokens while the device runs the steps after them.
//!
//! One step: the embedding, then every layer through one
//! [`ComputeBackend::decoder_layers`] (per layer: the norm, then q, k, v in one matrix;
//! RoPE, the new row into the cache, attention; the output projection added to the
//! residual stream; the norm, gate and up with SwiGLU, the down projection added; CUDA
//! fuses these into two kernels a layer for a decode step); then the final norm and the
//! output projection (`rms_norm_qmatmul`).
//!
//! ```no_run
//! use ringkernel::compute::Device;
//! use ringkernel_llm::{gguf::GgufFile, model::Model, sample::{Sampler, SamplerConfig}};
//! use std::sync::Arc;
//! let model = Model::load_on(&Device::cpu(), Arc::new(GgufFile::open("model.gguf")?), 2048)?;
//! let mut cache = model.new_cache(2048)?;
//! let logits = model.prefill(&[1, 9690, 198], &mut cache)?;
//! let next = Sampler::new(SamplerConfig::greedy()).sample(&logits);
//! let logits = model.forward(next, &mut cache)?;
//! # Ok::<(), ringkernel_llm::LlmError>(())
//! ```
//!
//! [`ComputeBackend::qmatmul`]: ringkernel::compute::ComputeBackend::qmatmul
//! [`ComputeBackend::record`]: ringkernel::compute::ComputeBackend::record
//! [`ComputeBackend::decoder_layers`]: ringkernel::compute::ComputeBackend::decoder_layers
//! [`ComputeBackend::greedy_feed`]: ringkernel::compute::ComputeBackend::greedy_feed

use crate::error::{LlmError, Result};
use crate::gguf::GgufFile;
use crate::quant::{dequantize, GgmlType};
use crate::weights::{half_split_order, joined_format, HostMatrix};
use ringkernel::compute::{
    BlockWeights, BufferRef, ComputeBackend, DecoderDims, DecoderLayer, DecoderScratch, Device,
    EmbeddingDims, GreedyFeed, KvDims, QMatmulDims, QuantMatrix, Replay, WeightFormat,
};
use ringkernel::BackendKind;
use ringkernel_core::compute::dtype::words_as_f32;
use std::sync::Arc;

/// Hyper-parameters read from `llama.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub n_layers: usize,
    /// Model width.
    pub dim: usize,
    /// SwiGLU hidden width.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest context the model was trained for.
    pub context_length: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub eps: f32,
}

impl LlamaConfig {
    /// Reads the configuration; [`LlmError::MissingKey`] names an absent key.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch = f.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(LlmError::InvalidArgument(format!(
                "general.architecture is `{arch}`: only `llama` is supported"
            )));
        }
        let u = |k: &str| f.get_u32(&format!("llama.{k}")).map(|v| v as usize);
        let dim = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = match f.get("llama.attention.head_count_kv") {
            Some(_) => u("attention.head_count_kv")?,
            None => n_heads,
        };
        if n_heads == 0 || n_kv_heads == 0 || dim % n_heads != 0 || n_heads % n_kv_heads != 0 {
            return Err(LlmError::Corrupted(format!(
                "{n_heads} heads, {n_kv_heads} kv heads and width {dim} do not divide"
            )));
        }
        let head_dim = dim / n_heads;
        if head_dim % 2 != 0 {
            return Err(LlmError::Corrupted(format!("odd head width {head_dim}")));
        }
        let vocab = match f.get("llama.vocab_size") {
            Some(_) => u("vocab_size")?,
            None => f.tensor("token_embd.weight")?.rows(),
        };
        Ok(Self {
            n_layers: u("block_count")?,
            dim,
            hidden: u("feed_forward_length")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            context_length: u("context_length")?,
            rope_base: match f.get("llama.rope.freq_base") {
                Some(_) => f.get_f32("llama.rope.freq_base")?,
                None => 10000.0,
            },
            eps: f.get_f32("llama.attention.layer_norm_rms_epsilon")?,
        })
    }

    /// Width of the keys and values of one position.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// Prompt tokens run as one batch (the activation buffers hold this many rows).
pub const PREFILL_CHUNK: usize = 128;

/// The most greedy decode steps one replay may hold ([`KvCache::set_steps_per_replay`]).
pub const MAX_STEPS_PER_REPLAY: usize = 8;

/// Greedy decode steps a replay holds unless set otherwise
/// ([`KvCache::set_steps_per_replay`]). On an H100 (BENCHMARKS.md) 4 steps a replay
/// decoded SmolLM2 about 3% faster than 1 and within 0.3% of 8, while a stop
/// (an end-of-turn token) leaves fewer steps run for nothing.
pub const DEFAULT_STEPS_PER_REPLAY: usize = 4;

/// Bytes a model needs on its device, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Weights in their device formats.
    pub weights: u64,
    /// Keys and values of `context` positions in f32.
    pub kv_cache: u64,
    /// Activations of one prompt chunk, and the logits.
    pub scratch: u64,
    /// The context the estimate is for.
    pub context: usize,
}

impl MemoryEstimate {
    /// Weights, cache and scratch together.
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.scratch
    }

    /// [`LlmError::OutOfMemory`] unless the total fits in `available` bytes.
    pub fn check_fits(&self, available: u64) -> Result<()> {
        if self.total() > available {
            return Err(LlmError::OutOfMemory {
                needed: self.total(),
                available,
                detail: format!(
                    "weights {} MiB + KV cache {} MiB for {} positions + scratch {} MiB; \
                     a shorter --context needs less cache",
                    self.weights >> 20,
                    self.kv_cache >> 20,
                    self.context,
                    self.scratch >> 20
                ),
            });
        }
        Ok(())
    }
}

/// Device bytes of a `rows × cols` matrix in `format`.
fn matrix_bytes(format: WeightFormat, rows: usize, cols: usize) -> u64 {
    format.words(rows, cols).map_or(u64::MAX, |w| w as u64 * 4)
}

/// The memory a model needs on a device for `context` positions, before anything is
/// loaded (from the tensor types: no weight is read).
pub fn estimate_memory(f: &GgufFile, cfg: &LlamaConfig, context: usize) -> MemoryEstimate {
    let (d, kvd, h) = (cfg.dim, cfg.kv_dim(), cfg.hidden);
    let ty = |name: &str| f.tensor(name).map(|t| t.dtype).unwrap_or(GgmlType::F32);
    let embed = ty("token_embd.weight");
    let mut weights = matrix_bytes(joined_format(&[embed]), cfg.vocab, d);
    if f.tensor("output.weight").is_ok() {
        weights += matrix_bytes(joined_format(&[ty("output.weight")]), cfg.vocab, d);
    }
    weights += 4 * d as u64 * (2 * cfg.n_layers as u64 + 1);
    for i in 0..cfg.n_layers {
        let t = |n: &str| ty(&format!("blk.{i}.{n}.weight"));
        let qkv = joined_format(&[t("attn_q"), t("attn_k"), t("attn_v")]);
        let gu = joined_format(&[t("ffn_gate"), t("ffn_up")]);
        weights += matrix_bytes(qkv, d + 2 * kvd, d)
            + matrix_bytes(joined_format(&[t("attn_output")]), d, d)
            + 2 * matrix_bytes(gu, h, d)
            + matrix_bytes(joined_format(&[t("ffn_down")]), d, h);
    }
    let kv = 2 * cfg.n_layers as u64 * context as u64 * kvd as u64 * 4;
    let rows = context.clamp(1, PREFILL_CHUNK) as u64;
    let scratch = 4 * (rows * (4 * d + 2 * kvd + h) as u64 + 2 * rows + (cfg.vocab + d) as u64);
    MemoryEstimate {
        weights,
        kv_cache: kv,
        scratch,
        context,
    }
}

/// One transformer block's weights on the device.
#[derive(Debug)]
struct Layer {
    attn_norm: BufferRef,
    /// `[q; k; v]` rows (q and k in the half-split RoPE order).
    qkv: QuantMatrix,
    wo: QuantMatrix,
    ffn_norm: BufferRef,
    gate: QuantMatrix,
    up: QuantMatrix,
    down: QuantMatrix,
}

/// Everything uploaded once.
#[derive(Debug)]
struct Weights {
    embed: QuantMatrix,
    /// The output projection (the embedding matrix itself when tied, as in SmolLM2).
    output: QuantMatrix,
    out_norm: BufferRef,
    layers: Vec<Layer>,
    /// Device bytes of all of the above.
    bytes: u64,
}

/// A llama model whose weights live on a [`Device`].
#[derive(Debug)]
pub struct Model {
    device: Device,
    file: Arc<GgufFile>,
    cfg: LlamaConfig,
    w: Arc<Weights>,
    max_context: usize,
}

/// The activations of one batch of up to `rows` tokens, on the device.
#[derive(Debug)]
struct Scratch {
    rows: usize,
    ids: BufferRef,
    pos: BufferRef,
    /// Residual stream `[rows, dim]`.
    x: BufferRef,
    /// A second copy of it (scratch of `decoder_layer`).
    x2: BufferRef,
    /// Normed `[rows, dim]`.
    xb: BufferRef,
    /// Projections `[rows, dim + 2·kv_dim]`.
    qkv: BufferRef,
    /// Rotated queries `[rows, dim]`.
    q: BufferRef,
    /// Attention output `[rows, dim]`.
    att: BufferRef,
    /// SwiGLU output `[rows, hidden]`.
    hb: BufferRef,
    /// The last row's normed state (a prompt's logits come from it).
    last: BufferRef,
    logits: BufferRef,
    /// The greedy tokens of the steps of one replay (`argmax`, one word each; the
    /// first also of a step run op by op).
    tokens: Vec<BufferRef>,
}

/// How decode steps run on a cache.
enum Step {
    /// Not tried yet.
    Untried,
    /// Recorded once (a CUDA graph), replayed each step; holds the weights the
    /// recording uses, so they outlive it.
    Recorded {
        replay: Box<dyn Replay>,
        _weights: Arc<Weights>,
    },
    /// Op by op: the backend records nothing (or recording failed, for the reason given).
    Direct(Option<String>),
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Untried => f.write_str("Untried"),
            Step::Recorded { .. } => f.write_str("Recorded"),
            Step::Direct(why) => write!(f, "Direct({why:?})"),
        }
    }
}

/// Keys and values of the positions decoded so far, per layer, on the model's device
/// (`[kv_heads, capacity, head_dim]` each), with the activation buffers of the steps
/// that fill it.
#[derive(Debug)]
pub struct KvCache {
    device: Device,
    k: Vec<BufferRef>,
    v: Vec<BufferRef>,
    len: usize,
    capacity: usize,
    kv_dim: usize,
    scratch: Scratch,
    step: Step,
    /// The decode step followed by the argmax of its logits ([`Model::forward_greedy`]);
    /// recorded, it feeds the next step ([`ComputeBackend::greedy_feed`]).
    greedy_step: Step,
    /// `steps_per_replay` fed greedy steps recorded as one ([`Model::decode_greedy`]).
    greedy_steps: Step,
    steps_per_replay: usize,
}

impl KvCache {
    /// How many greedy decode steps [`Model::decode_greedy`] records into one replay
    /// where the backend records (a CUDA graph of that many steps, each feeding the
    /// next): fewer launches for the host and one boundary between replays every `n`
    /// tokens. 1 to [`MAX_STEPS_PER_REPLAY`]; the default is
    /// [`DEFAULT_STEPS_PER_REPLAY`]. The tokens are the same whatever `n`.
    pub fn set_steps_per_replay(&mut self, n: usize) -> Result<()> {
        if !(1..=MAX_STEPS_PER_REPLAY).contains(&n) {
            return Err(LlmError::InvalidArgument(format!(
                "steps per replay must be 1 to {MAX_STEPS_PER_REPLAY}, not {n}"
            )));
        }
        if n != self.steps_per_replay {
            self.steps_per_replay = n;
            self.greedy_steps = Step::Untried;
        }
        Ok(())
    }

    /// See [`Self::set_steps_per_replay`].
    pub fn steps_per_replay(&self) -> usize {
        self.steps_per_replay
    }

    /// The step that has run: the plain one ([`Model::forward`]) once it has, else the
    /// greedy one ([`Model::forward_greedy`]).
    fn active_step(&self) -> &Step {
        self.step_for(matches!(self.step, Step::Untried))
    }

    /// The plain step, or with `greedy` the one ending with the argmax.
    fn step_for(&self, greedy: bool) -> &Step {
        if greedy {
            &self.greedy_step
        } else {
            &self.step
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Positions it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Keeps the first `n` positions.
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }
    /// Forgets every position (the buffers stay allocated).
    pub fn clear(&mut self) {
        self.len = 0;
    }
    /// How decode steps run: `"recorded (what)"` (replayed as one unit: a CUDA program
    /// or graph),
    /// `"direct"` (op by op: the backend has nothing to record into) or `"direct: why"`
    /// when recording failed; `"not run yet"` before the first step.
    pub fn step_mode(&self) -> String {
        match self.active_step() {
            Step::Untried => "not run yet".into(),
            Step::Recorded { replay, .. } => format!("recorded ({})", replay.describe()),
            Step::Direct(None) => "direct".into(),
            Step::Direct(Some(why)) => format!("direct: {why}"),
        }
    }
}

fn f32_vector(f: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = f.tensor(name)?;
    if t.elements() != len as u64 {
        return Err(LlmError::Shape(format!(
            "tensor `{name}` has {} elements, the model needs {len}",
            t.elements()
        )));
    }
    let mut v = vec![0f32; len];
    dequantize(t.dtype, f.tensor_bytes(t), &mut v)?;
    Ok(v)
}

impl Model {
    /// Loads the model on the CPU; see [`Model::load_on`].
    pub fn load(file: Arc<GgufFile>, max_context: usize) -> Result<Self> {
        Self::load_on(&Device::cpu(), file, max_context)
    }

    /// Checks every tensor the architecture needs and uploads the weights to `device`
    /// (their device formats: see [`crate::weights`]), for caches of up to
    /// `max_context` positions (at most the model's trained context).
    pub fn load_on(device: &Device, file: Arc<GgufFile>, max_context: usize) -> Result<Self> {
        let cfg = LlamaConfig::from_gguf(&file)?;
        if max_context == 0 || max_context > cfg.context_length {
            return Err(LlmError::InvalidArgument(format!(
                "context {max_context} must be in 1..={}",
                cfg.context_length
            )));
        }
        let f = &*file;
        let (d, kvd, h, hd) = (cfg.dim, cfg.kv_dim(), cfg.hidden, cfg.head_dim);
        let read = |name: &str, rows, cols, order: Option<&[usize]>| {
            HostMatrix::read(f, f.tensor(name)?, rows, cols, order)
        };
        let vector = |name: &str| -> Result<BufferRef> {
            Ok(device.backend().upload(&f32_vector(f, name, d)?)?)
        };
        let mut bytes = 0u64;
        let mut up = |m: HostMatrix| -> Result<QuantMatrix> {
            bytes += m.bytes();
            m.upload(device)
        };
        let embed = up(read("token_embd.weight", cfg.vocab, d, None)?)?;
        // Tied embeddings (SmolLM2): the output projection is the embedding matrix.
        let output = match f.tensor("output.weight") {
            Ok(_) => up(read("output.weight", cfg.vocab, d, None)?)?,
            Err(_) => embed.clone(),
        };
        let q_order = half_split_order(cfg.n_heads, hd);
        let k_order = half_split_order(cfg.n_kv_heads, hd);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let qkv = HostMatrix::stack(vec![
                read(&n("attn_q"), d, d, Some(&q_order))?,
                read(&n("attn_k"), kvd, d, Some(&k_order))?,
                read(&n("attn_v"), kvd, d, None)?,
            ])?;
            let gate = read(&n("ffn_gate"), h, d, None)?;
            let upm = read(&n("ffn_up"), h, d, None)?;
            let gu = crate::weights::common_format(&[gate.clone(), upm.clone()]);
            layers.push(Layer {
                attn_norm: vector(&n("attn_norm"))?,
                qkv: up(qkv)?,
                wo: up(read(&n("attn_output"), d, d, None)?)?,
                ffn_norm: vector(&n("ffn_norm"))?,
                gate: up(gate.into_format(gu)?)?,
                up: up(upm.into_format(gu)?)?,
                down: up(read(&n("ffn_down"), d, h, None)?)?,
            });
        }
        let out_norm = vector("output_norm.weight")?;
        bytes += 4 * d as u64 * (2 * cfg.n_layers as u64 + 1);
        Ok(Self {
            device: device.clone(),
            file,
            cfg,
            w: Arc::new(Weights {
                embed,
                output,
                out_norm,
                layers,
                bytes,
            }),
            max_context,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The file the weights came from.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Device bytes of the uploaded weights.
    pub fn weight_bytes(&self) -> u64 {
        self.w.bytes
    }

    /// The longest context this instance was prepared for.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// An empty cache for `capacity` positions (at most [`Self::max_context`]) on the
    /// model's device.
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        let capacity = capacity.min(self.max_context);
        let c = &self.cfg;
        let b = self.device.backend();
        let n = capacity * c.kv_dim();
        let rows = capacity.clamp(1, PREFILL_CHUNK);
        let alloc = |len: usize| -> Result<BufferRef> { Ok(b.alloc(len.max(1))?) };
        let scratch = Scratch {
            rows,
            ids: alloc(rows)?,
            pos: alloc(rows)?,
            x: alloc(rows * c.dim)?,
            x2: alloc(rows * c.dim)?,
            xb: alloc(rows * c.dim)?,
            qkv: alloc(rows * (c.dim + 2 * c.kv_dim()))?,
            q: alloc(rows * c.dim)?,
            att: alloc(rows * c.dim)?,
            hb: alloc(rows * c.hidden)?,
            last: alloc(c.dim)?,
            logits: alloc(c.vocab)?,
            tokens: (0..MAX_STEPS_PER_REPLAY)
                .map(|_| alloc(1))
                .collect::<Result<_>>()?,
        };
        Ok(KvCache {
            device: self.device.clone(),
            k: (0..c.n_layers).map(|_| alloc(n)).collect::<Result<_>>()?,
            v: (0..c.n_layers).map(|_| alloc(n)).collect::<Result<_>>()?,
            len: 0,
            capacity,
            kv_dim: c.kv_dim(),
            scratch,
            step: Step::Untried,
            greedy_step: Step::Untried,
            greedy_steps: Step::Untried,
            steps_per_replay: DEFAULT_STEPS_PER_REPLAY,
        })
    }

    fn check_cache(&self, cache: &KvCache, tokens: &[u32]) -> Result<()> {
        let c = &self.cfg;
        if cache.kv_dim != c.kv_dim() || cache.k.len() != c.n_layers || cache.device != self.device
        {
            return Err(LlmError::Shape(
                "KV cache made for another model or device".into(),
            ));
        }
        if cache.len + tokens.len() > cache.capacity {
            return Err(LlmError::InvalidArgument(format!(
                "the KV cache is full ({} positions): start a new conversation or raise \
                 the context",
                cache.capacity
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(LlmError::InvalidArgument(format!(
                "token {t} outside the vocabulary of {}",
                c.vocab
            )));
        }
        Ok(())
    }

    /// The ops of one step over the first `n` rows of the scratch buffers (ids and
    /// positions already written).
    fn run(&self, cache: &KvCache, n: usize) -> ringkernel::Result<()> {
        self.embed(cache, n)?;
        self.layers_and_head(cache, n)
    }

    /// The embeddings of the first `n` ids into the residual stream.
    fn embed(&self, cache: &KvCache, n: usize) -> ringkernel::Result<()> {
        let (c, s, w) = (&self.cfg, &cache.scratch, &*self.w);
        self.device.backend().embedding(
            &**w.embed.buffer(),
            w.embed.format(),
            &*s.ids,
            &*s.x,
            EmbeddingDims {
                rows: c.vocab,
                cols: c.dim,
                count: n,
            },
        )
    }

    /// A fed greedy step's end: its token to word `j` of the replay's tokens, that
    /// token's embedding to the residual stream, the position advanced.
    fn feed(&self, cache: &KvCache, j: usize) -> ringkernel::Result<()> {
        let (c, s, w) = (&self.cfg, &cache.scratch, &*self.w);
        self.device.backend().greedy_feed(&GreedyFeed {
            logits: &*s.logits,
            table: BlockWeights {
                buffer: &**w.embed.buffer(),
                format: w.embed.format(),
            },
            rows: c.vocab,
            cols: c.dim,
            token: &*s.tokens[j],
            x: &*s.x,
            position: &*s.pos,
        })
    }

    /// The layers and the output head over the first `n` rows of the residual stream.
    fn layers_and_head(&self, cache: &KvCache, n: usize) -> ringkernel::Result<()> {
        let b: &dyn ComputeBackend = &**self.device.backend();
        let (c, s, w) = (&self.cfg, &cache.scratch, &*self.w);
        let (d, eps) = (c.dim, c.eps);
        let mm = |batch, rows, cols, accumulate| QMatmulDims {
            batch,
            rows,
            cols,
            accumulate,
        };
        let kv = KvDims {
            tokens: n,
            heads: c.n_heads,
            kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            capacity: cache.capacity,
            rope_base: c.rope_base,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let scratch = DecoderScratch {
            normed: &*s.xb,
            qkv: &*s.qkv,
            q: &*s.q,
            att: &*s.att,
            hidden: &*s.hb,
            residual: &*s.x2,
        };
        let dims = DecoderDims {
            kv,
            dim: d,
            hidden: c.hidden,
            eps,
        };
        fn bw(m: &QuantMatrix) -> BlockWeights<'_> {
            BlockWeights {
                buffer: &**m.buffer(),
                format: m.format(),
            }
        }
        let layers: Vec<DecoderLayer> = w
            .layers
            .iter()
            .enumerate()
            .map(|(l, lw)| DecoderLayer {
                attn_norm: &*lw.attn_norm,
                qkv: bw(&lw.qkv),
                wo: bw(&lw.wo),
                ffn_norm: &*lw.ffn_norm,
                gate: bw(&lw.gate),
                up: &**lw.up.buffer(),
                down: bw(&lw.down),
                k_cache: &*cache.k[l],
                v_cache: &*cache.v[l],
            })
            .collect();
        b.decoder_layers(&*s.x, &*s.pos, &layers, &scratch, dims)?;
        // The output head sees the last token only.
        let last: &BufferRef = if n == 1 {
            &s.x
        } else {
            b.copy(&*s.x, (n - 1) * d, &*s.last, 0, d)?;
            &s.last
        };
        b.rms_norm_qmatmul(
            &**last,
            &*w.out_norm,
            eps,
            &*s.xb,
            &[&**w.output.buffer()],
            w.output.format(),
            &*s.logits,
            mm(1, c.vocab, d, false),
        )?;
        Ok(())
    }

    /// Writes the ids and positions of the next `tokens.len()` positions.
    fn stage(&self, cache: &KvCache, tokens: &[u32]) -> Result<()> {
        let b = self.device.backend();
        let pos: Vec<u32> = (cache.len..cache.len + tokens.len())
            .map(|p| p as u32)
            .collect();
        b.write(&*cache.scratch.ids, 0, words_as_f32(tokens))?;
        b.write(&*cache.scratch.pos, 0, words_as_f32(&pos))?;
        Ok(())
    }

    fn logits(&self, cache: &KvCache) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.cfg.vocab];
        self.device
            .backend()
            .read(&*cache.scratch.logits, 0, &mut out)?;
        Ok(out)
    }

    /// Runs the prompt `tokens` at the next positions of `cache`, in batches of up to
    /// [`PREFILL_CHUNK`] tokens, and returns the logits of the token after the last one.
    pub fn prefill(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(LlmError::InvalidArgument("empty prompt".into()));
        }
        self.check_cache(cache, tokens)?;
        for chunk in tokens.chunks(cache.scratch.rows) {
            self.stage(cache, chunk)?;
            // Op by op, not in one `batch`: measured on the 2-core CPU, a batch cut a
            // decode step's time by ~45% but did not speed up a 128-token prefill.
            self.run(cache, chunk.len())?;
            cache.len += chunk.len();
        }
        self.logits(cache)
    }

    /// Runs `token` at the next position of `cache` and returns the logits of the token
    /// after it. The first call on a cache records the step where the backend can
    /// ([`KvCache::step_mode`]); every later one replays it.
    pub fn forward(&self, token: u32, cache: &mut KvCache) -> Result<Vec<f32>> {
        self.decode_step(token, cache, false)?;
        self.logits(cache)
    }

    /// [`Self::forward`] followed by greedy sampling on the device: the step ends with
    /// the `argmax` of its logits, and only that index is read back (one word instead of
    /// the vocabulary's logits). Returns the same token as
    /// [`argmax`](crate::sample::argmax) of [`Self::forward`]'s logits. Recorded and
    /// replayed like `forward`'s step (a second recording, ending with
    /// [`ComputeBackend::greedy_feed`]; the input's embedding is written before each
    /// replay).
    pub fn forward_greedy(&self, token: u32, cache: &mut KvCache) -> Result<u32> {
        self.decode_step(token, cache, true)?;
        let mut word = [0f32; 1];
        self.device
            .backend()
            .read(&*cache.scratch.tokens[0], 0, &mut word)?;
        Ok(word[0].to_bits())
    }

    /// Greedy decoding from `token`: runs it at the next position of `cache`, then each
    /// step's greedy token after it, handing every new token to `on_token`, which
    /// returns whether to go on. Stops after `max_tokens` new tokens or where the cache
    /// is full, and returns how many it produced. The cache then holds what a loop of
    /// [`Self::forward_greedy`] would leave: `token` and every new token but the last.
    ///
    /// Where the step is recorded ([`KvCache::step_mode`]), the step itself feeds the
    /// next one (its token's embedding and the position, through
    /// [`ComputeBackend::greedy_feed`]), so the host keeps a replay queued beyond the
    /// tokens it reads ([`ComputeBackend::read_async`]): its work (the reads,
    /// `on_token`, the next launch) overlaps the device's. A replay
    /// holds [`KvCache::steps_per_replay`] steps while that many are left, one step
    /// after. When `on_token` stops, the steps queued ahead have run past the cache's
    /// length, which ignores them.
    pub fn decode_greedy(
        &self,
        token: u32,
        cache: &mut KvCache,
        max_tokens: usize,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<usize> {
        let steps = max_tokens.min(cache.capacity - cache.len);
        if steps == 0 {
            if max_tokens > 0 {
                self.check_cache(cache, &[token])?;
            }
            return Ok(0);
        }
        let start = cache.len;
        self.decode_step(token, cache, true)?;
        if !matches!(cache.greedy_step, Step::Recorded { .. }) {
            // Op by op: the host stages every step.
            let mut word = [0f32; 1];
            self.device
                .backend()
                .read(&*cache.scratch.tokens[0], 0, &mut word)?;
            let mut t = word[0].to_bits();
            let mut produced = 1;
            while on_token(t) && produced < steps {
                t = self.forward_greedy(t, cache)?;
                produced += 1;
            }
            return Ok(produced);
        }
        let per = cache.steps_per_replay;
        if per > 1 && steps > per && matches!(cache.greedy_steps, Step::Untried) {
            cache.greedy_steps = self.record_step(cache, |c| {
                (0..per).try_for_each(|j| {
                    self.layers_and_head(c, 1)?;
                    self.feed(c, j)
                })
            });
        }
        let (Step::Recorded { replay: one, .. }, steps_n) =
            (&cache.greedy_step, &cache.greedy_steps)
        else {
            unreachable!("checked above")
        };
        let many = match steps_n {
            Step::Recorded { replay, .. } if per > 1 => Some(replay),
            _ => None,
        };
        let b = self.device.backend();
        let tokens = &cache.scratch.tokens;
        // Reads of the tokens queued so far, oldest first; `queued` steps have been
        // queued (the first by `decode_step`).
        let mut pending = std::collections::VecDeque::from([b.read_async(&*tokens[0], 0, 1)?]);
        let (mut queued, mut produced) = (1usize, 0usize);
        let result = loop {
            // Keep a replay queued beyond the tokens being read, so the device does not
            // wait for the host.
            if pending.len() <= per && queued < steps {
                let k = match many {
                    Some(r) if steps - queued >= per => {
                        r.replay()?;
                        per
                    }
                    _ => {
                        one.replay()?;
                        1
                    }
                };
                for t in &tokens[..k] {
                    pending.push_back(b.read_async(&**t, 0, 1)?);
                }
                queued += k;
            }
            let Some(next) = pending.pop_front() else {
                break Ok(produced);
            };
            let t = next.wait()?[0].to_bits();
            produced += 1;
            if !on_token(t) || produced == steps {
                break Ok(produced);
            }
        };
        // Steps queued past the last token read ran beyond what the cache keeps.
        for p in pending {
            p.wait()?;
        }
        cache.len = start + produced;
        result
    }

    /// Records `ops` into a replay where the backend can (see [`Step`]).
    fn record_step(
        &self,
        cache: &KvCache,
        ops: impl Fn(&KvCache) -> ringkernel::Result<()>,
    ) -> Step {
        match self.device.backend().record(&mut || ops(cache)) {
            Ok(Some(replay)) => Step::Recorded {
                replay,
                _weights: self.w.clone(),
            },
            Ok(None) => Step::Direct(None),
            Err(e) => {
                tracing::warn!("decode step not recorded, running it op by op: {e}");
                Step::Direct(Some(e.to_string()))
            }
        }
    }

    /// One decode step of `token`, recorded on the first call (per kind: with or without
    /// the greedy argmax) and replayed after, or op by op where the backend records
    /// nothing. A recorded greedy step writes its token where the next step reads its
    /// input and advances the position (see [`Self::decode_greedy`]).
    fn decode_step(&self, token: u32, cache: &mut KvCache, greedy: bool) -> Result<()> {
        self.check_cache(cache, &[token])?;
        self.stage(cache, &[token])?;
        if matches!(cache.step_for(greedy), Step::Untried) {
            let step = self.record_step(cache, |c| {
                if greedy {
                    // The input's embedding is written before the replay (below); the
                    // step leaves the next one's in its place.
                    self.layers_and_head(c, 1)?;
                    self.feed(c, 0)
                } else {
                    self.run(c, 1)
                }
            });
            if greedy {
                cache.greedy_step = step;
            } else {
                cache.step = step;
            }
        }
        match cache.step_for(greedy) {
            Step::Recorded { replay, .. } => {
                if greedy {
                    self.embed(cache, 1)?;
                }
                replay.replay()?
            }
            _ => {
                let c = &*cache;
                let (b, vocab) = (self.device.backend(), self.cfg.vocab);
                b.batch(&mut || {
                    self.run(c, 1)?;
                    if greedy {
                        b.argmax(&*c.scratch.logits, vocab, &*c.scratch.tokens[0])?;
                    }
                    Ok(())
                })?
            }
        }
        cache.len += 1;
        Ok(())
    }

    /// The device time of one recorded decode step: the step replayed `n` times back to
    /// back, then one synchronisation, over `n`. The plain step ([`Self::forward`]) runs
    /// the cache's last position again with the same token each time; the greedy one
    /// ([`Self::forward_greedy`]) feeds itself, so its replays run the positions after
    /// the cache's length, each with the token before (`n` is capped at the free
    /// positions), as a replay of [`KvCache::steps_per_replay`] steps where
    /// [`Self::decode_greedy`] recorded one (then `n` rounds down to a multiple of it).
    /// The cache's length is unchanged either way. `None` when the steps are
    /// not recorded (the first [`Self::forward`] or [`Self::forward_greedy`] on a cache
    /// records them, where the backend can) or `n` is 0. What a decode step takes beyond
    /// this is host work: staging the token, reading back the logits or the token,
    /// sampling.
    pub fn replay_time(&self, cache: &KvCache, n: usize) -> Result<Option<std::time::Duration>> {
        let Step::Recorded { replay, .. } = cache.active_step() else {
            return Ok(None);
        };
        let b = self.device.backend();
        let (replay, per, n) = if std::ptr::eq(cache.active_step(), &cache.greedy_step) {
            // The replays start at the cache's length (the input there is whatever the
            // last step fed: a greedy token's embedding).
            b.write(&*cache.scratch.pos, 0, words_as_f32(&[cache.len as u32]))?;
            let (n, per) = (n.min(cache.capacity - cache.len), cache.steps_per_replay);
            match &cache.greedy_steps {
                Step::Recorded { replay: many, .. } if per > 1 && n >= per => (many, per, n / per),
                _ => (replay, 1, n),
            }
        } else {
            (replay, 1, n)
        };
        if n == 0 {
            return Ok(None);
        }
        b.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..n {
            replay.replay()?;
        }
        b.synchronize()?;
        Ok(Some(t.elapsed() / (n * per) as u32))
    }

    /// Which kind of device the weights are on.
    pub fn backend_kind(&self) -> BackendKind {
        self.device.kind()
    }
}
