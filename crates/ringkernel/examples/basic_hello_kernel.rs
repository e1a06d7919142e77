//! The smallest RingKernel program: start a runtime, launch a kernel, talk to it.
//!
//! ```text
//! cargo run -p ringkernel --example basic_hello_kernel                              # CPU
//! cargo run -p ringkernel --features wgpu --example basic_hello_kernel -- --backend wgpu
//! cargo run -p ringkernel --features full --example basic_hello_kernel -- --backend auto
//! ```
//!
//! `--backend` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".
//!
//! 1. `rk.echo`, a built-in kernel every backend provides, doubles a token's value.
//! 2. On the CPU backend, a handler written here as a Rust closure greets by number.

mod common;

use ringkernel::prelude::*;
use std::time::Duration;

/// A request for the `hello` kernel: plain data, fixed layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Hello {
    who: u64,
}

impl RingMessage for Hello {
    const TYPE_ID: u32 = 0x4845_0001;
    const NAME: &'static str = "Hello";
}

/// The reply: the greeting as fixed-size bytes, and how many greetings so far.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Greeting {
    text: [u8; 32],
    who: u64,
}

impl RingMessage for Greeting {
    const TYPE_ID: u32 = 0x4845_0002;
    const NAME: &'static str = "Greeting";
}

common::example_main!(run);

async fn run() -> Result<()> {
    let rt = common::builder()?
        .register_fn("hello", |_ctx: &mut KernelContext<'_>, h: Hello| {
            let mut text = [0u8; 32];
            let s = format!("hello, kernel caller #{}", h.who);
            text[..s.len().min(32)].copy_from_slice(&s.as_bytes()[..s.len().min(32)]);
            Some(Greeting { text, who: h.who })
        })
        .build()
        .await?;
    println!("runtime on {} ({})", rt.backend(), rt.device_info());

    // 1. A built-in kernel: send, then receive the reply.
    let echo = rt.launch(builtin::ECHO, LaunchOptions::default()).await?;
    assert_eq!(echo.state(), LifecycleState::Active);
    echo.send(Token::new(1, 21.0)).await?;
    let reply: Token = echo.receive_timeout_as(Duration::from_secs(5)).await?;
    println!(
        "rk.echo: sent 21, got {} after {} hop",
        reply.value, reply.hops
    );
    assert_eq!((reply.id, reply.value, reply.hops), (1, 42.0, 1));

    // 2. A handler of our own (a Rust closure runs on the CPU backend only).
    if rt.backend() == BackendKind::Cpu {
        let hello = rt.launch("hello", LaunchOptions::default()).await?;
        for who in 1..=3u64 {
            let g: Greeting = hello.call(Hello { who }, Duration::from_secs(5)).await?;
            let text = std::str::from_utf8(&g.text).map_err(|e| Error::invalid(e.to_string()))?;
            let text = text.trim_end_matches('\0');
            println!("hello kernel: {text}");
            assert_eq!(g.who, who);
            assert_eq!(text, format!("hello, kernel caller #{who}"));
        }
    } else {
        println!(
            "(the closure handler runs on the CPU backend only; skipped on {})",
            rt.backend()
        );
    }

    let report = rt.shutdown().await?;
    assert_eq!(report.undelivered, 0);
    println!("ok: shut down {} kernel(s)", report.kernels);
    Ok(())
}
