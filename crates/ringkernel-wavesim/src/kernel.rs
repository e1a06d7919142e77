//! The CPU inner loops: one row (2-D) or line (3-D) of the update at a time, written so
//! that the compiler vectorises them (equal-length slices, no bounds checks in the loop),
//! and compiled twice on x86-64 (baseline SSE2 and AVX2, picked at run time).
//!
//! The update of a cell with neighbours summing to `s` and `n` neighbours:
//! `u⁺ = a·(2u + c²·(s − n·u)) − b·u⁻`; a medium cell has `a = b = 1`, which the
//! uniform rows use without loading the coefficients (the result is the same bits:
//! multiplying by 1 is exact).

/// Coefficient arrays (padded like the field) and the per-row "uniform medium" flags.
#[derive(Clone, Copy)]
pub(crate) struct Coeffs<'a> {
    pub c2: &'a [f32],
    pub a: &'a [f32],
    pub b: &'a [f32],
    /// `uniform[r]`: every interior cell of padded row/line `r` is the default medium.
    pub uniform: &'a [bool],
    /// The default medium's `c²`.
    pub c2u: f32,
}

/// Updates `out` (the interior of a row of the older field, overwritten with the newer
/// one) from the current field's rows `up`, `mid`, `down` (padded: `mid[i + 1]` is the
/// cell of `out[i]`).
#[inline(always)]
fn row_uniform(out: &mut [f32], up: &[f32], mid: &[f32], down: &[f32], c2: f32) {
    let n = out.len();
    let (l, c, r) = (&mid[..n], &mid[1..n + 1], &mid[2..n + 2]);
    let (u, d) = (&up[1..n + 1], &down[1..n + 1]);
    for i in 0..n {
        let lap = l[i] + r[i] + u[i] + d[i] - 4.0 * c[i];
        out[i] = (2.0 * c[i] + c2 * lap) - out[i];
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn row_material(
    out: &mut [f32],
    up: &[f32],
    mid: &[f32],
    down: &[f32],
    c2: &[f32],
    a: &[f32],
    b: &[f32],
) {
    let n = out.len();
    let (l, c, r) = (&mid[..n], &mid[1..n + 1], &mid[2..n + 2]);
    let (u, d) = (&up[1..n + 1], &down[1..n + 1]);
    let (c2, a, b) = (&c2[1..n + 1], &a[1..n + 1], &b[1..n + 1]);
    for i in 0..n {
        let lap = l[i] + r[i] + u[i] + d[i] - 4.0 * c[i];
        out[i] = a[i] * (2.0 * c[i] + c2[i] * lap) - b[i] * out[i];
    }
}

/// Updates the padded rows `out` (whole rows of `stride` floats, the first being padded
/// row `y0`) of a 2-D field with `nx` interior columns.
#[inline(always)]
fn rows_2d_generic(
    out: &mut [f32],
    y0: usize,
    cur: &[f32],
    k: &Coeffs<'_>,
    stride: usize,
    nx: usize,
) {
    for (ri, row) in out.chunks_exact_mut(stride).enumerate() {
        let y = y0 + ri;
        let base = y * stride;
        let up = &cur[base - stride..base];
        let mid = &cur[base..base + stride];
        let down = &cur[base + stride..base + 2 * stride];
        let o = &mut row[1..nx + 1];
        if k.uniform[y] {
            row_uniform(o, up, mid, down, k.c2u);
        } else {
            let s = base..base + stride;
            row_material(o, up, mid, down, &k.c2[s.clone()], &k.a[s.clone()], &k.b[s]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn rows_2d_avx2(out: &mut [f32], y0: usize, cur: &[f32], k: &Coeffs<'_>, stride: usize, nx: usize) {
    rows_2d_generic(out, y0, cur, k, stride, nx)
}

/// Whether this CPU has AVX2 (checked once).
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`rows_2d_generic`] in its fastest build for this CPU.
pub(crate) fn rows_2d(
    out: &mut [f32],
    y0: usize,
    cur: &[f32],
    k: &Coeffs<'_>,
    stride: usize,
    nx: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: `has_avx2` checked at run time that the CPU supports AVX2, the only
        // requirement of this function beyond its (safe) body.
        unsafe { rows_2d_avx2(out, y0, cur, k, stride, nx) };
        return;
    }
    rows_2d_generic(out, y0, cur, k, stride, nx)
}

/// One row of the update on padded row `y`: `out` (the row of the older field, padded)
/// becomes the newer one from the current field's rows `up`, `mid`, `down`.
#[inline(always)]
fn row_2d(out: &mut [f32], up: &[f32], mid: &[f32], down: &[f32], k: &Coeffs<'_>, y: usize) {
    let (stride, nx) = (mid.len(), mid.len() - 2);
    let o = &mut out[1..nx + 1];
    if k.uniform[y] {
        row_uniform(o, up, mid, down, k.c2u);
    } else {
        let s = y * stride..(y + 1) * stride;
        row_material(o, up, mid, down, &k.c2[s.clone()], &k.a[s.clone()], &k.b[s]);
    }
}

/// A band of padded rows `y0..y0 + rows` for [`band_sweep`]: its rows of both fields
/// and copies of the current field's rows just above and below it.
pub(crate) struct Band<'a> {
    pub y0: usize,
    pub prev: &'a mut [f32],
    pub cur: &'a mut [f32],
    pub above: Vec<f32>,
    pub below: Vec<f32>,
}

/// `depth` steps (even) of a band in one sweep (temporal blocking), in place in the two
/// fields: step `k` writes the field that held step `k − 2` (`prev` for odd `k`, `cur`
/// for even), from step `k − 1`'s rows in the other. The sweep is a wavefront: at
/// position `i` step 1 does row `i`, step 2 row `i − 1`, …, so every row is loaded once
/// for all the steps while it is in the L1 cache. Only step 1 reads outside the band
/// (`above`, `below`); step `k` does the band's rows `k − 1` from each end inward, and
/// [`edge_sweep`] the rest once every band is done.
#[inline(always)]
fn band_sweep_generic(b: &mut Band<'_>, k: &Coeffs<'_>, depth: usize) {
    let s = b.above.len();
    let h = b.prev.len() / s;
    for i in 0..h + depth - 1 {
        for step in 1..=depth {
            let Some(r) = i.checked_sub(step - 1) else {
                break;
            };
            if r + 1 < step || r + step > h {
                continue;
            }
            let (out, src) = if step % 2 == 1 {
                (&mut *b.prev, &*b.cur)
            } else {
                (&mut *b.cur, &*b.prev)
            };
            let up = if r == 0 {
                &b.above[..]
            } else {
                &src[(r - 1) * s..r * s]
            };
            let down = if r + 1 == h {
                &b.below[..]
            } else {
                &src[(r + 1) * s..(r + 2) * s]
            };
            let mid = &src[r * s..(r + 1) * s];
            row_2d(&mut out[r * s..(r + 1) * s], up, mid, down, k, b.y0 + r);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn band_sweep_avx2(b: &mut Band<'_>, k: &Coeffs<'_>, depth: usize) {
    band_sweep_generic(b, k, depth)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn band_sweep_avx512(b: &mut Band<'_>, k: &Coeffs<'_>, depth: usize) {
    band_sweep_generic(b, k, depth)
}

/// Whether this CPU has AVX-512F (checked once).
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`band_sweep_generic`] in its fastest build for this CPU.
pub(crate) fn band_sweep(b: &mut Band<'_>, k: &Coeffs<'_>, depth: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: `has_avx512` checked at run time that the CPU supports AVX-512F,
            // the only requirement of this function beyond its (safe) body.
            unsafe { band_sweep_avx512(b, k, depth) };
            return;
        }
        if has_avx2() {
            // SAFETY: as above, for AVX2.
            unsafe { band_sweep_avx2(b, k, depth) };
            return;
        }
    }
    band_sweep_generic(b, k, depth)
}

/// What [`band_sweep`] left out, after it ran on every band: around each band edge `e`
/// (a band's first padded row; `ny + 1` for the bottom), step `k` of the rows
/// `e − k + 1 ..= e + k − 2` (within the grid), steps in order.
pub(crate) fn edge_sweep(
    prev: &mut [f32],
    cur: &mut [f32],
    k: &Coeffs<'_>,
    (stride, ny): (usize, usize),
    edges: &[usize],
    depth: usize,
) {
    for &e in edges {
        for step in 2..=depth {
            let (out, src) = if step % 2 == 1 {
                (&mut *prev, &*cur)
            } else {
                (&mut *cur, &*prev)
            };
            for y in (e + 1).saturating_sub(step).max(1)..=(e + step - 2).min(ny) {
                let p = &src[(y - 1) * stride..(y + 2) * stride];
                let o = &mut out[y * stride..(y + 1) * stride];
                row_2d(
                    o,
                    &p[..stride],
                    &p[stride..2 * stride],
                    &p[2 * stride..],
                    k,
                    y,
                );
            }
        }
    }
}

/// Updates the padded z-planes `out` (whole planes of `plane` floats, the first being
/// padded plane `z0`) of a 3-D field of `nx × ny` interior cells per plane; `uniform` is
/// indexed by padded line `z * (ny + 2) + y`.
pub(crate) fn planes_3d(
    out: &mut [f32],
    z0: usize,
    cur: &[f32],
    k: &Coeffs<'_>,
    nx: usize,
    ny: usize,
) {
    let sy = nx + 2;
    let plane = sy * (ny + 2);
    for (pi, pl) in out.chunks_exact_mut(plane).enumerate() {
        let z = z0 + pi;
        for y in 1..=ny {
            let base = z * plane + y * sy;
            let n = nx;
            let o = &mut pl[y * sy + 1..y * sy + 1 + n];
            let (l, c, r) = (
                &cur[base..base + n],
                &cur[base + 1..base + 1 + n],
                &cur[base + 2..base + 2 + n],
            );
            let (no, so) = (
                &cur[base - sy + 1..base - sy + 1 + n],
                &cur[base + sy + 1..base + sy + 1 + n],
            );
            let (dn, upp) = (
                &cur[base - plane + 1..base - plane + 1 + n],
                &cur[base + plane + 1..base + plane + 1 + n],
            );
            let s = base + 1..base + 1 + n;
            let (c2, a, b) = (&k.c2[s.clone()], &k.a[s.clone()], &k.b[s]);
            if k.uniform[z * (ny + 2) + y] {
                let c2u = k.c2u;
                for i in 0..n {
                    let lap = l[i] + r[i] + no[i] + so[i] + dn[i] + upp[i] - 6.0 * c[i];
                    o[i] = (2.0 * c[i] + c2u * lap) - o[i];
                }
            } else {
                for i in 0..n {
                    let lap = l[i] + r[i] + no[i] + so[i] + dn[i] + upp[i] - 6.0 * c[i];
                    o[i] = a[i] * (2.0 * c[i] + c2[i] * lap) - b[i] * o[i];
                }
            }
        }
    }
}
