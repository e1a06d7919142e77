//! The llama architecture (SmolLM2, Llama 2/3 style) decoding one token at a time on the
//! CPU: RMSNorm, rotary embeddings, grouped-query attention over a KV cache, SwiGLU; the
//! matrix-vector products run on the quantized weights ([`QMatrix::matvec`]) straight from
//! the memory-mapped file.
//!
//! ```no_run
//! use ringkernel_llm::{gguf::GgufFile, model::Model, sample::{Sampler, SamplerConfig}};
//! use std::sync::Arc;
//! let model = Model::load(Arc::new(GgufFile::open("model.gguf")?), 2048)?;
//! let mut cache = model.new_cache(2048);
//! let logits = model.forward(1, &mut cache)?;
//! let next = Sampler::new(SamplerConfig::greedy()).sample(&logits);
//! # Ok::<(), ringkernel_llm::LlmError>(())
//! ```

use crate::error::{LlmError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{dequantize, GgmlType, QMatrix};
use rayon::prelude::*;
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

/// Bytes a model needs, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Weights as stored (quantized).
    pub weights: u64,
    /// Keys and values of `context` positions in f32.
    pub kv_cache: u64,
    /// Per-step scratch (activations and logits).
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
                     a shorter --max-context needs less cache",
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

/// The memory a model needs for `context` positions, before anything is loaded.
pub fn estimate_memory(f: &GgufFile, cfg: &LlamaConfig, context: usize) -> MemoryEstimate {
    let kv = 2 * cfg.n_layers as u64 * context as u64 * cfg.kv_dim() as u64 * 4;
    let scratch = 4 * (cfg.vocab + 6 * cfg.dim + 3 * cfg.hidden + cfg.n_heads * context) as u64;
    MemoryEstimate {
        weights: f.tensor_data_bytes(),
        kv_cache: kv,
        scratch,
        context,
    }
}

/// Memory available to this process, if the system says (Linux: `MemAvailable`).
pub fn available_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A weight matrix: where its bytes are in the file.
#[derive(Debug, Clone)]
struct Weight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    offset: usize,
    size: usize,
}

#[derive(Debug, Clone)]
struct Layer {
    attn_norm: Vec<f32>,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    wo: Weight,
    ffn_norm: Vec<f32>,
    gate: Weight,
    up: Weight,
    down: Weight,
}

/// Keys and values of the positions decoded so far, per layer, in f32.
#[derive(Debug, Clone)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
    kv_dim: usize,
}

impl KvCache {
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
}

/// A llama model whose weights stay in the GGUF mapping.
#[derive(Debug)]
pub struct Model {
    file: Arc<GgufFile>,
    cfg: LlamaConfig,
    embed: Weight,
    output: Weight,
    out_norm: Vec<f32>,
    layers: Vec<Layer>,
    /// `cos`/`sin` of each rotary frequency, per position up to the context.
    rope: Vec<(f32, f32)>,
    max_context: usize,
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

fn weight(t: &TensorInfo, rows: usize, cols: usize) -> Result<Weight> {
    if t.dims.len() != 2 || t.row_len() != cols || t.rows() != rows {
        return Err(LlmError::Shape(format!(
            "tensor `{}` is {:?} (ggml order), the model needs [{cols}, {rows}]",
            t.name, t.dims
        )));
    }
    Ok(Weight {
        ty: t.dtype,
        rows,
        cols,
        offset: t.offset as usize,
        size: t.size as usize,
    })
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let s = 1.0 / (ms + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * s * g;
    }
}

impl Model {
    /// Checks every tensor the architecture needs and prepares the rotary tables for
    /// `max_context` positions (at most the model's trained context).
    pub fn load(file: Arc<GgufFile>, max_context: usize) -> Result<Self> {
        let cfg = LlamaConfig::from_gguf(&file)?;
        if max_context == 0 || max_context > cfg.context_length {
            return Err(LlmError::InvalidArgument(format!(
                "context {max_context} must be in 1..={}",
                cfg.context_length
            )));
        }
        let f = &*file;
        let (d, kv, h) = (cfg.dim, cfg.kv_dim(), cfg.hidden);
        let embed = weight(f.tensor("token_embd.weight")?, cfg.vocab, d)?;
        // Tied embeddings (SmolLM2): the output projection is the embedding matrix.
        let output = match f.tensor("output.weight") {
            Ok(t) => weight(t, cfg.vocab, d)?,
            Err(_) => embed.clone(),
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let t = |n: &str| f.tensor(&format!("blk.{i}.{n}.weight"));
            layers.push(Layer {
                attn_norm: f32_vector(f, &format!("blk.{i}.attn_norm.weight"), d)?,
                wq: weight(t("attn_q")?, d, d)?,
                wk: weight(t("attn_k")?, kv, d)?,
                wv: weight(t("attn_v")?, kv, d)?,
                wo: weight(t("attn_output")?, d, d)?,
                ffn_norm: f32_vector(f, &format!("blk.{i}.ffn_norm.weight"), d)?,
                gate: weight(t("ffn_gate")?, h, d)?,
                up: weight(t("ffn_up")?, h, d)?,
                down: weight(t("ffn_down")?, d, h)?,
            });
        }
        let out_norm = f32_vector(f, "output_norm.weight", d)?;
        let half = cfg.head_dim / 2;
        let mut rope = Vec::with_capacity(max_context * half);
        for pos in 0..max_context {
            for i in 0..half {
                let freq = (cfg.rope_base as f64).powf(-2.0 * i as f64 / cfg.head_dim as f64);
                let a = pos as f64 * freq;
                rope.push((a.cos() as f32, a.sin() as f32));
            }
        }
        Ok(Self {
            file,
            cfg,
            embed,
            output,
            out_norm,
            layers,
            rope,
            max_context,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The file the weights live in.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// The longest context this instance was prepared for.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// An empty cache for `capacity` positions (at most [`Self::max_context`]).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let capacity = capacity.min(self.max_context);
        let n = capacity * self.cfg.kv_dim();
        KvCache {
            k: vec![vec![0.0; n]; self.cfg.n_layers],
            v: vec![vec![0.0; n]; self.cfg.n_layers],
            len: 0,
            capacity,
            kv_dim: self.cfg.kv_dim(),
        }
    }

    fn mat(&self, w: &Weight) -> QMatrix<'_> {
        QMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            data: self.file.raw(w.offset, w.size),
        }
    }

