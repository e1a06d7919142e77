//! A stack of llama-style decoder layers through one backend op,
//! `ComputeBackend::decoder_layers`, with Q4_1 weights used as stored, checked against
//! the f64 reference (`reference::decoder_layer`, one layer after the other).
//!
//! Three random layers run a 4-token prompt in one call, then decode 8 tokens one at a
//! time with their KV caches on the device. The decode step is recorded once where the
//! backend records (a CUDA graph) and replayed, with the position in a device buffer.
//! Last, `ComputeBackend::greedy_feed` ends a greedy step: the argmax of random logits,
//! that token's embedding as the next input, the position advanced. Prints the relative
//! error of every call and exits non-zero above the tolerance or at a wrong token.
//!
//! ```text
//! cargo run -p ringkernel --example decoder_layers                              # CPU
//! cargo run -p ringkernel --features wgpu --example decoder_layers -- --device wgpu
//! cargo run -p ringkernel --features cuda --example decoder_layers -- --device cuda
//! ```
//!
//! `--device` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".

mod common;

use ringkernel::compute::reference::{self, HostDecoderLayer};
use ringkernel::compute::{
    BlockWeights, BufferRef, DecoderDims, DecoderLayer, DecoderScratchBuffers, EmbeddingDims,
    GreedyFeed, KvDims, WeightFormat,
};
use ringkernel::core::compute::{dtype, quant};
use ringkernel::core::util::{rel_error, SplitMix64};
use ringkernel::Result;
use std::process::ExitCode;

const LAYERS: usize = 3;
const DIM: usize = 128;
const HIDDEN: usize = 256;
const PROMPT: usize = 4;
const STEPS: usize = 8;
const TOLERANCE: f64 = 1e-4;
/// Rows of the embedding table of the greedy feed at the end.
const VOCAB: usize = 1000;
const FORMAT: WeightFormat = WeightFormat::Q4_1;

const KV: KvDims = KvDims {
    tokens: 1,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    capacity: PROMPT + STEPS,
    rope_base: 10000.0,
    scale: 0.176_776_7, // 1/√32
};

/// One layer's weights: the quantised blocks on the host (what the reference reads) and
/// their device buffers; the norms likewise.
struct Layer {
    blocks: [Vec<u32>; 5],
    norms: [Vec<f32>; 2],
    dev: [BufferRef; 5],
    dev_norms: [BufferRef; 2],
    caches: [BufferRef; 2],
}

