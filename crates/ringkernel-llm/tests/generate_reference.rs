//! The real model against the reference in `fixtures/generate_reference.txt`
//! (`scripts/llm_reference.py generate`): same prompt tokens, same greedy tokens (or a
//! near-tie in the reference where they differ), logits within 1e-3 relative.

mod common;

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

fn fixture() -> Vec<Prompt> {
    let mut out: Vec<Prompt> = Vec::new();
    for line in include_str!("fixtures/generate_reference.txt").lines() {
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

#[test]
fn greedy_tokens_and_logits_match_the_reference() {
    let Some(f) = common::model("greedy_tokens_and_logits_match_the_reference") else {
        return;
    };
    let prompts = fixture();
    assert_eq!(prompts.len(), 3);
    let s = Session::from_file(Arc::new(f), 256).unwrap();
    let template = ChatTemplate::from_gguf(s.model().file()).unwrap();
    let mut worst = 0f64;
    for p in &prompts {
        let text = template.render(&[Message::user(p.text.clone())], true);
        assert_eq!(
            s.tokenizer().encode(&text, true),
            p.ids,
            "prompt tokens of {:?}",
            p.text
        );
        assert_eq!(p.steps.len(), 32);
        let mut cache: KvCache = s.model().new_cache(256);
        let mut logits = Vec::new();
        for &id in &p.ids {
            logits = s.model().forward(id, &mut cache).unwrap();
        }
        for (i, (want, top)) in p.steps.iter().enumerate() {
            let got = argmax(&logits) as u32;
            if got != *want {
                let gap = top[0].1 - top[1].1;
                assert!(
                    gap < 1e-3,
                    "{:?} step {i}: ours {got}, reference {want} with a top-2 gap of {gap}",
                    p.text
                );
            }
            for &(id, v) in top {
                let ours = logits[id as usize] as f64;
                let rel = (ours - v).abs() / v.abs().max(1.0);
                worst = worst.max(rel);
                assert!(
                    rel <= 1e-3,
                    "{:?} step {i} token {id}: {ours} vs {v}",
                    p.text
                );
            }
            // Teacher forcing: the reference's token, so every step is compared.
            logits = s.model().forward(*want, &mut cache).unwrap();
        }
    }
    eprintln!("worst relative logit difference: {worst:.2e}");
}
