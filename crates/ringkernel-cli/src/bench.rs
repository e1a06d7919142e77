//! `ringkernel bench`: quick in-process measurements, each beside a peer measured in
//! the same run (the criterion benches of each crate are the careful version).
//!
//! * SPSC queue, 8-byte items, producer and consumer on two threads: ours vs `rtrb`.
//! * HLC `tick`, uncontended: ours vs `uhlc`.
//! * CPU actor `call` round trip (`rk.echo`): ours vs a tokio mpsc + oneshot echo task
//!   on the same two-worker tokio runtime.
//!
//! Ours and the peer run alternately (repetitions, or blocks of round trips), so both
//! see the same load on a shared machine.

use crate::stats::{self, Percentiles, Table};
use ringkernel::core::hlc::HlcClock;
use ringkernel::core::queue::spsc;
use ringkernel::prelude::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Arguments of the quick `ringkernel bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct QuickArgs {
    /// Items pushed through each SPSC queue.
    #[arg(long, default_value_t = 10_000_000)]
    pub queue_items: u64,
    /// HLC ticks timed per clock.
    #[arg(long, default_value_t = 5_000_000)]
    pub ticks: u64,
    /// Round trips timed per actor.
    #[arg(long, default_value_t = 20_000)]
    pub round_trips: u64,
    /// Repetitions of each throughput measurement (the best is kept).
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
}

struct Row {
    what: String,
    ours: String,
    peer: String,
    ratio: f64,
    peer_name: &'static str,
}

/// Runs the quick benches and prints the table.
pub fn run(args: &QuickArgs) -> Result<()> {
    if args.queue_items == 0 || args.ticks == 0 || args.round_trips == 0 || args.reps == 0 {
        return Err(Error::invalid(
            "--queue-items, --ticks, --round-trips and --reps must be at least 1",
        ));
    }
    println!("RingKernel quick bench");
    println!("  machine   {}", stats::machine());
    println!("  date      {}", utc_date());
    if let Some(l) = stats::load_average() {
        println!("  load avg  {l} (before the run)");
    }
    let mut rows = Vec::new();

    eprintln!("  SPSC queue …");
    let (mut ours, mut peer) = (0.0f64, 0.0f64);
    for _ in 0..args.reps {
        ours = ours.max(spsc_ours(args.queue_items)?);
        peer = peer.max(spsc_rtrb(args.queue_items));
    }
    rows.push(Row {
        what: "SPSC queue, 8-byte items, 2 threads (msgs/s, higher is better)".into(),
        ours: stats::rate(ours),
        peer: stats::rate(peer),
        ratio: ours / peer,
        peer_name: "rtrb",
    });

    eprintln!("  HLC tick …");
    let (mut ours_ns, mut peer_ns) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..args.reps {
        ours_ns = ours_ns.min(hlc_ours(args.ticks));
        peer_ns = peer_ns.min(hlc_uhlc(args.ticks));
    }
    rows.push(Row {
        what: "HLC tick, uncontended (ns/tick, lower is better)".into(),
        ours: format!("{ours_ns:.1} ns"),
        peer: format!("{peer_ns:.1} ns"),
        ratio: ours_ns / peer_ns,
        peer_name: "uhlc",
    });

    eprintln!("  actor round trip …");
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Device(format!("tokio runtime: {e}")))?;
    let (mut ours_lat, mut peer_lat) = tokio_rt.block_on(actors(args.round_trips))?;
    let ours = Percentiles::of(&mut ours_lat);
    let peer = Percentiles::of(&mut peer_lat);
    rows.push(Row {
        what: "CPU actor call round trip p50 (lower is better)".into(),
        ours: stats::ns(ours.p50),
        peer: stats::ns(peer.p50),
        ratio: ours.p50 as f64 / peer.p50.max(1) as f64,
        peer_name: "tokio mpsc+oneshot",
    });
    rows.push(Row {
        what: "CPU actor call round trip p99 (lower is better)".into(),
        ours: stats::ns(ours.p99),
        peer: stats::ns(peer.p99),
        ratio: ours.p99 as f64 / peer.p99.max(1) as f64,
        peer_name: "tokio mpsc+oneshot",
    });

    println!();
    let mut t = Table::new(&["ratio (ours/peer)", "what", "ours", "peer", "peer is"])
        .left(1)
        .left(4);
    for r in rows {
        t.row(vec![
            format!("{:.2}", r.ratio),
            r.what,
            r.ours,
            r.peer,
            r.peer_name.to_string(),
        ]);
    }
    println!("{}", t.render());
    if let Some(l) = stats::load_average() {
        println!("load avg after the run: {l}");
    }
    Ok(())
}

/// Items per second through our SPSC ring; checks every item arrives in order.
fn spsc_ours(n: u64) -> Result<f64> {
    let (mut tx, mut rx) = spsc::channel::<u64>(4096)?;
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        for i in 0..n {
            let mut v = i;
            while let Err(back) = tx.push(v) {
                v = back;
                std::hint::spin_loop();
            }
        }
    });
    let mut expect = 0u64;
    while expect < n {
        match rx.pop() {
            Some(v) => {
                if v != expect {
                    return Err(Error::Device(format!(
                        "SPSC queue returned {v}, expected {expect}"
                    )));
                }
                expect += 1;
            }
            None => std::hint::spin_loop(),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    producer
        .join()
        .map_err(|_| Error::Device("SPSC producer thread panicked".into()))?;
    Ok(n as f64 / secs)
}

/// Items per second through `rtrb`, same shape as [`spsc_ours`].
fn spsc_rtrb(n: u64) -> f64 {
    let (mut tx, mut rx) = rtrb::RingBuffer::<u64>::new(4096);
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        for i in 0..n {
            while tx.push(i).is_err() {
                std::hint::spin_loop();
            }
        }
    });
    let mut got = 0u64;
    while got < n {
        match rx.pop() {
            Ok(v) => {
                black_box(v);
                got += 1;
            }
            Err(_) => std::hint::spin_loop(),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = producer.join();
    n as f64 / secs
}

fn hlc_ours(n: u64) -> f64 {
    let clock = HlcClock::new(1);
    let start = Instant::now();
    let mut last = clock.tick();
    for _ in 0..n {
        let t = clock.tick();
        debug_assert!(t > last);
        last = black_box(t);
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn hlc_uhlc(n: u64) -> f64 {
    let clock = uhlc::HLC::default();
    let start = Instant::now();
    for _ in 0..n {
        black_box(clock.new_timestamp());
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

type EchoRequest = (Token, tokio::sync::oneshot::Sender<Token>);

/// One round trip through the tokio peer: an echo task behind an mpsc channel,
/// replying on a oneshot.
async fn tokio_call(tx: &tokio::sync::mpsc::Sender<EchoRequest>, t: Token) -> Result<Token> {
    let (otx, orx) = tokio::sync::oneshot::channel();
    tx.send((t, otx))
        .await
        .map_err(|_| Error::Device("tokio echo task ended".into()))?;
    orx.await
        .map_err(|_| Error::Device("tokio echo task dropped a reply".into()))
}

/// Round-trip latencies of `call` on a CPU `rk.echo` kernel and of the tokio peer,
/// measured in alternating blocks so both see the same machine load.
async fn actors(n: u64) -> Result<(Vec<u64>, Vec<u64>)> {
    let rt = RingKernel::builder().backend(Backend::Cpu).build().await?;
    let k = rt.launch(builtin::ECHO, LaunchOptions::default()).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<EchoRequest>(1024);
    let echo = tokio::spawn(async move {
        while let Some((mut t, reply)) = rx.recv().await {
            t.value *= 2.0;
            t.hops += 1;
            let _ = reply.send(t);
        }
    });
    let timeout = Duration::from_secs(10);
    for i in 0..1000 {
        let _: Token = k.call(Token::new(i, 1.0), timeout).await?;
        tokio_call(&tx, Token::new(i, 1.0)).await?;
    }
    let (mut ours, mut peer) = (
        Vec::with_capacity(n as usize),
        Vec::with_capacity(n as usize),
    );
    let blocks = 10u64;
    for b in 0..blocks {
        let ids = b * n / blocks..(b + 1) * n / blocks;
        for i in ids.clone() {
            let t0 = Instant::now();
            let r: Token = k.call(Token::new(i, i as f64), timeout).await?;
            ours.push(t0.elapsed().as_nanos() as u64);
            if r.id != i || r.value != 2.0 * i as f64 {
                return Err(Error::Device(format!(
                    "echo returned id {} value {} for {i}",
                    r.id, r.value
                )));
            }
        }
        for i in ids {
            let t0 = Instant::now();
            let r = tokio_call(&tx, Token::new(i, i as f64)).await?;
            peer.push(t0.elapsed().as_nanos() as u64);
            if r.id != i || r.value != 2.0 * i as f64 {
                return Err(Error::Device(format!(
                    "tokio echo returned id {} for {i}",
                    r.id
                )));
            }
        }
    }
    drop(tx);
    let _ = echo.await;
    rt.shutdown().await?;
    Ok((ours, peer))
}

/// Today's date (UTC) as YYYY-MM-DD.
pub fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
