//! The kit's check of a recorded decoder step: the ops of two small transformer layers
//! and an output head, recorded once ([`ComputeBackend::record`]) and replayed at every
//! position of a cache, against the same ops run one at a time on a second set of
//! buffers. A backend that records (CUDA: a graph, or a program with
//! `RINGKERNEL_CUDA_PROGRAM=1`) must replay exactly what its ops compute; one that records
//! nothing runs the ops twice.
//!
//! [`ComputeBackend::record`]: crate::compute::ComputeBackend::record

use super::{compare, Kit, Outcome};
use crate::compute::dtype;
use crate::compute::quant::{self, WeightFormat};
use crate::compute::{checks, BufferRef, EmbeddingDims, KvDims, QMatmulDims};
use crate::error::Result;

/// Sizes of the step: model width, feed-forward width, vocabulary, layers, positions.
const DIM: usize = 96;
const HIDDEN: usize = 160;
const VOCAB: usize = 37;
const LAYERS: usize = 2;
const STEPS: usize = 9;
const EPS: f32 = 1e-5;

/// One layer's weights, each in its own format so every kernel variant runs.
struct Layer {
    attn_norm: BufferRef,
    qkv: BufferRef,
    wo: BufferRef,
    ffn_norm: BufferRef,
    gate: BufferRef,
    up: BufferRef,
    down: BufferRef,
}

struct Model {
    embed: BufferRef,
    layers: Vec<Layer>,
    out_norm: BufferRef,
    output: BufferRef,
}

/// Buffers of one run: ids and position in, caches and activations, logits out.
struct State {
    ids: BufferRef,
    pos: BufferRef,
    x: BufferRef,
    xb: BufferRef,
    qkv: BufferRef,
    q: BufferRef,
    att: BufferRef,
    hb: BufferRef,
    logits: BufferRef,
    k: Vec<BufferRef>,
    v: Vec<BufferRef>,
}

const KV: KvDims = KvDims {
    tokens: 1,
    heads: 3,
    kv_heads: 1,
    head_dim: 32,
    capacity: STEPS,
    rope_base: 10000.0,
    scale: 0.176_776_7, // 1/√32
};

const QKV_F: WeightFormat = WeightFormat::Q4_1;
const WO_F: WeightFormat = WeightFormat::Q8_0;
const FFN_F: WeightFormat = WeightFormat::F32;
const DOWN_F: WeightFormat = WeightFormat::Q4_1;
const OUT_F: WeightFormat = WeightFormat::Q8_0;

