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
use crate::compute::reference::{self, HostDecoderLayer};
use crate::compute::{
    checks, BlockWeights, BufferRef, DecoderDims, DecoderLayer, DecoderScratchBuffers,
    EmbeddingDims, KvDims, QMatmulDims,
};
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

/// Tokens of the prompt that [`Kit::decoder_layer_loop`] runs before its decode steps.
const PROMPT: usize = 3;

impl Kit<'_> {
    /// `decoder_layer` against [`reference::decoder_layer`]: a prompt of [`PROMPT`]
    /// tokens in one call, then one token a step (recorded once where the backend
    /// records, and replayed) up to the cache's capacity; the residual stream after every
    /// call, then both caches. Twice: every matrix in Q4_1, and mixed formats (the
    /// feed-forward block in f32, its down projection in Q8_0).
    pub(super) fn decoder_layer_loop(&mut self) {
        for (name, f) in [
            ("Q4_1", [WeightFormat::Q4_1; 4]),
            (
                "mixed",
                [
                    WeightFormat::Q8_0,
                    WeightFormat::Q4_1,
                    WeightFormat::F32,
                    WeightFormat::Q8_0,
                ],
            ),
        ] {
            let outcome = match self.run_decoder_layer_loop(f) {
                Err(e) => Outcome::Failed(format!("error: {e}")),
                Ok((got, want)) => {
                    compare(&got, &want, 4.0 * self.tol.attention.max(self.tol.linear))
                }
            };
            self.record(
                "decoder_layer",
                &format!(
                    "{name}: a {PROMPT}-token prompt, then {} recorded steps, vs f64",
                    STEPS - PROMPT
                ),
                outcome,
            );
        }
    }

    /// Formats `f`: QKV, output projection, gate/up, down.
    fn run_decoder_layer_loop(&mut self, f: [WeightFormat; 4]) -> Result<(Vec<f32>, Vec<f64>)> {
        let b = self.b;
        let kvd = KV.kv_heads * KV.head_dim;
        let att = KV.heads * KV.head_dim;
        let host =
            |k: &mut Self, format: WeightFormat, rows: usize, cols: usize| -> Result<Vec<u32>> {
                let x = k.rng.vec(rows * cols, -0.5, 0.5);
                quant::quantize(format, &x)
            };
        let w = [
            host(self, f[0], att + 2 * kvd, DIM)?,
            host(self, f[1], DIM, att)?,
            host(self, f[2], HIDDEN, DIM)?,
            host(self, f[2], HIDDEN, DIM)?,
            host(self, f[3], DIM, HIDDEN)?,
        ];
        let (attn_norm, ffn_norm) = (self.rng.vec(DIM, 0.5, 1.5), self.rng.vec(DIM, 0.5, 1.5));
        let dev: Vec<BufferRef> = w
            .iter()
            .map(|m| b.upload(dtype::words_as_f32(m)))
            .collect::<Result<_>>()?;
        let (an, fnm) = (b.upload(&attn_norm)?, b.upload(&ffn_norm)?);
        let cache = checks::kv_sizes(&KV)?.cache;
        let zeros = vec![0.0f32; cache];
        let (kc, vc) = (b.upload(&zeros)?, b.upload(&zeros)?);
        let bw = |i: usize, format| BlockWeights {
            buffer: &*dev[i],
            format,
        };
        let layer = DecoderLayer {
            attn_norm: &*an,
            qkv: bw(0, f[0]),
            wo: bw(1, f[1]),
            ffn_norm: &*fnm,
            gate: bw(2, f[2]),
            up: &*dev[3],
            down: bw(4, f[3]),
            k_cache: &*kc,
            v_cache: &*vc,
        };
        let dims = |tokens| DecoderDims {
            kv: KvDims { tokens, ..KV },
            dim: DIM,
            hidden: HIDDEN,
            eps: EPS,
        };
        let scratch = DecoderScratchBuffers::new(b, PROMPT, &dims(PROMPT))?;
        let s = scratch.view();
        let hl = HostDecoderLayer {
            attn_norm: &attn_norm,
            qkv: (f[0], &w[0]),
            wo: (f[1], &w[1]),
            ffn_norm: &ffn_norm,
            gate: (f[2], &w[2]),
            up: &w[3],
            down: (f[3], &w[4]),
        };
        let (x, pos) = (b.alloc(PROMPT * DIM)?, b.alloc(PROMPT)?);
        let (mut hk, mut hv) = (zeros.clone(), zeros);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        // the prompt, in one call
        let x0 = self.rng.vec(PROMPT * DIM, -1.0, 1.0);
        let positions: Vec<u32> = (0..PROMPT as u32).collect();
        b.write(&*x, 0, &x0)?;
        b.write(&*pos, 0, dtype::words_as_f32(&positions))?;
        b.decoder_layer(&*x, &*pos, &layer, &s, dims(PROMPT))?;
        let mut out = vec![0.0f32; PROMPT * DIM];
        b.read(&*x, 0, &mut out)?;
        got.extend(out);
        let (rx, rk, rv) = reference::decoder_layer(&x0, &positions, &hl, &hk, &hv, dims(PROMPT));
        want.extend(rx);
        hk = rk.iter().map(|&v| v as f32).collect();
        hv = rv.iter().map(|&v| v as f32).collect();
        // then one token a step
        let mut step = || b.decoder_layer(&*x, &*pos, &layer, &s, dims(1));
        let recorded = b.record(&mut step)?;
        for p in PROMPT..STEPS {
            let xs = self.rng.vec(DIM, -1.0, 1.0);
            b.write(&*x, 0, &xs)?;
            b.write(&*pos, 0, dtype::words_as_f32(&[p as u32]))?;
            match &recorded {
                Some(r) => r.replay()?,
                None => step()?,
            }
            let mut out = vec![0.0f32; DIM];
            b.read(&*x, 0, &mut out)?;
            got.extend(out);
            let (rx, rk, rv) = reference::decoder_layer(&xs, &[p as u32], &hl, &hk, &hv, dims(1));
            want.extend(rx);
            hk = rk.iter().map(|&v| v as f32).collect();
            hv = rv.iter().map(|&v| v as f32).collect();
        }
        for (c, r) in [(&kc, &hk), (&vc, &hv)] {
            let mut out = vec![0.0f32; cache];
            b.read(&**c, 0, &mut out)?;
            got.extend(out);
            want.extend(r.iter().map(|&v| v as f64));
        }
        Ok((got, want))
    }
}