fn run() -> Result<bool> {
    let dev = common::device_arg()?;
    println!("device: {dev}");
    let b = dev.backend();
    let mut rng = SplitMix64::from_entropy();
    let (qkv_rows, att) = (
        (KV.heads + 2 * KV.kv_heads) * KV.head_dim,
        KV.heads * KV.head_dim,
    );
    let cache_len = KV.kv_heads * KV.capacity * KV.head_dim;
    let mut layers = Vec::new();
    for _ in 0..LAYERS {
        let mut m =
            |rows: usize, cols: usize| quant::quantize(FORMAT, &rng.vec(rows * cols, -0.5, 0.5));
        let blocks = [
            m(qkv_rows, DIM)?,
            m(DIM, att)?,
            m(HIDDEN, DIM)?,
            m(HIDDEN, DIM)?,
            m(DIM, HIDDEN)?,
        ];
        let norms = [rng.vec(DIM, 0.5, 1.5), rng.vec(DIM, 0.5, 1.5)];
        let up = |w: &Vec<u32>| b.upload(dtype::words_as_f32(w));
        layers.push(Layer {
            dev: [
                up(&blocks[0])?,
                up(&blocks[1])?,
                up(&blocks[2])?,
                up(&blocks[3])?,
                up(&blocks[4])?,
            ],
            dev_norms: [b.upload(&norms[0])?, b.upload(&norms[1])?],
            caches: [
                b.upload(&vec![0.0; cache_len])?,
                b.upload(&vec![0.0; cache_len])?,
            ],
            blocks,
            norms,
        });
    }
    fn bw(buffer: &BufferRef) -> BlockWeights<'_> {
        BlockWeights {
            buffer: &**buffer,
            format: FORMAT,
        }
    }
    let dev_layers: Vec<DecoderLayer> = layers
        .iter()
        .map(|l| DecoderLayer {
            attn_norm: &*l.dev_norms[0],
            qkv: bw(&l.dev[0]),
            wo: bw(&l.dev[1]),
            ffn_norm: &*l.dev_norms[1],
            gate: bw(&l.dev[2]),
            up: &*l.dev[3],
            down: bw(&l.dev[4]),
            k_cache: &*l.caches[0],
            v_cache: &*l.caches[1],
        })
        .collect();
    let host_layers: Vec<HostDecoderLayer> = layers
        .iter()
        .map(|l| HostDecoderLayer {
            attn_norm: &l.norms[0],
            qkv: (FORMAT, &l.blocks[0]),
            wo: (FORMAT, &l.blocks[1]),
            ffn_norm: &l.norms[1],
            gate: (FORMAT, &l.blocks[2]),
            up: &l.blocks[3],
            down: (FORMAT, &l.blocks[4]),
        })
        .collect();
    let dims = |tokens| DecoderDims {
        kv: KvDims { tokens, ..KV },
        dim: DIM,
        hidden: HIDDEN,
        eps: 1e-5,
    };
    // Scratch for up to PROMPT tokens.
    let scratch = DecoderScratchBuffers::new(&**b, PROMPT, &dims(PROMPT))?;
    let s = scratch.view();
    let (x, pos) = (b.alloc(PROMPT * DIM)?, b.alloc(PROMPT)?);
    // The reference's caches, one pair a layer.
    let mut host_caches = vec![(vec![0.0f32; cache_len], vec![0.0f32; cache_len]); LAYERS];
    let reference_stack =
        |x: &[f32], positions: &[u32], tokens, caches: &mut Vec<(Vec<f32>, Vec<f32>)>| {
            let mut x: Vec<f32> = x.to_vec();
            for (l, c) in host_layers.iter().zip(caches.iter_mut()) {
                let (rx, rk, rv) =
                    reference::decoder_layer(&x, positions, l, &c.0, &c.1, dims(tokens));
                x = rx.iter().map(|&v| v as f32).collect();
                c.0 = rk.iter().map(|&v| v as f32).collect();
                c.1 = rv.iter().map(|&v| v as f32).collect();
            }
            x.iter().map(|&v| v as f64).collect::<Vec<f64>>()
        };
    let mut worst = 0.0f64;
    let mut report = |what: &str, got: &[f32], want: &[f64]| {
        let e = rel_error(got, want);
        worst = worst.max(e);
        println!("{what:<28} relative error {e:.2e}");
    };

    // The prompt, in one call.
    let x0 = rng.vec(PROMPT * DIM, -1.0, 1.0);
    let positions: Vec<u32> = (0..PROMPT as u32).collect();
    b.write(&*x, 0, &x0)?;
    b.write(&*pos, 0, dtype::words_as_f32(&positions))?;
    b.decoder_layers(&*x, &*pos, &dev_layers, &s, dims(PROMPT))?;
    let mut got = vec![0.0f32; PROMPT * DIM];
    b.read(&*x, 0, &mut got)?;
    let want = reference_stack(&x0, &positions, PROMPT, &mut host_caches);
    report(&format!("prompt of {PROMPT} tokens"), &got, &want);

    // Then one token a step, recorded once where the backend can.
    let mut step = || b.decoder_layers(&*x, &*pos, &dev_layers, &s, dims(1));
    let recorded = b.record(&mut step)?;
    println!(
        "decode step: {}",
        recorded
            .as_ref()
            .map_or("op by op".into(), |r| r.describe())
    );
    for p in PROMPT..PROMPT + STEPS {
        let xs = rng.vec(DIM, -1.0, 1.0);
        b.write(&*x, 0, &xs)?;
        b.write(&*pos, 0, dtype::words_as_f32(&[p as u32]))?;
        match &recorded {
            Some(r) => r.replay()?,
            None => step()?,
        }
        let mut got = vec![0.0f32; DIM];
        b.read(&*x, 0, &mut got)?;
        let want = reference_stack(&xs, &[p as u32], 1, &mut host_caches);
        report(&format!("decode at position {p}"), &got, &want);
    }

    // The end of a greedy step that feeds the next: the argmax of some logits, that
    // token's row of a Q8_0 embedding table as the next input, the position advanced.
    let table = quant::quantize(WeightFormat::Q8_0, &rng.vec(VOCAB * DIM, -1.0, 1.0))?;
    let logits = rng.vec(VOCAB, -4.0, 4.0);
    let (dev_table, dev_logits, token) = (
        b.upload(dtype::words_as_f32(&table))?,
        b.upload(&logits)?,
        b.alloc(1)?,
    );
    b.greedy_feed(&GreedyFeed {
        logits: &*dev_logits,
        table: BlockWeights {
            buffer: &*dev_table,
            format: WeightFormat::Q8_0,
        },
        rows: VOCAB,
        cols: DIM,
        token: &*token,
        x: &*x,
        position: &*pos,
    })?;
    let (mut t, mut p, mut next) = ([0f32; 1], [0f32; 1], vec![0f32; DIM]);
    b.read(&*token, 0, &mut t)?;
    b.read(&*pos, 0, &mut p)?;
    b.read(&*x, 0, &mut next)?;
    let want_t = reference::argmax(&logits) as u32;
    let fed = EmbeddingDims {
        rows: VOCAB,
        cols: DIM,
        count: 1,
    };
    let want_x = reference::embedding(WeightFormat::Q8_0, &table, &[want_t], fed);
    let (t, p) = (t[0].to_bits(), p[0].to_bits());
    println!(
        "greedy feed: token {t} (want {want_t}), position {p} (want {})",
        PROMPT + STEPS
    );
    report("greedy feed's next input", &next, &want_x);
    let fed_ok = t == want_t && p as usize == PROMPT + STEPS;
    println!("worst relative error {worst:.2e} (tolerance {TOLERANCE:.0e})");
    Ok(worst <= TOLERANCE && fed_ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => common::exit(Err(e)),
    }
}
