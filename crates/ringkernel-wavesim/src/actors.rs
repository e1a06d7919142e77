//! Tiles as actors: every tile of a [`TiledWave2D`] is a kernel of the CPU runtime that
//! owns its fields, sends its border cells to its neighbours through K2K after each step
//! and steps again once its neighbours' borders for that step have arrived. No barrier:
//! a tile waits only for its own neighbours, so tiles drift up to a step apart.
//!
//! What goes from which tile to which is core's halo plan
//! ([`HaloExchangeConfig::plan`](ringkernel_core::halo::HaloExchangeConfig::plan), built
//! on core's 2-D routing table): a sender packs the plan's runs from it to a neighbour
//! into one message, and the neighbour unpacks them into the same runs' halo cells.

use crate::kernel::{rows_2d, Coeffs};
use crate::tiled::{TileCoeffs, TiledWave2D};
use crate::WaveGrid2D;
use ringkernel::prelude::*;
use ringkernel_core::halo::HaloRun;
use ringkernel_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A message to a tile actor: `kind` 0 is "run `level` more steps" from the host, 1 a
/// halo: tile `from`'s border cells at time level `level`, packed in plan order.
#[derive(RingMessage)]
#[message(type_id = 0x5753_0001)]
struct TileMsg {
    kind: u32,
    level: u64,
    from: u32,
    data: Vec<f32>,
}

/// A tile's report to the host: it reached time level `level`.
#[derive(Clone, Copy, Debug, RingMessage)]
#[message(type_id = 0x5753_0002)]
#[repr(C)]
struct TileDone {
    level: u64,
    tile: u32,
    _pad: u32,
}

/// One tile actor's state.
struct TileState {
    index: u32,
    tx: usize,
    ty: usize,
    prev: Vec<f32>,
    cur: Vec<f32>,
    coeffs: TileCoeffs,
    c2u: f32,
    level: u64,
    target: u64,
    /// Whether the host has been told that `target` was reached (true before the first
    /// order: halos can arrive before it).
    reported: bool,
    /// Runs this tile sends, per neighbour (kernel id, runs).
    out: Vec<(KernelId, Vec<HaloRun>)>,
    /// Runs this tile receives, per sending tile.
    inbound: HashMap<u32, Vec<HaloRun>>,
    /// Halos that arrived, by (level, sender).
    pending: HashMap<(u64, u32), Vec<f32>>,
}

impl TileState {
    fn send_halos(&self, ctx: &mut KernelContext<'_>) -> Result<()> {
        for (dest, runs) in &self.out {
            let mut data = Vec::with_capacity(runs.iter().map(|r| r.len as usize).sum());
            for r in runs {
                let s = r.src_offset as usize;
                data.extend_from_slice(&self.cur[s..s + r.len as usize]);
            }
            let msg = TileMsg {
                kind: 1,
                level: self.level,
                from: self.index,
                data,
            };
            match ctx.send_to(*dest, &msg)? {
                K2kReceipt::Delivered => {}
                other => {
                    return Err(Error::Device(format!(
                        "tile {}: halo to kernel {dest} not delivered ({other:?})",
                        self.index
                    )))
                }
            }
        }
        Ok(())
    }

    /// Steps while every halo of the current level is there; `Some` when the target
    /// level is reached.
    fn advance(&mut self, ctx: &mut KernelContext<'_>) -> Result<Option<TileDone>> {
        while self.level < self.target {
            let ready = self
                .inbound
                .keys()
                .all(|&n| self.pending.contains_key(&(self.level, n)));
            if !ready {
                return Ok(None);
            }
            for (&n, runs) in &self.inbound {
                let data = self.pending.remove(&(self.level, n)).unwrap_or_default();
                let mut at = 0usize;
                for r in runs {
                    let (d, len) = (r.dst_offset as usize, r.len as usize);
                    let src = data.get(at..at + len).ok_or_else(|| {
                        Error::invalid(format!("tile {}: short halo from tile {n}", self.index))
                    })?;
                    self.cur[d..d + len].copy_from_slice(src);
                    at += len;
                }
            }
            let ts = self.tx + 2;
            let k = Coeffs {
                c2: &self.coeffs.c2,
                a: &self.coeffs.a,
                b: &self.coeffs.b,
                uniform: &self.coeffs.uniform,
                c2u: self.c2u,
            };
            rows_2d(
                &mut self.prev[ts..ts * (self.ty + 1)],
                1,
                &self.cur,
                &k,
                ts,
                self.tx,
            );
            std::mem::swap(&mut self.prev, &mut self.cur);
            self.level += 1;
            if self.level < self.target {
                self.send_halos(ctx)?;
            }
        }
        if self.reported {
            return Ok(None);
        }
        self.reported = true;
        Ok(Some(TileDone {
            level: self.level,
            tile: self.index,
            _pad: 0,
        }))
    }

    fn handle(&mut self, ctx: &mut KernelContext<'_>, m: TileMsg) -> Result<Option<TileDone>> {
        match m.kind {
            0 => {
                self.target = self.level + m.level;
                self.reported = false;
                if m.level > 0 {
                    self.send_halos(ctx)?;
                }
                self.advance(ctx)
            }
            1 => {
                if m.level < self.level || !self.inbound.contains_key(&m.from) {
                    return Err(Error::invalid(format!(
                        "tile {}: unexpected halo from tile {} for level {}",
                        self.index, m.from, m.level
                    )));
                }
                self.pending.insert((m.level, m.from), m.data);
                self.advance(ctx)
            }
            k => Err(Error::invalid(format!("tile message kind {k}"))),
        }
    }
}

