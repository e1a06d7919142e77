//! A small random llama model written as GGUF: the decoder against a plain f64
//! implementation on the CPU, on WebGPU (lavapipe in CI) and on CUDA (ignored: needs a
//! GPU), prompts batched and decoded token by token; the session's streaming and limits,
//! and the typed errors. Needs no model file.

use ringkernel::compute::Device;
use ringkernel_llm::gguf::{GgufFile, GgufWriter, Value};
use ringkernel_llm::model::{estimate_memory, LlamaConfig, Model};
use ringkernel_llm::quant::{quantize_q4_1, quantize_q8_0, GgmlType, QMatrix};
use ringkernel_llm::sample::Rng;
use ringkernel_llm::{LlmError, Message, SamplerConfig, Session};
use std::collections::HashMap;
use std::sync::Arc;

const DIM: usize = 64;
const HIDDEN: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;
const CTX: usize = 48;

/// GPT-2's byte alphabet (printable bytes as themselves, the rest from U+0100).
fn byte_tokens() -> Vec<String> {
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            if printable {
                char::from_u32(b).unwrap().to_string()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap().to_string()
            }
        })
        .collect()
}

fn writer(skip: Option<&str>) -> GgufWriter {
    let mut tokens = byte_tokens();
    tokens.extend(["<|im_start|>".to_string(), "<|im_end|>".to_string()]);
    let vocab = tokens.len();
    let mut types = vec![Value::I32(1); 256];
    types.extend([Value::I32(3), Value::I32(3)]);
    let mut r = Rng::new(42);
    let mut rand = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|_| r.symmetric() * s).collect() };
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(LAYERS as u32))
        .kv("llama.embedding_length", Value::U32(DIM as u32))
        .kv("llama.feed_forward_length", Value::U32(HIDDEN as u32))
        .kv("llama.attention.head_count", Value::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32))
        .kv("llama.context_length", Value::U32(CTX as u32))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        )
        .kv("tokenizer.ggml.token_type", Value::Array(types))
        .kv("tokenizer.ggml.merges", Value::Array(vec![]))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(257))
        .kv(
            "tokenizer.chat_template",
            Value::String("{{'<|im_start|>system\nTiny<|im_end|>\n'}}<|im_start|>".into()),
        );
    let mut add =
        |g: &mut GgufWriter, name: &str, rows: usize, cols: usize, ty: GgmlType, scale: f32| {
            if skip == Some(name) {
                return;
            }
            let w = rand(rows * cols, scale);
            let (dims, data): (Vec<u64>, Vec<u8>) = match ty {
                GgmlType::F32 => (
                    vec![cols as u64],
                    w.iter()
                        .map(|v| 1.0 + v)
                        .flat_map(f32::to_le_bytes)
                        .collect(),
                ),
                GgmlType::Q4_1 => (vec![cols as u64, rows as u64], quantize_q4_1(&w)),
                _ => (vec![cols as u64, rows as u64], quantize_q8_0(&w)),
            };
            g.tensor(name, &dims, ty.id(), data);
        };
    add(&mut g, "token_embd.weight", vocab, DIM, GgmlType::Q8_0, 1.0);
    let kv = KV_HEADS * DIM / HEADS;
    for i in 0..LAYERS {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        // Layer 0 keeps q/k/v and gate/up in one format each (joined blocks); layer 1
        // mixes them (joined as f32).
        let mixed = if i == 0 {
            GgmlType::Q4_1
        } else {
            GgmlType::Q8_0
        };
        add(&mut g, &n("attn_norm"), 1, DIM, GgmlType::F32, 0.2);
        add(&mut g, &n("attn_q"), DIM, DIM, GgmlType::Q4_1, 0.3);
        add(&mut g, &n("attn_k"), kv, DIM, GgmlType::Q4_1, 0.3);
        add(&mut g, &n("attn_v"), kv, DIM, mixed, 0.3);
        add(&mut g, &n("attn_output"), DIM, DIM, GgmlType::Q4_1, 0.2);
        add(&mut g, &n("ffn_norm"), 1, DIM, GgmlType::F32, 0.2);
        add(&mut g, &n("ffn_gate"), HIDDEN, DIM, GgmlType::Q4_1, 0.3);
        add(&mut g, &n("ffn_up"), HIDDEN, DIM, mixed, 0.3);
        add(&mut g, &n("ffn_down"), DIM, HIDDEN, GgmlType::Q8_0, 0.2);
    }
    add(&mut g, "output_norm.weight", 1, DIM, GgmlType::F32, 0.2);
    g
}

fn file() -> GgufFile {
    GgufFile::from_bytes(writer(None).to_bytes()).unwrap()
}

