//! The kernels the execution tests run: each is a Rust function (the CPU reference) and
//! the same tokens as a `syn::ItemFn` (what is translated), see `twin!`.

#![allow(dead_code)]
// The kernels are written in the translatable subset; several of clippy's rewrites
// (`is_multiple_of`, `partial_cmp`, ...) are outside it.
#![allow(clippy::all)]

/// Defines `mod $m` holding the kernel as a Rust function (with `dsl::*` in scope) and
/// `source()`, the same tokens as a `syn::ItemFn`.
macro_rules! twin {
    ($m:ident => $($t:tt)*) => {
        pub mod $m {
            #[allow(unused_imports)]
            use ringkernel_codegen::dsl::*;
            $($t)*
            pub fn source() -> syn::ItemFn {
                syn::parse_quote! { $($t)* }
            }
        }
    };
}

twin! { saxpy =>
    pub fn saxpy(a: f32, x: &[f32], y: &mut [f32], n: i32) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i < n {
            y[i as usize] = a.mul_add(x[i as usize], y[i as usize]);
        }
    }
}

twin! { branchy =>
    pub fn branchy(x: &[f32], out: &mut [f32], lo: f32, hi: f32, n: i32) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i >= n {
            return;
        }
        let v = x[i as usize];
        let mut r = v.clamp(lo, hi);
        if v < lo {
            r = lo - (lo - v).sqrt();
        } else if v > hi {
            r = hi + (v - hi).min(1.0);
        } else if v.abs() < 0.5 {
            r = 0.0;
        }
        let s = if r > 0.0 { r * 2.0 } else { r.abs().max(0.25) };
        let t = if s > 3.0 && !(v < 0.0) || v.floor() == -2.0 { -s } else { s + 1.0 };
        out[i as usize] = t;
    }
}

twin! { classify =>
    pub fn classify(codes: &[i32], out: &mut [i32], n: i32) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i >= n {
            return;
        }
        let c = codes[i as usize];
        let v = match c {
            0 => 10,
            1 | 2 => {
                let t = c * 3;
                t + 1
            }
            3 => -c,
            -1 => 77,
            _ => c * c,
        };
        let mut w = 0;
        match c & 3 {
            0 => w = 1,
            1 => {
                w = 2;
            }
            _ => {}
        }
        out[i as usize] = v * 4 + w;
    }
}

twin! { loops =>
    pub fn loops(start: &[u32], steps: &mut [u32], n: u32, cap: u32) {
        let i = (block_idx_x() * block_dim_x() + thread_idx_x()) as u32;
        if i >= n {
            return;
        }
        let mut v = start[i as usize];
        let mut k = 0u32;
        loop {
            if v <= 1 {
                break;
            }
            if k >= cap {
                break;
            }
            k += 1;
            if v % 2 == 0 {
                v /= 2;
                continue;
            }
            v = 3 * v + 1;
        }
        let mut odd = 0u32;
        for j in 0..k {
            if j % 3 == 0 {
                continue;
            }
            odd += 1;
            if odd > 50 {
                break;
            }
        }
        let mut w = 0u32;
        while w * w < k {
            w += 1;
        }
        let lim = start[i as usize] % 9;
        let mut m = 0u32;
        loop {
            match (m == lim) as u32 {
                1 => break,
                _ => m += 1,
            }
        }
        let mut stepped = 0u32;
        for s in (1..=k).step_by(4) {
            stepped += s % 5;
        }
        steps[i as usize] = k * 100000 + odd * 1000 + w * 10 + m + stepped % 7 * 100_000_000;
    }
}

twin! { laplace =>
    pub fn laplace(pos: GridPos, p: &[f32], out: &mut [f32], c: f32) {
        let centre = p[pos.idx()];
        let lap = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) - 4.0 * centre;
        let diag = pos.at(p, 1, -1) - pos.at(p, -1, 1);
        out[pos.idx()] = centre + c * lap + 0.125 * diag;
    }
}

