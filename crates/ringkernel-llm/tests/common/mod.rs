//! Shared by the integration tests: the model file or the reason it is absent.
#![allow(dead_code)]

use ringkernel_llm::gguf::GgufFile;

/// The real model, or `None` after printing why the test is skipped.
pub fn model(test: &str) -> Option<GgufFile> {
    match ringkernel_llm::locate::find_model() {
        Ok(p) => Some(GgufFile::open(p).expect("the model file parses")),
        Err(why) => {
            eprintln!(
                "SKIPPED {test}: {why}; {}",
                ringkernel_llm::locate::HOW_TO_GET
            );
            None
        }
    }
}

/// Decodes a lower-case hex string.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}
