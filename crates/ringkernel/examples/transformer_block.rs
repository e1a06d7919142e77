//! One transformer decoder layer with random weights, decoding 16 tokens with a KV cache,
//! checked step by step against an f64 reference path.
//!
//! Per step: RMSNorm → Q, K, V projections → RoPE on Q and K → append K, V to the cache
//! → causal attention over the cache → output projection + residual → RMSNorm → SwiGLU
//! MLP + residual. Everything stays on the device; only the layer output is read back to
//! compare. Prints the relative error of each step and the maximum; exits non-zero when
//! it is above the tolerance.
//!
//! ```text
//! cargo run -p ringkernel --example transformer_block                              # CPU
//! cargo run -p ringkernel --features wgpu --example transformer_block -- --device wgpu
//! cargo run -p ringkernel --features full --example transformer_block -- --device auto
//! ```
//!
//! `--device` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".

mod common;

use ringkernel::compute::{reference, Device, KvCache, MatmulDims, RopeDims, Tensor};
use ringkernel::core::compute::AttentionDims;
use ringkernel::core::util::{rel_error, SplitMix64};
use ringkernel::Result;
use std::process::ExitCode;

const D_MODEL: usize = 64;
const HEADS: usize = 4;
const HEAD_DIM: usize = D_MODEL / HEADS;
const D_FF: usize = 128;
const STEPS: usize = 16;
const EPS: f32 = 1e-5;
const BASE: f32 = 10000.0;
const TOLERANCE: f64 = 1e-4;

/// A weight, on the host (the f32 values the reference reads) and on the device.
struct Weight {
    host: Vec<f32>,
    dev: Tensor,
}

fn weight(
    dev: &Device,
    rng: &mut SplitMix64,
    rows: usize,
    cols: usize,
    scale: f32,
) -> Result<Weight> {
    let host = rng.vec(rows * cols, -scale, scale);
    let dev = Tensor::from_slice(dev, &host, &[rows, cols])?;
    Ok(Weight { host, dev })
}

/// A norm weight `[n]` around 1.
fn norm_weight(dev: &Device, rng: &mut SplitMix64, n: usize) -> Result<Weight> {
    let host = rng.vec(n, 0.8, 1.2);
    let dev = Tensor::from_slice(dev, &host, &[n])?;
    Ok(Weight { host, dev })
}

struct Layer {
    norm1: Weight,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    wo: Weight,
    norm2: Weight,
    w_gate: Weight,
    w_up: Weight,
    w_down: Weight,
}

impl Layer {
    fn random(dev: &Device, rng: &mut SplitMix64) -> Result<Layer> {
        let s_in = 1.0 / (D_MODEL as f32).sqrt();
        let s_ff = 1.0 / (D_FF as f32).sqrt();
        Ok(Layer {
            norm1: norm_weight(dev, rng, D_MODEL)?,
            wq: weight(dev, rng, D_MODEL, D_MODEL, s_in)?,
            wk: weight(dev, rng, D_MODEL, D_MODEL, s_in)?,
            wv: weight(dev, rng, D_MODEL, D_MODEL, s_in)?,
            wo: weight(dev, rng, D_MODEL, D_MODEL, s_in)?,
            norm2: norm_weight(dev, rng, D_MODEL)?,
            w_gate: weight(dev, rng, D_MODEL, D_FF, s_in)?,
            w_up: weight(dev, rng, D_MODEL, D_FF, s_in)?,
            w_down: weight(dev, rng, D_FF, D_MODEL, s_ff)?,
        })
    }

    /// One decode step on the device: `x: [1, D_MODEL]` at position `pos`.
    fn step(&self, x: &Tensor, pos: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let h = x.rms_norm(&self.norm1.dev, EPS)?;
        // [1, D_MODEL] is [seq = 1, HEADS, HEAD_DIM] for RoPE and [HEADS, 1, HEAD_DIM] for
        // attention: the same memory.
        let q = h
            .matmul(&self.wq.dev)?
            .reshape(&[1, HEADS, HEAD_DIM])?
            .rope(pos, BASE)?;
        let k = h
            .matmul(&self.wk.dev)?
            .reshape(&[1, HEADS, HEAD_DIM])?
            .rope(pos, BASE)?;
        let v = h.matmul(&self.wv.dev)?;
        cache.append(
            &k.reshape(&[HEADS, 1, HEAD_DIM])?,
            &v.reshape(&[HEADS, 1, HEAD_DIM])?,
        )?;
        let attn = cache.attention(&q.reshape(&[HEADS, 1, HEAD_DIM])?)?;
        let x1 = x.add(&attn.reshape(&[1, D_MODEL])?.matmul(&self.wo.dev)?)?;
        let h2 = x1.rms_norm(&self.norm2.dev, EPS)?;
        let act = h2
            .matmul(&self.w_gate.dev)?
            .swiglu(&h2.matmul(&self.w_up.dev)?)?;
        x1.add(&act.matmul(&self.w_down.dev)?)
    }
}