twin! { heat3 =>
    pub fn heat3(pos: GridPos3, p: &[f32], out: &mut [f32], c: f32) {
        let centre = p[pos.idx()];
        let sum = pos.north(p) + pos.south(p) + pos.west(p) + pos.east(p) + pos.up(p)
            + pos.down(p);
        out[pos.idx()] = centre + c * (sum - 6.0 * centre) + 0.01 * pos.at(p, 0, 0, -1);
    }
}

twin! { mixed =>
    pub fn mixed(
        x: &[f32],
        bits: &[u32],
        out: &mut [f32],
        iout: &mut [i32],
        n: i32,
        scale: f32,
        flip: bool,
    ) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i >= n {
            return;
        }
        let iu = i as usize;
        let v = x[iu];
        let v = v * scale;
        let mut taps = [0.0f32; 4];
        let w = [0.5f32, 0.25, 0.125, 0.0625];
        for k in 0..4usize {
            taps[k] = w[k] * (v + k as f32).abs().sqrt();
        }
        let mut acc: f32;
        acc = taps[0] + taps[1] + taps[2] + taps[3];
        acc += (v * 0.1).tanh() + (v * 0.05).exp() + (v.abs() + 1.0).ln() + v.sin() * v.cos();
        acc += v.abs().powf(0.5) + v.max(-1.0).min(1.0) + v.floor() + v.ceil() * 0.5;
        acc += v.trunc() + std::f32::consts::PI.recip() + v.mul_add(0.5, 1.0) + v.clamp(-2.0, 2.0);
        acc += v.atan2(1.5) + (v * 0.2).atan() + v.exp2() * 0.01 + (v.abs() + 0.5).log2();
        let b = bits[iu];
        let m = ((b >> 3) & 0xff) ^ (b << 2) | (!b & 7);
        let sh = (b % 13) as i32;
        let q = (sh << 2) - (sh >> 1) + (m % 1000) as i32 - i32::MAX / 1000000;
        let r = if flip { -q } else { q.abs().min(500).max(-500) };
        let mut hist = 0;
        let mut j = 0u32;
        while j < 32 {
            if (b >> j) & 1 == 1 {
                hist += 1;
            }
            j += 1;
        }
        iout[iu] = r.wrapping_mul(3).wrapping_add((v as i32).clamp(-100, 100))
            + (flip as i32)
            + hist * 1000;
        out[iu] = acc;
    }
}

twin! { histogram =>
    pub fn histogram(vals: &[u32], hist: &mut [u32], extremes: &mut [i32], n: u32, bins: u32) {
        let i = (block_idx_x() * block_dim_x() + thread_idx_x()) as u32;
        if i >= n {
            return;
        }
        let v = vals[i as usize];
        atomic_add(&mut hist[(v % bins) as usize], 1);
        atomic_max(&mut extremes[0], v as i32);
        atomic_min(&mut extremes[1], v as i32);
        atomic_or(&mut extremes[2], 1 << (v % 31));
        atomic_sub(&mut extremes[3], 2);
    }
}

twin! { control =>
    pub fn control(a: &[i32], out: &mut [i32], n: i32) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i >= n {
            return;
        }
        let x = a[i as usize];
        // Signed division and remainder truncate toward zero on every target.
        let q = x / 7 + x % 5 - (-x) / 3;
        let mut acc = q;
        // Nested loops; a match with `break` inside the inner one.
        for r in 0..4 {
            let x = r * 2; // shadows the outer `x` in this scope only
            let mut c = 0;
            while c < 10 {
                c += 1;
                if c % 3 == 0 {
                    continue;
                }
                match (c + x) % 6 {
                    5 => break,
                    0 | 1 => acc += c,
                    _ => acc -= 1,
                }
            }
            if acc > 1000 {
                out[i as usize] = -1;
                return;
            }
        }
        let kind = match x.abs() % 4 {
            0 => {
                let t = acc * 2;
                if t > 50 {
                    t - 50
                } else {
                    t
                }
            }
            1 => acc + x,
            2 => {
                while acc <= 40 {
                    acc += 7;
                }
                acc
            }
            _ => -acc,
        };
        let kind = if kind == 0 { 11 } else { kind };
        out[i as usize] = kind + x * 100;
    }
}

