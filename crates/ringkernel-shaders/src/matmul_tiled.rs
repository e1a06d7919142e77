//! The register-tiled matmul ([`Kernel::MatmulTiled`](crate::Kernel::MatmulTiled)),
//! generated per tile shape.
//!
//! Each 256-thread workgroup computes a `bm × bn` output tile; each thread a `tm × tn`
//! block of it held in `vec4<f32>` registers. A and B tiles of depth `bk` are staged in
//! workgroup memory (A transposed), double-buffered: while a tile is multiplied the next
//! one is loaded from global memory into registers and stored to the other half, so one
//! barrier per tile suffices. Workgroup memory is read as `vec4`s.
//!
//! The WGSL is generated with every register named and every loop over registers
//! unrolled: a driver that cannot promote a dynamically indexed private array to
//! registers (NVIDIA's Vulkan compiler did not for the 64×64 kernel's predecessor)
//! would otherwise put the accumulators in local memory.
//!
//! Two flags choose 16-byte global accesses: `vec_a` (A read as `array<vec4<f32>>`;
//! needs `k % 4 == 0`) and `vec_b` (B read and out written as `array<vec4<f32>>`; needs
//! `n % 4 == 0`). Without them the loads and stores are scalar with a bounds check per
//! element, so any `m`, `n`, `k` (including 1) is correct.
//!
//! A [`MatmulTile`] plus its flags travel in a [`Specialization`] (keys `BM`, `BN`, `BK`,
//! `TM`, `TN`, `VA`, `VB`) so the pipeline caches of both backends key on them; the keys
//! are generation parameters, not WGSL `override`s.
//!
//! ```
//! use ringkernel_shaders::{to_msl, Kernel, MatmulTile};
//! let tile: MatmulTile = "128x128x8/8x8".parse().unwrap();
//! assert_eq!(tile, MatmulTile::LARGE);
//! assert_eq!(tile.grid(1000, 300, 2), [3, 8, 2]);
//! let spec = tile.spec(true, false); // 16-byte loads of A, scalar B and out
//! let msl = to_msl(Kernel::MatmulTiled, &spec).unwrap();
//! assert_eq!(msl.workgroup_size, [256, 1, 1]);
//! assert!(tile.wgsl(true, false).unwrap().contains("fn matmul_tiled"));
//! ```

use crate::Specialization;
use ringkernel_core::{Error, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Threads per workgroup of every tile shape.
pub const TILED_THREADS: u32 = 256;

/// One tile shape of the register-tiled matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MatmulTile {
    /// Output rows per workgroup.
    pub bm: u32,
    /// Output columns per workgroup.
    pub bn: u32,
    /// Depth (`k`) of the tiles staged in workgroup memory.
    pub bk: u32,
    /// Output rows per thread (a multiple of 4).
    pub tm: u32,
    /// Output columns per thread (a multiple of 4).
    pub tn: u32,
}

impl std::fmt::Display for MatmulTile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}x{}/{}x{}",
            self.bm, self.bn, self.bk, self.tm, self.tn
        )
    }
}

impl std::str::FromStr for MatmulTile {
    type Err = Error;

    /// Parses the [`Display`](std::fmt::Display) form `BMxBNxBK/TMxTN` and checks it.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::invalid(format!("matmul tile {s:?}: expected BMxBNxBK/TMxTN"));
        let (block, micro) = s.split_once('/').ok_or_else(bad)?;
        let nums = |t: &str| -> Result<Vec<u32>> {
            t.split('x')
                .map(|v| v.trim().parse::<u32>().map_err(|_| bad()))
                .collect()
        };
        let (b, m) = (nums(block)?, nums(micro)?);
        if b.len() != 3 || m.len() != 2 {
            return Err(bad());
        }
        let t = MatmulTile {
            bm: b[0],
            bn: b[1],
            bk: b[2],
            tm: m[0],
            tn: m[1],
        };
        t.check()?;
        Ok(t)
    }
}