    /// Rotates each adjacent pair `(x[2i], x[2i+1])` of every head by `pos · θ_i`
    /// (GGUF stores llama's q/k rows permuted for this layout).
    fn rope(&self, x: &mut [f32], pos: usize) {
        let half = self.cfg.head_dim / 2;
        let table = &self.rope[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(self.cfg.head_dim) {
            for (pair, &(c, s)) in head.chunks_exact_mut(2).zip(table) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }

    /// The embedding of `token` (one row of the embedding matrix, dequantized).
    pub fn embed(&self, token: u32) -> Result<Vec<f32>> {
        let t = token as usize;
        if t >= self.cfg.vocab {
            return Err(LlmError::InvalidArgument(format!(
                "token {token} outside the vocabulary of {}",
                self.cfg.vocab
            )));
        }
        let mut x = vec![0f32; self.cfg.dim];
        self.mat(&self.embed).dequantize_row(t, &mut x)?;
        Ok(x)
    }

    /// Runs `token` at the next position of `cache` and returns the logits of the token
    /// after it.
    pub fn forward(&self, token: u32, cache: &mut KvCache) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let pos = cache.len;
        if pos >= cache.capacity {
            return Err(LlmError::InvalidArgument(format!(
                "the KV cache is full ({} positions): start a new conversation or raise \
                 the context",
                cache.capacity
            )));
        }
        if cache.kv_dim != c.kv_dim() || cache.k.len() != c.n_layers {
            return Err(LlmError::Shape("KV cache made for another model".into()));
        }
        let (d, kvd, hd) = (c.dim, c.kv_dim(), c.head_dim);
        let mut x = self.embed(token)?;
        let mut xb = vec![0f32; d];
        let mut q = vec![0f32; d];
        let mut att = vec![0f32; d];
        let mut o = vec![0f32; d];
        let mut g = vec![0f32; c.hidden];
        let mut u = vec![0f32; c.hidden];
        let group = c.n_heads / c.n_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, l) in self.layers.iter().enumerate() {
            rms_norm(&x, &l.attn_norm, c.eps, &mut xb);
            self.mat(&l.wq).matvec(&xb, &mut q)?;
            let kc = &mut cache.k[li][pos * kvd..(pos + 1) * kvd];
            self.mat(&l.wk).matvec(&xb, kc)?;
            self.rope(kc, pos);
            let vc = &mut cache.v[li][pos * kvd..(pos + 1) * kvd];
            self.mat(&l.wv).matvec(&xb, vc)?;
            self.rope(&mut q, pos);
            let (kl, vl) = (&cache.k[li], &cache.v[li]);
            att.par_chunks_mut(hd).enumerate().for_each(|(h, out)| {
                let qh = &q[h * hd..(h + 1) * hd];
                let kvh = h / group;
                let mut s: Vec<f32> = (0..=pos)
                    .map(|t| {
                        let k = &kl[t * kvd + kvh * hd..t * kvd + (kvh + 1) * hd];
                        qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale
                    })
                    .collect();
                let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let mut sum = 0f32;
                for v in &mut s {
                    *v = (*v - m).exp();
                    sum += *v;
                }
                out.fill(0.0);
                for (t, p) in s.iter().enumerate() {
                    let v = &vl[t * kvd + kvh * hd..t * kvd + (kvh + 1) * hd];
                    let w = p / sum;
                    for (a, b) in out.iter_mut().zip(v) {
                        *a += w * b;
                    }
                }
            });
            self.mat(&l.wo).matvec(&att, &mut o)?;
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
            rms_norm(&x, &l.ffn_norm, c.eps, &mut xb);
            self.mat(&l.gate).matvec(&xb, &mut g)?;
            self.mat(&l.up).matvec(&xb, &mut u)?;
            for (a, b) in g.iter_mut().zip(&u) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
            self.mat(&l.down).matvec(&g, &mut o)?;
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
        }
        cache.len = pos + 1;
        rms_norm(&x.clone(), &self.out_norm, c.eps, &mut x);
        let mut logits = vec![0f32; c.vocab];
        self.mat(&self.output).matvec(&x, &mut logits)?;
        Ok(logits)
    }
}