twin! { block_reduce =>
    pub fn block_reduce(x: &[f32], sums: &mut [f32], maxes: &mut [f32], n: i32) {
        let mut part = shared_array::<f32, 256>();
        let mut top = shared_array::<f32, 256>();
        let t = thread_idx_x();
        let i = block_idx_x() * block_dim_x() + t;
        let v = if i < n { x[i as usize] } else { 0.0 };
        part[t as usize] = v;
        top[t as usize] = if i < n { v } else { f32::NEG_INFINITY };
        sync_threads();
        let mut s = block_dim_x() / 2;
        while s > 0 {
            if t < s {
                part[t as usize] += part[(t + s) as usize];
                top[t as usize] = top[t as usize].max(top[(t + s) as usize]);
            }
            sync_threads();
            s /= 2;
        }
        if t == 0 {
            sums[block_idx_x() as usize] = part[0];
            maxes[block_idx_x() as usize] = top[0];
        }
    }
}

twin! { tile_transpose =>
    // A 16 x 16 tile through shared memory: 2-D thread indices, a barrier between the
    // writes of one thread and the reads of another.
    pub fn tile_transpose(a: &[u32], out: &mut [u32], w: i32, h: i32) {
        let mut tile = shared_array::<u32, 256>();
        let tx = thread_idx_x();
        let ty = thread_idx_y();
        let x = block_idx_x() * 16 + tx;
        let y = block_idx_y() * 16 + ty;
        if x < w && y < h {
            tile[(ty * 16 + tx) as usize] = a[(y * w + x) as usize];
        }
        sync_threads();
        let ox = block_idx_y() * 16 + tx;
        let oy = block_idx_x() * 16 + ty;
        if ox < h && oy < w {
            out[(oy * h + ox) as usize] = tile[(tx * 16 + ty) as usize];
        }
    }
}

twin! { with_helpers =>
    pub fn with_helpers(x: &[f32], codes: &[i32], out: &mut [f32], n: i32) {
        // Helpers: plain functions at the top of the body (device functions on the GPU).
        fn smooth(v: f32, k: f32) -> f32 {
            let a = v.abs();
            if a < k {
                return 0.5 * v * v / k;
            }
            a - 0.5 * k
        }
        fn weight(code: i32) -> f32 {
            match (code % 4 + 4) % 4 {
                0 => 1.0,
                1 | 2 => 0.25,
                _ => -1.5,
            }
        }
        fn steps(mut v: i32, cap: i32) -> i32 {
            let mut k = 0;
            while v > 1 && k < cap {
                v = if v % 2 == 0 { v / 2 } else { 3 * v + 1 };
                k += 1;
            }
            k
        }
        fn is_big(v: f32) -> bool {
            smooth(v, 1.0) > 2.0
        }
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i >= n {
            return;
        }
        let v = x[i as usize];
        let c = codes[i as usize];
        let mut r = smooth(v, 0.75) * weight(c) + steps(c.abs() + 1, 40) as f32;
        if is_big(v) {
            r = -r;
        }
        out[i as usize] = r;
    }
}

twin! { neighbour_sum =>
    // Threads talk through a storage buffer across a barrier: thread t reads what thread
    // t + 1 wrote, so the WGSL barrier must order storage (storageBarrier).
    pub fn neighbour_sum(x: &[f32], out: &mut [f32], n: i32) {
        let t = thread_idx_x();
        let i = block_idx_x() * block_dim_x() + t;
        if i < n {
            out[i as usize] = x[i as usize] * 2.0;
        }
        sync_threads();
        let j = block_idx_x() * block_dim_x() + (t + 1) % block_dim_x();
        let mut v = 0.0;
        if j < n {
            v = out[j as usize];
        }
        sync_threads();
        if i < n {
            out[i as usize] += v;
        }
    }
}

