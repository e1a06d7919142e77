//! Our tokenizer against Hugging Face `tokenizers` on 300 varied strings
//! (`scripts/llm_reference.py tokenizer` wrote the fixture).

mod common;

use ringkernel_llm::tokenizer::Tokenizer;

#[test]
fn matches_reference_tokenization() {
    let Some(f) = common::model("matches_reference_tokenization") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let fixture = include_str!("fixtures/tokenizer_reference.txt");
    let mut n = 0;
    let mut bad = Vec::new();
    for line in fixture.lines() {
        let (hex, ids) = line.split_once('\t').expect("hex TAB ids");
        let text = String::from_utf8(common::unhex(hex)).unwrap();
        let want: Vec<u32> = ids
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        let got = tok.encode(&text, true);
        if got != want {
            bad.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
        assert_eq!(tok.decode(&got), text, "round trip");
        n += 1;
    }
    assert!(n >= 300, "{n} strings");
    assert!(
        bad.is_empty(),
        "{} of {n} differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