impl MatmulTile {
    /// 128×128 output tile, depth 8, an 8×8 block per thread: the shape for large
    /// products (16 KiB of workgroup memory, double-buffered).
    pub const LARGE: MatmulTile = MatmulTile {
        bm: 128,
        bn: 128,
        bk: 8,
        tm: 8,
        tn: 8,
    };
    /// 64×64 output tile, depth 16, a 4×4 block per thread: four times the workgroups
    /// of [`LARGE`](Self::LARGE) for the same product, for sizes that would leave a GPU
    /// half idle with 128-wide tiles.
    pub const SMALL: MatmulTile = MatmulTile {
        bm: 64,
        bn: 64,
        bk: 16,
        tm: 4,
        tn: 4,
    };
    /// The shapes the autotuner times (those whose workgroup memory exceeds the
    /// device's limit are skipped: see [`workgroup_bytes`](Self::workgroup_bytes)).
    pub const CANDIDATES: [MatmulTile; 5] = [
        MatmulTile::LARGE,
        MatmulTile {
            bm: 128,
            bn: 128,
            bk: 16,
            tm: 8,
            tn: 8,
        },
        MatmulTile {
            bm: 128,
            bn: 64,
            bk: 16,
            tm: 8,
            tn: 4,
        },
        MatmulTile {
            bm: 64,
            bn: 128,
            bk: 16,
            tm: 4,
            tn: 8,
        },
        MatmulTile::SMALL,
    ];

    /// Whether the shape is one the generator supports: `tm`, `tn` multiples of 4,
    /// `bm/tm · bn/tn` = [`TILED_THREADS`], `bk` a multiple of 4, nothing zero.
    pub fn check(&self) -> Result<()> {
        let ok = self.tm > 0
            && self.tn > 0
            && self.tm.is_multiple_of(4)
            && self.tn.is_multiple_of(4)
            && self.bk > 0
            && self.bk.is_multiple_of(4)
            && self.bk <= 64
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && (self.bm / self.tm) * (self.bn / self.tn) == TILED_THREADS;
        if ok {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "matmul tile {self}: needs tm, tn, bk multiples of 4, bk <= 64 and \
                 (bm/tm)·(bn/tn) = {TILED_THREADS}"
            )))
        }
    }

    /// Workgroup memory the kernel declares (both halves of the double buffer).
    pub fn workgroup_bytes(&self) -> u32 {
        2 * self.bk * (self.bm + self.bn) * 4
    }

    /// Workgroups for an `m × n` output, `batch` deep: `(⌈n/bn⌉, ⌈m/bm⌉, batch)`.
    pub fn grid(&self, m: usize, n: usize, batch: usize) -> [usize; 3] {
        [
            n.div_ceil(self.bn as usize),
            m.div_ceil(self.bm as usize),
            batch,
        ]
    }

    /// The specialisation that selects this shape with the given vector flags.
    pub fn spec(&self, vec_a: bool, vec_b: bool) -> Specialization {
        let mut m = BTreeMap::new();
        m.insert("BM", self.bm);
        m.insert("BN", self.bn);
        m.insert("BK", self.bk);
        m.insert("TM", self.tm);
        m.insert("TN", self.tn);
        m.insert("VA", vec_a as u32);
        m.insert("VB", vec_b as u32);
        Specialization(m)
    }

    /// The shape and flags of a specialisation made by [`spec`](Self::spec); an
    /// empty one means [`LARGE`](Self::LARGE) with scalar accesses.
    pub fn from_spec(spec: &Specialization) -> Result<(MatmulTile, bool, bool)> {
        if spec.0.is_empty() {
            return Ok((MatmulTile::LARGE, false, false));
        }
        let get = |k: &str| {
            spec.0.get(k).copied().ok_or_else(|| {
                Error::invalid(format!("matmul_tiled specialisation lacks {k}: {spec:?}"))
            })
        };
        let t = MatmulTile {
            bm: get("BM")?,
            bn: get("BN")?,
            bk: get("BK")?,
            tm: get("TM")?,
            tn: get("TN")?,
        };
        t.check()?;
        Ok((t, get("VA")? != 0, get("VB")? != 0))
    }

    /// The complete WGSL module (entry point `matmul_tiled`, bindings as
    /// [`Kernel::Matmul`](crate::Kernel::Matmul), parameters [`params::Matmul`](crate::params::Matmul)).
    pub fn wgsl(&self, vec_a: bool, vec_b: bool) -> Result<String> {
        self.check()?;
        Ok(generate_source(*self, vec_a, vec_b))
    }
}

const LANES: [&str; 4] = ["x", "y", "z", "w"];

