//! Helpers shared by the integration tests.

use std::time::{Duration, Instant};

/// How long a test waits for anything that should happen.
pub const WAIT: Duration = Duration::from_secs(20);

/// A TCP port the OS just handed out on 127.0.0.1 (bound, read back, released), so
/// parallel tests don't pick the same one.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Polls `f` until it holds, failing the test after [`WAIT`].
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