/// Runs `steps` steps of `grid` split into `tiles_x × tiles_y` tile actors on the CPU
/// runtime (one kernel per tile, halos through K2K, no barrier), and returns the field
/// (row-major `nx × ny`) — the same bits as `grid.run(steps)`.
///
/// ```
/// use ringkernel_wavesim::{run_tile_actors, WaveGrid2D, WaveParams};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let mut g = WaveGrid2D::new(48, 32, WaveParams::default())?;
/// g.add_gaussian(24.0, 16.0, 2.0, 1.0);
/// let field = run_tile_actors(&g, 3, 2, 40).await?;
/// g.run(40);
/// assert_eq!(field, g.field());
/// # Ok::<(), ringkernel_core::Error>(())
/// # }).unwrap();
/// ```
///
/// Errors: [`Error::InvalidArgument`] for tile counts that do not divide the grid or a
/// grid with sources (tile actors run fields and materials); [`Error::Timeout`] when a
/// tile does not finish within a minute; the runtime's errors.
pub async fn run_tile_actors(
    grid: &WaveGrid2D,
    tiles_x: usize,
    tiles_y: usize,
    steps: u64,
) -> Result<Vec<f32>> {
    if !grid.sources().is_empty() {
        return Err(Error::invalid(
            "tile actors run fields and materials; remove the sources",
        ));
    }
    let tiled = TiledWave2D::from_grid(grid, tiles_x, tiles_y)?;
    let config = tiled.config;
    let plan = config.plan()?;
    let [tx, ty, _] = config.tile().map(|v| v as usize);
    let n = config.tile_count();
    // The largest message: the longest face, plus the archive's own bytes.
    let face = tx.max(ty) * 4 + 256;
    let slot = face.next_power_of_two().max(512);
    let states: Vec<Arc<Mutex<Option<TileState>>>> =
        (0..n).map(|_| Arc::new(Mutex::new(None))).collect();
    let mut builder = RingKernel::builder().backend(Backend::Cpu);
    // The builder starts from a fresh registry: these names are this runtime's own.
    let tag = "wavesim-tile";
    for (i, st) in states.iter().enumerate() {
        let st = st.clone();
        builder = builder.register_fn(
            format!("{tag}-{i}"),
            move |ctx: &mut KernelContext<'_>, m: TileMsg| -> Result<Option<TileDone>> {
                let mut guard = st
                    .lock()
                    .map_err(|_| Error::Device("tile state poisoned".into()))?;
                let s = guard
                    .as_mut()
                    .ok_or_else(|| Error::invalid("tile not set up"))?;
                s.handle(ctx, m)
            },
        );
    }
    let rt = builder.build().await?;
    let opts = LaunchOptions::default()
        .with_slot_size(slot)
        .with_queue_capacity(64);
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        handles.push(rt.launch(&format!("{tag}-{i}"), opts.clone()).await?);
    }
    let ids: Vec<KernelId> = handles.iter().map(|h| h.id()).collect();
    let TiledWave2D {
        prev,
        cur,
        coeffs,
        c2u,
        ..
    } = tiled;
    for (i, ((prev, cur), coeffs)) in prev.into_iter().zip(cur).zip(coeffs).enumerate() {
        let mut out: Vec<(KernelId, Vec<HaloRun>)> = Vec::new();
        let mut inbound: HashMap<u32, Vec<HaloRun>> = HashMap::new();
        for r in &plan.runs {
            if r.src_tile as usize == i {
                let dest = ids[r.dst_tile as usize];
                match out.iter_mut().find(|(d, _)| *d == dest) {
                    Some((_, v)) => v.push(*r),
                    None => out.push((dest, vec![*r])),
                }
            }
            if r.dst_tile as usize == i {
                inbound.entry(r.src_tile).or_default().push(*r);
            }
        }
        let state = TileState {
            index: i as u32,
            tx,
            ty,
            prev,
            cur,
            coeffs,
            c2u,
            level: 0,
            target: 0,
            reported: true,
            out,
            inbound,
            pending: HashMap::new(),
        };
        *states[i]
            .lock()
            .map_err(|_| Error::Device("tile state poisoned".into()))? = Some(state);
    }
    for h in &handles {
        h.send(TileMsg {
            kind: 0,
            level: steps,
            from: u32::MAX,
            data: Vec::new(),
        })
        .await?;
    }
    for h in &handles {
        let done: TileDone = h.receive_timeout_as(Duration::from_secs(60)).await?;
        if done.level != steps {
            return Err(Error::Device(format!(
                "tile {} stopped at level {}",
                done.tile, done.level
            )));
        }
    }
    rt.shutdown().await?;
    // Put the tiles back together.
    let mut whole = TiledWave2D::from_grid(grid, tiles_x, tiles_y)?;
    for (i, st) in states.iter().enumerate() {
        let s = st
            .lock()
            .map_err(|_| Error::Device("tile state poisoned".into()))?
            .take()
            .ok_or_else(|| Error::Device(format!("tile {i} state missing")))?;
        whole.cur[i] = s.cur;
    }
    Ok(whole.field())
}