/// Every weight dequantized to f64, by name.
fn weights(f: &GgufFile) -> HashMap<String, Vec<f64>> {
    f.tensors()
        .iter()
        .map(|t| {
            let m = QMatrix::new(t.dtype, t.rows(), t.row_len(), f.tensor_bytes(t)).unwrap();
            (
                t.name.clone(),
                m.to_f32().into_iter().map(f64::from).collect(),
            )
        })
        .collect()
}

/// The llama forward pass in f64, all positions at once, written out plainly: returns
/// the logits of every position.
fn reference(w: &HashMap<String, Vec<f64>>, tokens: &[u32]) -> Vec<Vec<f64>> {
    let hd = DIM / HEADS;
    let kvd = KV_HEADS * hd;
    let mv = |m: &[f64], x: &[f64], rows: usize| -> Vec<f64> {
        (0..rows)
            .map(|r| (0..x.len()).map(|c| m[r * x.len() + c] * x[c]).sum())
            .collect()
    };
    let norm = |x: &[f64], g: &[f64]| -> Vec<f64> {
        let s = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + 1e-5).sqrt();
        x.iter().zip(g).map(|(v, g)| v / s * g).collect()
    };
    let rope = |x: &mut [f64], pos: usize| {
        for h in x.chunks_mut(hd) {
            for i in 0..hd / 2 {
                let a = pos as f64 * 10000f64.powf(-2.0 * i as f64 / hd as f64);
                let (p, q) = (h[2 * i], h[2 * i + 1]);
                h[2 * i] = p * a.cos() - q * a.sin();
                h[2 * i + 1] = p * a.sin() + q * a.cos();
            }
        }
    };
    let emb = &w["token_embd.weight"];
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| emb[t as usize * DIM..(t as usize + 1) * DIM].to_vec())
        .collect();
    for l in 0..LAYERS {
        let g = |s: &str| &w[&format!("blk.{l}.{s}.weight")];
        let hs: Vec<Vec<f64>> = xs.iter().map(|x| norm(x, g("attn_norm"))).collect();
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (p, h) in hs.iter().enumerate() {
            let mut q = mv(g("attn_q"), h, DIM);
            let mut k = mv(g("attn_k"), h, kvd);
            rope(&mut q, p);
            rope(&mut k, p);
            qs.push(q);
            ks.push(k);
            vs.push(mv(g("attn_v"), h, kvd));
        }
        for p in 0..tokens.len() {
            let mut att = vec![0.0; DIM];
            for h in 0..HEADS {
                let kh = h / (HEADS / KV_HEADS);
                let s: Vec<f64> = (0..=p)
                    .map(|t| {
                        (0..hd)
                            .map(|i| qs[p][h * hd + i] * ks[t][kh * hd + i])
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for (t, sv) in s.iter().enumerate() {
                    for i in 0..hd {
                        att[h * hd + i] += (sv - m).exp() / z * vs[t][kh * hd + i];
                    }
                }
            }
            let o = mv(g("attn_output"), &att, DIM);
            for (a, b) in xs[p].iter_mut().zip(o) {
                *a += b;
            }
            let h = norm(&xs[p], g("ffn_norm"));
            let gate = mv(g("ffn_gate"), &h, HIDDEN);
            let up = mv(g("ffn_up"), &h, HIDDEN);
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
                .collect();
            let d = mv(g("ffn_down"), &act, DIM);
            for (a, b) in xs[p].iter_mut().zip(d) {
                *a += b;
            }
        }
    }
    let vocab = emb.len() / DIM;
    xs.iter()
        .map(|x| mv(emb, &norm(x, &w["output_norm.weight"]), vocab))
        .collect()
}

/// The decoder on `device` against the f64 reference: the first 11 tokens as one
/// prompt batch, the rest one at a time (recorded steps where the backend records), then
/// the cache cut back and a second prompt batch over the same positions.
fn decoder_matches_the_reference_on(device: &Device) {
    let f = Arc::new(file());
    let w = weights(&f);
    let model = Model::load_on(device, f, CTX).unwrap();
    let tokens: Vec<u32> = (0..29).map(|i| (i * 37 % 258) as u32).collect();
    let want = reference(&w, &tokens);
    let check = |p: usize, got: &[f32]| {
        let scale = want[p].iter().fold(1f64, |a, v| a.max(v.abs()));
        for (g, r) in got.iter().zip(&want[p]) {
            assert!(
                (*g as f64 - r).abs() <= 1e-4 * scale,
                "{device}: position {p}: {g} vs {r}"
            );
        }
    };
    let mut cache = model.new_cache(CTX).unwrap();
    check(10, &model.prefill(&tokens[..11], &mut cache).unwrap());
    // a second cache decoding the same tokens greedily on the device
    let mut greedy = model.new_cache(CTX).unwrap();
    model.prefill(&tokens[..11], &mut greedy).unwrap();
    for (p, &t) in tokens.iter().enumerate().skip(11) {
        let logits = model.forward(t, &mut cache).unwrap();
        check(p, &logits);
        assert_eq!(
            model.forward_greedy(t, &mut greedy).unwrap() as usize,
            ringkernel_llm::sample::argmax(&logits),
            "{device}: greedy token at position {p}"
        );
        if p == 20 {
            // timing replays of a recorded step leave the cache as it was (the later
            // positions are checked against the reference)
            let timed = model.replay_time(&cache, 3).unwrap();
            assert_eq!(
                timed.is_some(),
                cache.step_mode().starts_with("recorded"),
                "{}",
                cache.step_mode()
            );
        }
    }
    assert_eq!(cache.len(), tokens.len());
    eprintln!("{device}: decode steps {}", cache.step_mode());
    assert!(
        !cache.step_mode().starts_with("direct:"),
        "{}",
        cache.step_mode()
    );
    cache.truncate(5);
    check(20, &model.prefill(&tokens[5..21], &mut cache).unwrap());
    check(21, &model.forward(tokens[21], &mut cache).unwrap());
}

#[test]
fn decoder_matches_an_f64_reference_on_the_cpu() {
    decoder_matches_the_reference_on(&Device::cpu());
}

/// WebGPU on whatever adapter there is (lavapipe in CI).
#[test]
fn decoder_matches_an_f64_reference_on_wgpu() {
    let dev = Device::wgpu().expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)");
    decoder_matches_the_reference_on(&dev);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn decoder_matches_an_f64_reference_on_cuda() {
    let dev = Device::cuda(0).expect("CUDA device 0");
    decoder_matches_the_reference_on(&dev);
}

/// `decode_greedy` (each step feeding the next on the device where the step is recorded,
/// one to three steps a replay) gives the tokens and the cache of a `forward_greedy`
/// loop, stopped early or not, and stops where the cache is full.
fn overlapped_greedy_matches_step_by_step_on(device: &Device) {
    for per in [1, 2, 3] {
        overlapped_greedy_matches_step_by_step(device, per);
    }
}

fn overlapped_greedy_matches_step_by_step(device: &Device, per: usize) {
    let model = Model::load_on(device, Arc::new(file()), CTX).unwrap();
    let prompt: Vec<u32> = (0..11).map(|i| (i * 53 % 258) as u32).collect();
    let fresh = || {
        let mut c = model.new_cache(CTX).unwrap();
        c.set_steps_per_replay(per).unwrap();
        let first = ringkernel_llm::sample::argmax(&model.prefill(&prompt, &mut c).unwrap());
        (c, first as u32)
    };
    let (mut a, first) = fresh();
    let mut want = Vec::new();
    let mut t = first;
    for _ in 0..14 {
        t = model.forward_greedy(t, &mut a).unwrap();
        want.push(t);
    }
    let (mut b, _) = fresh();
    let mut got = Vec::new();
    let n = model
        .decode_greedy(first, &mut b, 14, |t| {
            got.push(t);
            true
        })
        .unwrap();
    assert_eq!(
        (n, &got),
        (14, &want),
        "{device}, {per} a replay: {}",
        b.step_mode()
    );
    assert_eq!(b.len(), a.len());
    // Timing the greedy step's replays leaves the cache usable.
    let timed = model.replay_time(&b, 4).unwrap();
    assert_eq!(timed.is_some(), b.step_mode().starts_with("recorded"));

    // Stopped after 5 tokens: the cache holds the first token and 4 new ones, and
    // decoding on from there (one step, then overlapped again) continues the same text.
    let (mut c, _) = fresh();
    let mut seen = Vec::new();
    let n = model
        .decode_greedy(first, &mut c, 14, |t| {
            seen.push(t);
            seen.len() < 5
        })
        .unwrap();
    assert_eq!((n, &seen[..]), (5, &want[..5]), "{device}, {per} a replay");
    assert_eq!(c.len(), prompt.len() + 5);
    assert_eq!(model.forward_greedy(want[4], &mut c).unwrap(), want[5]);
    let mut rest = Vec::new();
    model
        .decode_greedy(want[5], &mut c, 8, |t| {
            rest.push(t);
            true
        })
        .unwrap();
    assert_eq!(rest, want[6..14], "{device}, {per} a replay");

    // Up to the cache's end: as many tokens as there are free positions, then an error.
    let free = CTX - c.len();
    let last = *rest.last().unwrap();
    let n = model.decode_greedy(last, &mut c, CTX, |_| true).unwrap();
    assert_eq!((n, c.len()), (free, CTX), "{device}, {per} a replay");
    assert!(model.decode_greedy(last, &mut c, 1, |_| true).is_err());
    assert_eq!(model.decode_greedy(last, &mut c, 0, |_| true).unwrap(), 0);
    // Steps a replay: 1 to MAX_STEPS_PER_REPLAY.
    for bad in [0, ringkernel_llm::model::MAX_STEPS_PER_REPLAY + 1] {
        assert!(matches!(
            c.set_steps_per_replay(bad),
            Err(LlmError::InvalidArgument(_))
        ));
    }
    assert_eq!(c.steps_per_replay(), per);
}

#[test]
fn overlapped_greedy_matches_step_by_step_on_the_cpu() {
    overlapped_greedy_matches_step_by_step_on(&Device::cpu());
}

#[test]
fn overlapped_greedy_matches_step_by_step_on_wgpu() {
    let dev = Device::wgpu().expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)");
    overlapped_greedy_matches_step_by_step_on(&dev);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn overlapped_greedy_matches_step_by_step_on_cuda() {
    overlapped_greedy_matches_step_by_step_on(&Device::cuda(0).expect("CUDA device 0"));
}

#[test]
fn session_streams_and_respects_limits() {
    let mut s = Session::from_file(Arc::new(file()), 40).unwrap();
    let prompt = s.template().render(&[Message::user("hi")], true);
    assert!(prompt.starts_with("<|im_start|>system\nTiny<|im_end|>\n"));
    let mut pieces = Vec::new();
    let st = s
        .generate(&prompt, 5, SamplerConfig::greedy(), |t| {
            pieces.push(t.to_string())
        })
        .unwrap();
    assert!(st.generated >= 1 && st.generated <= 5);
    assert_eq!(st.prompt_tokens, s.tokenizer().encode(&prompt, true).len());
    // Greedy is repeatable; a second identical prompt reuses the cache and agrees.
    s.reset();
    let mut again = Vec::new();
    s.generate(&prompt, 5, SamplerConfig::greedy(), |t| {
        again.push(t.to_string())
    })
    .unwrap();
    assert_eq!(pieces, again);
    // Too long for the context: a typed error, nothing run.
    let e = s
        .generate(&prompt, 100, SamplerConfig::greedy(), |_| {})
        .unwrap_err();
    assert!(
        matches!(e, LlmError::InvalidArgument(ref m) if m.contains("context")),
        "{e}"
    );
    let bad = SamplerConfig {
        temperature: -1.0,
        ..SamplerConfig::greedy()
    };
    assert!(matches!(
        s.generate(&prompt, 1, bad, |_| {}),
        Err(LlmError::InvalidArgument(_))
    ));
}

#[test]
fn load_errors_are_typed() {
    let f = Arc::new(GgufFile::from_bytes(writer(Some("blk.1.ffn_up.weight")).to_bytes()).unwrap());
    let e = Model::load(f, CTX).unwrap_err();
    assert!(
        matches!(e, LlmError::MissingTensor(ref n) if n == "blk.1.ffn_up.weight"),
        "{e}"
    );
    let f = Arc::new(file());
    assert!(matches!(
        Model::load(f.clone(), CTX + 1),
        Err(LlmError::InvalidArgument(_))
    ));
    let model = Model::load(f.clone(), 4).unwrap();
    let mut cache = model.new_cache(4).unwrap();
    for t in 0..4 {
        model.forward(t, &mut cache).unwrap();
    }
    assert!(
        matches!(model.forward(0, &mut cache), Err(LlmError::InvalidArgument(ref m)) if m.contains("full"))
    );
    assert!(matches!(
        model.forward(999, &mut model.new_cache(4).unwrap()),
        Err(LlmError::InvalidArgument(_))
    ));
    assert!(matches!(
        model.prefill(&[1, 2, 3, 4, 5], &mut model.new_cache(4).unwrap()),
        Err(LlmError::InvalidArgument(ref m)) if m.contains("full")
    ));
    // A cache of another model (another device here) is refused.
    let other = Model::load_on(&Device::cpu(), f.clone(), 4).unwrap();
    assert!(matches!(
        model.forward(1, &mut other.new_cache(4).unwrap()),
        Err(LlmError::Shape(_))
    ));
    // Memory estimate: the weights as uploaded plus an f32 KV cache.
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    let est = estimate_memory(&f, &cfg, CTX);
    assert_eq!(
        est.weights,
        Model::load(f.clone(), CTX).unwrap().weight_bytes()
    );
    assert_eq!(est.kv_cache, (2 * LAYERS * CTX * cfg.kv_dim() * 4) as u64);
    assert!(est.check_fits(est.total()).is_ok());
    let e = est.check_fits(est.total() - 1).unwrap_err();
    assert!(
        matches!(e, LlmError::OutOfMemory { .. }) && e.to_string().contains("KV cache"),
        "{e}"
    );
}