/// The same layer in f64, with its own K/V history per head.
struct RefLayer {
    keys: Vec<Vec<f64>>,
    values: Vec<Vec<f64>>,
}

fn mm(x: &[f64], w: &Weight, k: usize, n: usize) -> Vec<f64> {
    reference::matmul(
        x,
        &w.host,
        MatmulDims {
            batch: 1,
            m: 1,
            k,
            n,
            b_batched: false,
        },
    )
}

impl RefLayer {
    fn step(&mut self, l: &Layer, x: &[f64], pos: usize) -> Vec<f64> {
        let h = reference::rms_norm(x, &l.norm1.host, 1, D_MODEL, EPS);
        let rope = RopeDims {
            seq: 1,
            heads: HEADS,
            head_dim: HEAD_DIM,
            base: BASE,
        };
        let p = [pos as f64];
        let q = reference::rope(&mm(&h, &l.wq, D_MODEL, D_MODEL), &p, rope);
        let k = reference::rope(&mm(&h, &l.wk, D_MODEL, D_MODEL), &p, rope);
        let v = mm(&h, &l.wv, D_MODEL, D_MODEL);
        for head in 0..HEADS {
            self.keys[head].extend_from_slice(&k[head * HEAD_DIM..(head + 1) * HEAD_DIM]);
            self.values[head].extend_from_slice(&v[head * HEAD_DIM..(head + 1) * HEAD_DIM]);
        }
        let n = pos + 1;
        let dims = AttentionDims {
            batch_heads: HEADS,
            q_len: 1,
            kv_len: n,
            kv_stride: n,
            head_dim: HEAD_DIM,
            scale: 1.0 / (HEAD_DIM as f32).sqrt(),
            causal: true,
            q_offset: n - 1,
        };
        let attn = reference::attention(&q, &self.keys.concat(), &self.values.concat(), dims);
        let o = mm(&attn, &l.wo, D_MODEL, D_MODEL);
        let x1: Vec<f64> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let h2 = reference::rms_norm(&x1, &l.norm2.host, 1, D_MODEL, EPS);
        let act = reference::swiglu(
            &mm(&h2, &l.w_gate, D_MODEL, D_FF),
            &mm(&h2, &l.w_up, D_MODEL, D_FF),
        );
        let down = mm(&act, &l.w_down, D_FF, D_MODEL);
        x1.iter().zip(&down).map(|(a, b)| a + b).collect()
    }
}

fn run() -> Result<bool> {
    let dev = common::device_arg()?;
    println!("device: {dev}");
    println!("decoder layer: d_model {D_MODEL}, {HEADS} heads of {HEAD_DIM}, SwiGLU {D_FF}, {STEPS} decode steps");
    let mut rng = SplitMix64::from_entropy();
    let layer = Layer::random(&dev, &mut rng)?;
    let mut cache = KvCache::new(&dev, HEADS, STEPS, HEAD_DIM)?;
    let mut reference = RefLayer {
        keys: vec![Vec::new(); HEADS],
        values: vec![Vec::new(); HEADS],
    };
    let mut worst = 0.0f64;
    for step in 0..STEPS {
        let x = rng.vec(D_MODEL, -1.0, 1.0);
        let xt = Tensor::from_slice(&dev, &x, &[1, D_MODEL])?;
        let pos = Tensor::from_slice(&dev, &[step as f32], &[1])?;
        let got = layer.step(&xt, &pos, &mut cache)?.to_vec()?;
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let want = reference.step(&layer, &x64, step);
        let e = rel_error(&got, &want);
        worst = worst.max(e);
        println!(
            "step {step:>2}: cache {:>2} positions, rel error {e:.2e}",
            cache.len()
        );
    }
    let ok = worst <= TOLERANCE;
    println!(
        "max rel error {worst:.2e} (tolerance {TOLERANCE:.0e}): {}",
        if ok { "ok" } else { "FAIL" }
    );
    // one more step would overflow the cache: a clear error, not a panic
    let extra = Tensor::zeros(&dev, &[HEADS, 1, HEAD_DIM])?;
    match cache.append(&extra, &extra) {
        Err(e) => println!("step {STEPS} refused as expected: {e}"),
        Ok(()) => {
            println!("FAIL: the cache accepted more than its capacity");
            return Ok(false);
        }
    }
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