/// Appends one formatted line to the generated source.
macro_rules! emit {
    ($s:expr, $($arg:tt)*) => {{
        let _ = writeln!($s, $($arg)*);
    }};
}

pub(crate) fn generate_source(t: MatmulTile, vec_a: bool, vec_b: bool) -> String {
    let MatmulTile { bm, bn, bk, tm, tn } = t;
    let threads = TILED_THREADS;
    let (gm, gn) = (tm / 4, tn / 4); // vec4 groups per thread along m and n
    let (stride_m4, stride_n4) = (bm / 4 / gm, bn / 4 / gn); // vec4 distance between groups
    let (a_half, b_half) = (bk * bm / 4, bk * bn / 4); // vec4s per buffer half
    let mut s = String::with_capacity(16 * 1024);
    emit!(s, "// Generated by ringkernel-shaders (matmul_tiled.rs): tile {t}, vec_a={vec_a}, vec_b={vec_b}.");
    emit!(s, "struct MatmulParams {{ m: u32, k: u32, n: u32, batch: u32, a_stride: u32, b_stride: u32, c_stride: u32, _pad: u32, }}");
    emit!(s, "@group(0) @binding(0) var<uniform> p: MatmulParams;");
    let ta = if vec_a { "vec4<f32>" } else { "f32" };
    let tb = if vec_b { "vec4<f32>" } else { "f32" };
    emit!(
        s,
        "@group(0) @binding(1) var<storage, read> a: array<{ta}>;"
    );
    emit!(
        s,
        "@group(0) @binding(2) var<storage, read> b: array<{tb}>;"
    );
    emit!(
        s,
        "@group(0) @binding(3) var<storage, read_write> out: array<{tb}>;"
    );
    emit!(s, "var<workgroup> a_s: array<vec4<f32>, {}>;", 2 * a_half);
    emit!(s, "var<workgroup> b_s: array<vec4<f32>, {}>;", 2 * b_half);

    // Loads of one A tile (bm rows × bk depth) into registers pa*, then stores into a_s.
    // Vector path: element e of the tile's vec4s is row e/(bk/4), depth quad e%(bk/4).
    // Scalar path: element e is row e/bk, depth e%bk.
    let (a_count, a_per_row) = if vec_a {
        (bm * bk / 4, bk / 4)
    } else {
        (bm * bk, bk)
    };
    let (b_count, b_per_row) = if vec_b {
        (bk * bn / 4, bn / 4)
    } else {
        (bk * bn, bn)
    };
    let a_loads = a_count.div_ceil(threads);
    let b_loads = b_count.div_ceil(threads);
    let zero_a = if vec_a { "vec4<f32>(0.0)" } else { "0.0" };
    let zero_b = if vec_b { "vec4<f32>(0.0)" } else { "0.0" };

    emit!(
        s,
        "fn load_a(a_base: u32, row0: u32, k0: u32, lid: u32, l: u32) -> {ta} {{"
    );
    emit!(s, "    let e = lid + {threads}u * l;");
    emit!(s, "    let row = e / {a_per_row}u;");
    emit!(s, "    let kq = e % {a_per_row}u;");
    if vec_a {
        emit!(s, "    let kk = k0 + kq * 4u;");
    } else {
        emit!(s, "    let kk = k0 + kq;");
    }
    emit!(
        s,
        "    if (e < {a_count}u && row0 + row < p.m && kk < p.k) {{"
    );
    if vec_a {
        emit!(
            s,
            "        return a[(a_base + (row0 + row) * p.k + kk) / 4u];"
        );
    } else {
        emit!(s, "        return a[a_base + (row0 + row) * p.k + kk];");
    }
    emit!(s, "    }}");
    emit!(s, "    return {zero_a};");
    emit!(s, "}}");
    emit!(s, "fn store_a(half: u32, lid: u32, l: u32, v: {ta}) {{");
    emit!(s, "    let e = lid + {threads}u * l;");
    emit!(s, "    if (e >= {a_count}u) {{ return; }}");
    emit!(s, "    let row = e / {a_per_row}u;");
    emit!(s, "    let kq = e % {a_per_row}u;");
    emit!(s, "    let q = row / 4u;");
    emit!(s, "    let c = row % 4u;");
    if vec_a {
        for (i, lane) in LANES.iter().enumerate() {
            emit!(
                s,
                "    a_s[half * {a_half}u + (kq * 4u + {i}u) * {}u + q][c] = v.{lane};",
                bm / 4
            );
        }
    } else {
        emit!(
            s,
            "    a_s[half * {a_half}u + kq * {}u + q][c] = v;",
            bm / 4
        );
    }
    emit!(s, "}}");

    emit!(
        s,
        "fn load_b(b_base: u32, col0: u32, k0: u32, lid: u32, l: u32) -> {tb} {{"
    );
    emit!(s, "    let e = lid + {threads}u * l;");
    emit!(s, "    let kr = e / {b_per_row}u;");
    emit!(s, "    let cq = e % {b_per_row}u;");
    if vec_b {
        emit!(s, "    let col = col0 + cq * 4u;");
    } else {
        emit!(s, "    let col = col0 + cq;");
    }
    emit!(
        s,
        "    if (e < {b_count}u && k0 + kr < p.k && col < p.n) {{"
    );
    if vec_b {
        emit!(
            s,
            "        return b[(b_base + (k0 + kr) * p.n + col) / 4u];"
        );
    } else {
        emit!(s, "        return b[b_base + (k0 + kr) * p.n + col];");
    }
    emit!(s, "    }}");
    emit!(s, "    return {zero_b};");
    emit!(s, "}}");
    emit!(s, "fn store_b(half: u32, lid: u32, l: u32, v: {tb}) {{");
    emit!(s, "    let e = lid + {threads}u * l;");
    emit!(s, "    if (e >= {b_count}u) {{ return; }}");
    emit!(s, "    let kr = e / {b_per_row}u;");
    emit!(s, "    let cq = e % {b_per_row}u;");
    if vec_b {
        emit!(s, "    b_s[half * {b_half}u + kr * {}u + cq] = v;", bn / 4);
    } else {
        emit!(
            s,
            "    b_s[half * {b_half}u + kr * {}u + cq / 4u][cq % 4u] = v;",
            bn / 4
        );
    }
    emit!(s, "}}");

    emit!(s, "@compute @workgroup_size({threads})");
    emit!(s, "fn matmul_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{");
    emit!(s, "    let row0 = wg.y * {bm}u;");
    emit!(s, "    let col0 = wg.x * {bn}u;");
    emit!(s, "    let a_base = wg.z * p.a_stride;");
    emit!(s, "    let b_base = wg.z * p.b_stride;");
    emit!(s, "    let c_base = wg.z * p.c_stride;");
    emit!(s, "    let tx = lid % {}u;", bn / tn);
    emit!(s, "    let ty = lid / {}u;", bn / tn);
    for i in 0..tm {
        for j in 0..gn {
            emit!(s, "    var c{i}_{j} = vec4<f32>(0.0);");
        }
    }
    for l in 0..a_loads {
        emit!(s, "    var pa{l} = load_a(a_base, row0, 0u, lid, {l}u);");
        emit!(s, "    store_a(0u, lid, {l}u, pa{l});");
    }
    for l in 0..b_loads {
        emit!(s, "    var pb{l} = load_b(b_base, col0, 0u, lid, {l}u);");
        emit!(s, "    store_b(0u, lid, {l}u, pb{l});");
    }
    emit!(s, "    workgroupBarrier();");
    emit!(s, "    let tiles = (p.k + {}u) / {bk}u;", bk - 1);
    emit!(s, "    for (var t = 0u; t < tiles; t++) {{");
    emit!(s, "        let cur = t % 2u;");
    emit!(s, "        let more = t + 1u < tiles;");
    emit!(s, "        if (more) {{");
    emit!(s, "            let k1 = (t + 1u) * {bk}u;");
    for l in 0..a_loads {
        emit!(
            s,
            "            pa{l} = load_a(a_base, row0, k1, lid, {l}u);"
        );
    }
    for l in 0..b_loads {
        emit!(
            s,
            "            pb{l} = load_b(b_base, col0, k1, lid, {l}u);"
        );
    }
    emit!(s, "        }}");
    emit!(s, "        let ab = cur * {a_half}u + ty;");
    emit!(s, "        let bb = cur * {b_half}u + tx;");
    for kk in 0..bk {
        for g in 0..gm {
            emit!(
                s,
                "        let a{g}_{kk} = a_s[ab + {}u];",
                kk * (bm / 4) + g * stride_m4
            );
        }
        for g in 0..gn {
            emit!(
                s,
                "        let b{g}_{kk} = b_s[bb + {}u];",
                kk * (bn / 4) + g * stride_n4
            );
        }
        for g in 0..gm {
            for (r, lane) in LANES.iter().enumerate() {
                let i = g * 4 + r as u32;
                for j in 0..gn {
                    emit!(
                        s,
                        "        c{i}_{j} = fma(vec4<f32>(a{g}_{kk}.{lane}), b{j}_{kk}, c{i}_{j});"
                    );
                }
            }
        }
    }
    emit!(s, "        if (more) {{");
    emit!(s, "            let nxt = 1u - cur;");
    for l in 0..a_loads {
        emit!(s, "            store_a(nxt, lid, {l}u, pa{l});");
    }
    for l in 0..b_loads {
        emit!(s, "            store_b(nxt, lid, {l}u, pb{l});");
    }
    emit!(s, "        }}");
    emit!(s, "        workgroupBarrier();");
    emit!(s, "    }}");
    // Output: thread rows g*stride_m + ty*4 + r, columns j*stride_n + tx*4 .. +4.
    for g in 0..gm {
        for r in 0..4u32 {
            let i = g * 4 + r;
            emit!(s, "    {{");
            emit!(
                s,
                "        let row = row0 + {}u + ty * 4u;",
                g * stride_m4 * 4 + r
            );
            emit!(s, "        if (row < p.m) {{");
            for j in 0..gn {
                emit!(s, "            {{");
                emit!(
                    s,
                    "                let col = col0 + {}u + tx * 4u;",
                    j * stride_n4 * 4
                );
                if vec_b {
                    emit!(s, "                if (col < p.n) {{ out[(c_base + row * p.n + col) / 4u] = c{i}_{j}; }}");
                } else {
                    for (c, lane) in LANES.iter().enumerate() {
                        emit!(s, "                if (col + {c}u < p.n) {{ out[c_base + row * p.n + col + {c}u] = c{i}_{j}.{lane}; }}");
                    }
                }
                emit!(s, "            }}");
            }
            emit!(s, "        }}");
            emit!(s, "    }}");
        }
    }
    emit!(s, "}}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_checks_and_round_trips_through_text_and_spec() {
        for t in MatmulTile::CANDIDATES {
            t.check().unwrap();
            assert_eq!(t.to_string().parse::<MatmulTile>().unwrap(), t);
            for (va, vb) in [(false, false), (true, false), (false, true), (true, true)] {
                assert_eq!(MatmulTile::from_spec(&t.spec(va, vb)).unwrap(), (t, va, vb));
            }
        }
    }

    #[test]
    fn every_candidate_and_flag_validates_and_translates_to_msl() {
        use crate::{to_msl, validate_kernel, Kernel};
        for t in MatmulTile::CANDIDATES {
            for (va, vb) in [(false, false), (true, false), (false, true), (true, true)] {
                let spec = t.spec(va, vb);
                let v = validate_kernel(Kernel::MatmulTiled, &spec)
                    .unwrap_or_else(|e| panic!("{t} {va} {vb}: {e}"));
                let ep = v
                    .module
                    .entry_points
                    .iter()
                    .find(|e| e.name == "matmul_tiled");
                assert_eq!(ep.unwrap().workgroup_size, [TILED_THREADS, 1, 1]);
                let msl = to_msl(Kernel::MatmulTiled, &spec).unwrap();
                assert_eq!(msl.workgroup_size, [TILED_THREADS, 1, 1]);
                assert_eq!(msl.buffer_bindings.len(), 4);
                // The accumulators are named registers, not an indexed private array.
                let src = t.wgsl(va, vb).unwrap();
                assert!(src.contains(&format!("var c{}_{} =", t.tm - 1, t.tn / 4 - 1)));
                assert!(!src.contains("array<f32, "));
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        for s in [
            "",
            "128x128x8",
            "128x128/8x8",
            "128x128x8/8x6",
            "64x64x8/8x8",
            "axbxc/dxe",
        ] {
            assert!(s.parse::<MatmulTile>().is_err(), "{s}");
        }
        let mut spec = MatmulTile::LARGE.spec(false, false);
        spec.0.remove("BK");
        assert!(MatmulTile::from_spec(&spec).is_err());
    }
}
