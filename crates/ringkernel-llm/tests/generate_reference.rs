//! The real model against the reference in `fixtures/generate_reference.txt`
//! (`scripts/llm_reference.py generate`): same prompt tokens, same greedy tokens (or a
//! near-tie in the reference where they differ), logits within 1e-3 relative, on the CPU,
//! WebGPU (lavapipe in CI) and CUDA (ignored: needs a GPU).

mod common;

use ringkernel::compute::Device;
use ringkernel_llm::model::KvCache;
use ringkernel_llm::sample::argmax;
use ringkernel_llm::{ChatTemplate, Message, Session};
use std::sync::Arc;

struct Prompt {
    text: String,
    ids: Vec<u32>,
    /// Per step: the greedy token and the top logits (id, value).
    steps: Vec<(u32, Vec<(u32, f64)>)>,
}

/// Every reference: `fixtures/generate_reference.txt` (f64 NumPy, always there) and any
/// other `generate_reference*.txt` beside it (Hugging Face transformers', written on the
/// GPU machine by `scripts/llm_hf_peer.py reference`), with the file name.
fn fixtures() -> Vec<(String, Vec<Prompt>)> {
    let mut out = vec![(
        "generate_reference.txt".to_string(),
        parse(include_str!("fixtures/generate_reference.txt")),
    )];
    // Under cargo the crate's fixtures; a test binary run by itself (the GPU bundle)
    // looks in the checkout it runs from.
    let dirs = [
        std::env::var("CARGO_MANIFEST_DIR")
            .map_or_else(|_| String::new(), |d| d + "/tests/fixtures"),
        "crates/ringkernel-llm/tests/fixtures".to_string(),
    ];
    let Some(dir) = dirs
        .iter()
        .filter(|d| {
            std::path::Path::new(d)
                .join("generate_reference.txt")
                .is_file()
        })
        .find_map(|d| std::fs::read_dir(d).ok())
    else {
        return out;
    };
    let mut names: Vec<_> = dir
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("generate_reference")
                    && n.ends_with(".txt")
                    && n != "generate_reference.txt"
            })
        })
        .collect();
    names.sort();
    for p in names {
        let text = std::fs::read_to_string(&p).expect("fixture readable");
        out.push((p.display().to_string(), parse(&text)));
    }
    out
}

fn parse(text: &str) -> Vec<Prompt> {
    let mut out: Vec<Prompt> = Vec::new();
    for line in text.lines() {
        let mut it = line.split(' ');
        match it.next() {
            Some("prompt") => out.push(Prompt {
                text: String::from_utf8(common::unhex(it.next().unwrap())).unwrap(),
                ids: Vec::new(),
                steps: Vec::new(),
            }),
            Some("prompt_ids") => {
                out.last_mut().unwrap().ids = it.map(|s| s.parse().unwrap()).collect()
            }
            Some("step") => {
                let _i = it.next();
                let tok = it.next().unwrap().parse().unwrap();
                assert_eq!(it.next(), Some("top"));
                let top = it
                    .map(|p| {
                        let (a, b) = p.split_once(':').unwrap();
                        (a.parse().unwrap(), b.parse().unwrap())
                    })
                    .collect();
                out.last_mut().unwrap().steps.push((tok, top));
            }
            _ => {}
        }
    }
    out
}

/// Runs the first `prompts` fixture prompts on `device` (prompt as one batch, then the
/// first `steps` of the 32 steps teacher-forced with the reference's tokens) and checks
/// every step against every reference; returns the worst relative logit difference.
/// References that agree on a prompt's tokens share one run of the model (its forward
/// passes are the test's time: tens of seconds a run on lavapipe).
fn check_on(test: &str, device: &Device, prompts: usize, steps: usize) -> Option<f64> {
    let f = common::model(test)?;
    let s = Session::from_file_on(Arc::new(f), 256, device).unwrap();
    let template = ChatTemplate::from_gguf(s.model().file()).unwrap();
    let refs = fixtures();
    for (name, fixture) in &refs {
        assert_eq!(fixture.len(), 3, "{name}");
        assert!(fixture.iter().all(|p| p.steps.len() == 32), "{name}");
    }
    let mut worst = 0f64;
    for k in 0..prompts {
        let tokens = |p: &Prompt| -> Vec<u32> { p.steps.iter().take(steps).map(|s| s.0).collect() };
        let mut left: Vec<&(String, Vec<Prompt>)> = refs.iter().collect();
        while let Some(&(_, lead)) = left.first() {
            let p = &lead[k];
            let (group, rest): (Vec<_>, Vec<_>) = left
                .into_iter()
                .partition(|(_, f)| f[k].ids == p.ids && tokens(&f[k]) == tokens(p));
            left = rest;
            let names: Vec<&str> = group.iter().map(|(n, _)| n.as_str()).collect();
            eprintln!("{device}: prompt {k} against {}", names.join(", "));
            let text = template.render(&[Message::user(p.text.clone())], true);
            assert_eq!(
                s.tokenizer().encode(&text, true),
                p.ids,
                "prompt tokens of {:?}",
                p.text
            );
            let mut cache: KvCache = s.model().new_cache(256).unwrap();
            let mut logits = s.model().prefill(&p.ids, &mut cache).unwrap();
            let forced = tokens(p);
            for (i, &want) in forced.iter().enumerate() {
                for (name, f) in &group {
                    let top = &f[k].steps[i].1;
                    let got = argmax(&logits) as u32;
                    if got != want {
                        let gap = top[0].1 - top[1].1;
                        assert!(
                            gap < 1e-3,
                            "{device} ({name}): {:?} step {i}: ours {got}, reference {want} with a top-2 gap of {gap}",
                            p.text
                        );
                    }
                    for &(id, v) in top {
                        let ours = logits[id as usize] as f64;
                        let rel = (ours - v).abs() / v.abs().max(1.0);
                        worst = worst.max(rel);
                        assert!(
                            rel <= 1e-3,
                            "{device} ({name}): {:?} step {i} token {id}: {ours} vs {v}",
                            p.text
                        );
                    }
                }
                // Teacher forcing: the references' token, so every step is compared
                // (after the last one, nothing is left to compare).
                if i + 1 < forced.len() {
                    logits = s.model().forward(want, &mut cache).unwrap();
                }
            }
            eprintln!("{device}: decode steps {}", cache.step_mode());
        }
    }
    eprintln!("{device}: worst relative logit difference: {worst:.2e}");
    Some(worst)
}

#[test]
fn greedy_tokens_and_logits_match_the_reference() {
    check_on(
        "greedy_tokens_and_logits_match_the_reference",
        &Device::cpu(),
        3,
        32,
    );
}

/// WebGPU: every prompt on a GPU; on lavapipe (CI, a software renderer) one prompt and 8
/// steps.
#[test]
fn greedy_tokens_and_logits_match_the_reference_on_wgpu() {
    let test = "greedy_tokens_and_logits_match_the_reference_on_wgpu";
    if common::model(test).is_none() {
        return;
    }
    let dev = Device::wgpu().expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)");
    let (prompts, steps) = if dev.name().contains("llvmpipe") {
        (1, 8)
    } else {
        (3, 32)
    };
    check_on(test, &dev, prompts, steps);
}

#[test]
#[ignore = "needs CUDA GPU"]
fn greedy_tokens_and_logits_match_the_reference_on_cuda() {
    let dev = Device::cuda(0).expect("CUDA device 0");
    check_on(
        "greedy_tokens_and_logits_match_the_reference_on_cuda",
        &dev,
        3,
        32,
    );
}
