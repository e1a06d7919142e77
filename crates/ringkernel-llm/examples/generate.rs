//! Generates a reply with SmolLM2-135M on the CPU, streaming tokens, then prints the
//! speed: `cargo run --release -p ringkernel-llm --example generate -- "Your prompt"`.
//! The model is looked up as `ringkernel_llm::locate` describes.

use ringkernel_llm::{locate, Message, SamplerConfig, Session};
use std::io::Write;

fn main() {
    let prompt = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "What is the capital of France?".into());
    let path = match locate::find_model() {
        Ok(p) => p,
        Err(why) => {
            println!("SKIPPED: {why}; {}", locate::HOW_TO_GET);
            return;
        }
    };
    let mut s = match Session::open(&path, 1024) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let text = s.template().render(&[Message::user(prompt)], true);
    let r = s.generate(&text, 48, SamplerConfig::greedy(), |t| {
        print!("{t}");
        let _ = std::io::stdout().flush();
    });
    match r {
        Ok(st) => println!(
            "\n[{} prompt tokens, first token after {:.0} ms, {} tokens at {:.1} tokens/s]",
            st.prompt_tokens,
            st.prefill.as_secs_f64() * 1e3,
            st.generated,
            st.decode_tokens_per_s()
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