impl Kit<'_> {
    pub(super) fn recorded_step(&mut self) {
        let outcome = match self.run_recorded_step() {
            Err(e) => Outcome::Failed(format!("error: {e}")),
            Ok((got, want)) => compare(&got, &want, 1e-5),
        };
        self.record(
            "recorded decoder step",
            &format!("{LAYERS} layers, dim {DIM}, {STEPS} positions, replayed vs op by op"),
            outcome,
        );
    }

    fn quantized_upload(
        &mut self,
        format: WeightFormat,
        rows: usize,
        cols: usize,
    ) -> Result<BufferRef> {
        let x = self.rng.vec(rows * cols, -0.5, 0.5);
        let w = quant::quantize(format, &x)?;
        self.b.upload(dtype::words_as_f32(&w))
    }

    fn model(&mut self) -> Result<Model> {
        let kvd = KV.kv_heads * KV.head_dim;
        let mut layers = Vec::new();
        for _ in 0..LAYERS {
            let attn_norm = self.rng.vec(DIM, 0.5, 1.5);
            let ffn_norm = self.rng.vec(DIM, 0.5, 1.5);
            layers.push(Layer {
                attn_norm: self.b.upload(&attn_norm)?,
                qkv: self.quantized_upload(QKV_F, DIM + 2 * kvd, DIM)?,
                wo: self.quantized_upload(WO_F, DIM, DIM)?,
                ffn_norm: self.b.upload(&ffn_norm)?,
                gate: self.quantized_upload(FFN_F, HIDDEN, DIM)?,
                up: self.quantized_upload(FFN_F, HIDDEN, DIM)?,
                down: self.quantized_upload(DOWN_F, DIM, HIDDEN)?,
            });
        }
        let out_norm = self.rng.vec(DIM, 0.5, 1.5);
        Ok(Model {
            embed: self.quantized_upload(WeightFormat::Q8_0, VOCAB, DIM)?,
            layers,
            out_norm: self.b.upload(&out_norm)?,
            output: self.quantized_upload(OUT_F, VOCAB, DIM)?,
        })
    }

    fn state(&self) -> Result<State> {
        let b = self.b;
        let s = checks::kv_sizes(&KV)?;
        let zeros = vec![0.0f32; s.cache];
        let nan = |n: usize| b.upload(&vec![f32::NAN; n]);
        Ok(State {
            ids: b.alloc(1)?,
            pos: b.alloc(1)?,
            x: nan(DIM)?,
            xb: nan(DIM)?,
            qkv: nan(s.qkv)?,
            q: nan(s.q)?,
            att: nan(s.q)?,
            hb: nan(HIDDEN)?,
            logits: nan(VOCAB)?,
            k: (0..LAYERS)
                .map(|_| b.upload(&zeros))
                .collect::<Result<_>>()?,
            v: (0..LAYERS)
                .map(|_| b.upload(&zeros))
                .collect::<Result<_>>()?,
        })
    }

    /// The step's ops on `s`.
    fn step_ops(&self, m: &Model, s: &State) -> Result<()> {
        let b = self.b;
        let kvd = KV.kv_heads * KV.head_dim;
        let mm = |rows, cols, accumulate| QMatmulDims {
            batch: 1,
            rows,
            cols,
            accumulate,
        };
        let embed = EmbeddingDims {
            rows: VOCAB,
            cols: DIM,
            count: 1,
        };
        b.embedding(&*m.embed, WeightFormat::Q8_0, &*s.ids, &*s.x, embed)?;
        for (l, w) in m.layers.iter().enumerate() {
            let qkv_d = mm(DIM + 2 * kvd, DIM, false);
            b.rms_norm_qmatmul(
                &*s.x,
                &*w.attn_norm,
                EPS,
                &*s.xb,
                &[&*w.qkv],
                QKV_F,
                &*s.qkv,
                qkv_d,
            )?;
            b.rope_attention_kv(&*s.qkv, &*s.pos, &*s.q, &*s.k[l], &*s.v[l], &*s.att, KV)?;
            b.qmatmul(&*w.wo, WO_F, &*s.att, &*s.x, mm(DIM, DIM, true))?;
            let ffn = [&*w.gate, &*w.up];
            b.rms_norm_qmatmul(
                &*s.x,
                &*w.ffn_norm,
                EPS,
                &*s.xb,
                &ffn,
                FFN_F,
                &*s.hb,
                mm(HIDDEN, DIM, false),
            )?;
            b.qmatmul(&*w.down, DOWN_F, &*s.hb, &*s.x, mm(DIM, HIDDEN, true))?;
        }
        let head = mm(VOCAB, DIM, false);
        b.rms_norm_qmatmul(
            &*s.x,
            &*m.out_norm,
            EPS,
            &*s.xb,
            &[&*m.output],
            OUT_F,
            &*s.logits,
            head,
        )
    }

    /// Logits of every position and then every cache, recorded (`got`) and op by op.
    fn run_recorded_step(&mut self) -> Result<(Vec<f32>, Vec<f64>)> {
        let m = self.model()?;
        let (rec, direct) = (self.state()?, self.state()?);
        let recorded = self.b.record(&mut || self.step_ops(&m, &rec))?;
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for step in 0..STEPS {
            let id = self.rng.below(VOCAB as u64) as u32;
            for s in [&rec, &direct] {
                self.b.write(&*s.ids, 0, dtype::words_as_f32(&[id]))?;
                self.b
                    .write(&*s.pos, 0, dtype::words_as_f32(&[step as u32]))?;
            }
            match &recorded {
                Some(r) => r.replay()?,
                None => self.step_ops(&m, &rec)?,
            }
            self.step_ops(&m, &direct)?;
            let mut out = vec![0.0f32; VOCAB];
            self.b.read(&*rec.logits, 0, &mut out)?;
            got.extend_from_slice(&out);
            self.b.read(&*direct.logits, 0, &mut out)?;
            want.extend(out.iter().map(|&v| v as f64));
        }
        let n = checks::kv_sizes(&KV)?.cache;
        for l in 0..LAYERS {
            for (a, b) in [(&rec.k[l], &direct.k[l]), (&rec.v[l], &direct.v[l])] {
                let mut out = vec![0.0f32; n];
                self.b.read(&**a, 0, &mut out)?;
                got.extend_from_slice(&out);
                self.b.read(&**b, 0, &mut out)?;
                want.extend(out.iter().map(|&v| v as f64));
            }
        }
        Ok((got, want))
    }
}
