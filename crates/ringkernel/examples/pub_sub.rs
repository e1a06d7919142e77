//! Publish/subscribe with MQTT topic filters: `+` matches one level, `#` the rest.
//!
//! ```text
//! cargo run -p ringkernel --example pub_sub                              # CPU
//! cargo run -p ringkernel --features wgpu --example pub_sub -- --backend wgpu
//! cargo run -p ringkernel --features full --example pub_sub -- --backend auto
//! ```
//!
//! `--backend` takes auto, cpu, cuda, wgpu or metal (default cpu). Each GPU backend
//! needs its cargo feature (`cuda`, `wgpu`, `metal`, or `full` for all three); one
//! left out of the build stops the example with "not compiled in: enable feature …".
//!
//! Three `rk.counter` kernels subscribe with different filters; the host publishes to
//! a few topics; each kernel counts what reached it.

mod common;

use ringkernel::prelude::*;
use std::time::Duration;

/// Receives replies from `k` until `n` arrived; returns the ids seen.
async fn drain(k: &KernelHandle, n: usize) -> Result<Vec<u64>> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let t: Token = k.receive_timeout_as(Duration::from_secs(5)).await?;
        ids.push(t.id);
    }
    // Nothing more than expected.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        k.try_receive::<Token>()?.is_none(),
        "{} got more than {n} messages",
        k.name()
    );
    Ok(ids)
}

common::example_main!(run);

async fn run() -> Result<()> {
    let rt = common::start(common::builder()?).await?;

    let opts = |name: &str| LaunchOptions::default().with_name(name);
    let temps = rt.launch(builtin::COUNTER, opts("temps")).await?;
    let kitchen = rt.launch(builtin::COUNTER, opts("kitchen")).await?;
    let all = rt.launch(builtin::COUNTER, opts("everything")).await?;
    rt.subscribe(temps.id(), "home/+/temperature")?;
    let kitchen_sub = rt.subscribe(kitchen.id(), "home/kitchen/#")?;
    rt.subscribe(all.id(), "#")?;

    let publish = |topic: &str, id: u64| -> Result<usize> {
        let r = rt.publish(topic, &Token::new(id, 0.0))?;
        println!("publish {topic:<26} -> {} subscriber(s)", r.delivered);
        assert!(r.queue_full.is_empty() && r.not_found.is_empty());
        Ok(r.delivered)
    };
    assert_eq!(publish("home/kitchen/temperature", 1)?, 3);
    assert_eq!(publish("home/garage/temperature", 2)?, 2);
    assert_eq!(publish("home/kitchen", 3)?, 2); // `#` also matches the parent level
    assert_eq!(publish("home/kitchen/light/level", 4)?, 2);
    assert_eq!(publish("$SYS/uptime", 5)?, 0); // `$` topics are not matched by `#`

    assert_eq!(drain(&temps, 2).await?, vec![1, 2]);
    assert_eq!(drain(&kitchen, 3).await?, vec![1, 3, 4]);
    assert_eq!(drain(&all, 4).await?, vec![1, 2, 3, 4]);
    println!("every subscriber got exactly the topics its filter matches");

    // Unsubscribe: no more deliveries to that kernel.
    rt.unsubscribe(kitchen_sub)?;
    assert_eq!(publish("home/kitchen/temperature", 6)?, 2);
    assert_eq!(drain(&kitchen, 0).await?, Vec::<u64>::new());
    assert_eq!(drain(&temps, 1).await?, vec![6]);
    assert_eq!(drain(&all, 1).await?, vec![6]);
    println!("after unsubscribe the kitchen kernel got nothing more");

    // Bad filters and topics are errors, not panics.
    assert!(matches!(
        rt.subscribe(all.id(), "home/#/x"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        rt.subscribe(all.id(), "home/kit+"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        rt.publish("home/+", &Token::new(0, 0.0)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        rt.unsubscribe(kitchen_sub),
        Err(Error::InvalidArgument(_))
    ));
    println!("invalid filters, wildcard topics and double unsubscribes are InvalidArgument");

    // Counters keep state: "everything" has now seen 5 tokens.
    let t: Token = all.call(Token::new(7, 0.0), Duration::from_secs(5)).await?;
    assert_eq!(t.value, 6.0);

    rt.shutdown().await?;
    println!("ok");
    Ok(())
}
