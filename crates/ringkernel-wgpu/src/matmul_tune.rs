//! Which tile shape of the register-tiled matmul ([`MatmulTile`]) a [`WgpuCompute`](crate::WgpuCompute) uses.
//!
//! * `RINGKERNEL_WGPU_MATMUL_TILE=BMxBNxBK/TMxTN` forces one shape (also
//!   [`WgpuCompute::set_matmul_tile`](crate::WgpuCompute::set_matmul_tile)).
//! * Small products (fewer than [`TUNE_MIN_WORK`] multiply-adds) take
//!   [`MatmulTile::LARGE`] when it gives at least [`LARGE_MIN_TILES`] workgroups and
//!   [`MatmulTile::SMALL`] otherwise.
//! * The first large product on a device times every candidate shape
//!   ([`MatmulTile::CANDIDATES`] that fit the device's workgroup memory) once on
//!   buffers of its own size and keeps the fastest, in memory and in a small text file
//!   keyed by the adapter's name, backend and driver (`wgpu-matmul-tiles.txt` under
//!   `RINGKERNEL_CACHE_DIR`, else `$XDG_CACHE_HOME/ringkernel`, else
//!   `$HOME/.cache/ringkernel`), so later processes skip the timing.
//! * `RINGKERNEL_WGPU_AUTOTUNE=0` (or `off`, `false`) turns the timing and the file off:
//!   large products then take [`MatmulTile::LARGE`], as they do on a software adapter
//!   (lavapipe), where timing would cost seconds of the host's cores.
//!
//! ```no_run
//! use ringkernel_core::compute::MatmulDims;
//! use ringkernel_wgpu::{MatmulTile, WgpuCompute};
//! let gpu = WgpuCompute::new().unwrap();
//! let dims = MatmulDims { batch: 1, m: 2048, k: 2048, n: 2048, b_batched: false };
//! // Every candidate's time on this device, fastest first (what the tuner compares).
//! for (tile, t) in gpu.time_matmul_tiles(dims).unwrap() {
//!     println!("{tile}: {t:?}");
//! }
//! println!("chosen: {}", gpu.matmul_tile_for(dims).unwrap());
//! gpu.set_matmul_tile(Some(MatmulTile::LARGE)).unwrap(); // force one from now on
//! ```

use ringkernel_core::compute::MatmulDims;
use ringkernel_core::{Error, Result};
use ringkernel_shaders::MatmulTile;
use std::path::PathBuf;

/// Environment variable that forces a tile shape (`BMxBNxBK/TMxTN`).
pub const TILE_ENV: &str = "RINGKERNEL_WGPU_MATMUL_TILE";
/// Environment variable that turns autotuning off (`0`, `off`, `false`).
pub const AUTOTUNE_ENV: &str = "RINGKERNEL_WGPU_AUTOTUNE";
/// Environment variable naming the directory of the tuning cache file.
pub const CACHE_DIR_ENV: &str = "RINGKERNEL_CACHE_DIR";
/// Name of the tuning cache file.
pub const CACHE_FILE: &str = "wgpu-matmul-tiles.txt";
/// Products of at least this many multiply-adds (`batch·m·n·k`) use the tuned shape.
pub const TUNE_MIN_WORK: u128 = 512 * 512 * 512;
/// Below [`TUNE_MIN_WORK`], [`MatmulTile::LARGE`] is taken when it yields at least this
/// many workgroups, [`MatmulTile::SMALL`] otherwise.
pub const LARGE_MIN_TILES: usize = 128;
/// Timed runs per candidate (after one untimed run that compiles the pipeline).
pub const TUNE_RUNS: usize = 3;

/// The per-device state: a forced shape, and the tuned winner once known.
#[derive(Debug, Default)]
pub(crate) struct TileState {
    pub(crate) forced: Option<MatmulTile>,
    pub(crate) tuned: Option<MatmulTile>,
}

/// Whether the environment turns autotuning off.
pub fn autotune_enabled() -> bool {
    !matches!(
        std::env::var(AUTOTUNE_ENV).as_deref().map(str::trim),
        Ok("0") | Ok("off") | Ok("false") | Ok("no")
    )
}

/// The tile forced by [`TILE_ENV`], if set; a malformed value is an error.
pub fn tile_from_env() -> Result<Option<MatmulTile>> {
    match std::env::var(TILE_ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<MatmulTile>()
            .map(Some)
            .map_err(|e| Error::invalid(format!("{TILE_ENV}: {e}"))),
        _ => Ok(None),
    }
}

/// The shape for a product too small to tune (see the module docs).
pub fn untuned_tile(d: MatmulDims) -> MatmulTile {
    let g = MatmulTile::LARGE.grid(d.m, d.n, d.batch);
    if g[0] * g[1] * g[2] >= LARGE_MIN_TILES {
        MatmulTile::LARGE
    } else {
        MatmulTile::SMALL
    }
}

pub(crate) fn work(d: MatmulDims) -> u128 {
    d.batch as u128 * d.m as u128 * d.n as u128 * d.k as u128
}

/// The cache file's directory from the environment, if any.
pub fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env(CACHE_DIR_ENV)
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("ringkernel")))
        .or_else(|| env("HOME").map(|p| p.join(".cache").join("ringkernel")))
}

/// Reads the shape stored for `key` in the cache file at `path` (none if the file or
/// the line is missing or unreadable: the cache only saves time).
pub fn cached_tile(path: &std::path::Path, key: &str) -> Option<MatmulTile> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(k, _)| *k == key)
        .find_map(|(_, t)| t.parse().ok())
}

/// Stores `tile` for `key` in the cache file at `path`, replacing an older line for the
/// key (written to a temporary file and renamed, so readers never see half a file).
pub fn store_tile(path: &std::path::Path, key: &str, tile: MatmulTile) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut text: String = old
        .lines()
        .filter(|l| l.split_once('\t').map(|(k, _)| k) != Some(key))
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str(&format!("{key}\t{tile}\n"));
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
