//! Prints a GGUF file's metadata and tensors: `cargo run -p ringkernel-llm --example
//! gguf_dump -- PATH`.
use ringkernel_llm::gguf::{GgufFile, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: gguf_dump PATH")?;
    let f = GgufFile::open(&path)?;
    println!("GGUF v{} with {} tensors", f.version(), f.tensors().len());
    for k in f.keys() {
        match f.get(k) {
            Some(Value::Array(a)) => println!("{k} = array of {}", a.len()),
            Some(Value::String(s)) if s.len() > 200 => println!("{k} = {:?}...", &s[..200]),
            Some(v) => println!("{k} = {v:?}"),
            None => {}
        }
    }
    for t in f.tensors() {
        println!("{} {} {:?}", t.name, t.dtype.name(), t.dims);
    }
    Ok(())
}