twin! { row_softmax =>
    // One block per row: every thread reads and writes only its own columns of `y`
    // (`base + t + k * block_dim_x()`), so the barriers order shared memory only.
    pub fn row_softmax(x: &[f32], y: &mut [f32], cols: i32) {
        let mut red = shared_array::<f32, 64>();
        let t = thread_idx_x();
        let base = block_idx_x() * cols;
        let mut m = f32::NEG_INFINITY;
        let mut c = t;
        while c < cols {
            m = m.max(x[(base + c) as usize]);
            c += block_dim_x();
        }
        red[t as usize] = m;
        sync_threads();
        let mut s = block_dim_x() / 2;
        while s > 0 {
            if t < s {
                red[t as usize] = red[t as usize].max(red[(t + s) as usize]);
            }
            sync_threads();
            s /= 2;
        }
        let mx = red[0];
        sync_threads();
        let mut sum = 0.0f32;
        for k in (t..cols).step_by(64) {
            let e = (x[(base + k) as usize] - mx).exp();
            y[(base + k) as usize] = e;
            sum += e;
        }
        red[t as usize] = sum;
        sync_threads();
        s = block_dim_x() / 2;
        while s > 0 {
            if t < s {
                red[t as usize] += red[(t + s) as usize];
            }
            sync_threads();
            s /= 2;
        }
        let inv = 1.0 / red[0];
        c = t;
        while c < cols {
            y[(base + c) as usize] *= inv;
            c += block_dim_x();
        }
    }
}

/// `mod $m` with the structs (`#[repr(C)]`, Pod) and the kernel as Rust, and `source()`:
/// the kernel with the structs at the top of its body, as `#[gpu_kernel]` hands them over.
macro_rules! twin_structs {
    ($m:ident => [$(struct $s:ident { $($f:ident : $t:ty),* $(,)? })*] $($k:tt)*) => {
        pub mod $m {
            #[allow(unused_imports)]
            use ringkernel_codegen::dsl::*;
            $(
                #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
                #[repr(C)]
                pub struct $s { $(pub $f: $t),* }
            )*
            $($k)*
            pub fn source() -> syn::ItemFn {
                let mut f: syn::ItemFn = syn::parse_quote! { $($k)* };
                let items: Vec<syn::Stmt> = vec![$(syn::parse_quote! { struct $s { $($f: $t),* } }),*];
                f.block.stmts.splice(0..0, items);
                f
            }
        }
    };
}

twin_structs! { particles => [
    struct Particle { id: u64, pos: [f32; 3], vel: [f32; 3], mass: f32, hits: u32 }
    struct Params { dt: f32, gravity: f32, floor: f32, n: u32 }
]
    #[allow(clippy::all)]
    pub fn step(ps: &mut [Particle], params: Params, out: &mut [Particle]) {
        let i = block_idx_x() * block_dim_x() + thread_idx_x();
        if i as u32 >= params.n {
            return;
        }
        let mut p = ps[i as usize];
        p.vel[1] -= params.gravity * params.dt;
        for k in 0..3usize {
            p.pos[k] += p.vel[k] * params.dt;
        }
        if p.pos[1] < params.floor {
            p.pos[1] = params.floor;
            p.vel[1] = -p.vel[1] * 0.5;
            p.hits += 1;
        }
        ps[i as usize] = p;
        ps[i as usize].mass = p.mass + 1.0;
        out[i as usize] = Particle { id: p.id, mass: p.mass * 2.0, pos: [p.pos[0], 0.0, p.pos[2]], ..p };
    }
}

/// `n` random particles for `particles::step`.
pub fn random_particles(rng: &mut super::common::Rng, n: usize) -> Vec<particles::Particle> {
    (0..n)
        .map(|i| particles::Particle {
            id: rng.next_u64() ^ (i as u64) << 7,
            pos: [rng.f32(-5.0, 5.0), rng.f32(-1.0, 3.0), rng.f32(-5.0, 5.0)],
            vel: [rng.f32(-2.0, 2.0), rng.f32(-4.0, 4.0), rng.f32(-2.0, 2.0)],
            mass: rng.f32(0.1, 3.0),
            hits: rng.i32(0, 5) as u32,
        })
        .collect()
}
