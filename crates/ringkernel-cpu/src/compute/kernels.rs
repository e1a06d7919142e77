//! Single-threaded inner loops, written so that LLVM vectorises them: fixed-width lane
//! accumulators, `chunks_exact`, iterator zips (no bounds checks), branch-free math.
//!
//! Each public loop is compiled three times on x86-64: for the baseline target, with
//! AVX2 + FMA, and with AVX-512F, the best the CPU has chosen at run time (see
//! `multiversion!`).

use ringkernel_core::compute::{BinaryOp, ReduceOp, UnaryOp};

/// Accumulator lanes: enough independent partial results for two AVX2 registers.
pub(crate) const LANES: usize = 16;

/// What the running x86-64 CPU offers, detected once.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct X86Features {
    avx512: bool,
    avx2: bool,
}

#[cfg(target_arch = "x86_64")]
fn x86_features() -> X86Features {
    use std::sync::OnceLock;
    static F: OnceLock<X86Features> = OnceLock::new();
    *F.get_or_init(|| {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        X86Features {
            avx512: avx2 && std::arch::is_x86_feature_detected!("avx512f"),
            avx2,
        }
    })
}

/// Defines `pub(crate) fn $name(..)` that runs an AVX-512 or AVX2 + FMA build of the
/// body when the CPU has them and the baseline build otherwise.
macro_rules! multiversion {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body<const FMA: bool>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body::<true>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body::<true>($($arg),*)
                }
                let f = x86_features();
                if f.avx512 {
                    // SAFETY: `avx512` only differs from `body` in being compiled with the
                    // AVX-512F, AVX2 and FMA target features, which the CPU was checked to
                    // have.
                    return unsafe { avx512($($arg),*) };
                }
                if f.avx2 {
                    // SAFETY: as above, for AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body::<false>($($arg),*)
        }
    };
}

/// `a·b + c`: one fused instruction in the builds with FMA (`F`), else a multiply and
/// an add (`mul_add` without hardware FMA would be a slow libm call).
#[inline(always)]
fn fmadd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `eˣ` in f32 without a libm call, so that loops over it vectorise. Cody–Waite range
/// reduction `x = n·ln2 + r`, `|r| ≤ ln2/2`, then the Cephes `expf` polynomial; the
/// scale `2ⁿ` is applied in two halves so the result overflows to `+∞` and underflows
/// gradually exactly where `f32::exp` does. Within 2 ULP of the true value for normal
/// results (tested against f64 over the whole range).
#[inline(always)]
pub(crate) fn exp<const F: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer
    let xc = x.clamp(-104.0, 89.0);
    let t = fmadd::<F>(xc, LOG2E, ROUND);
    let n = t - ROUND;
    let r = fmadd::<F>(n, -LN2_LO, fmadd::<F>(n, -LN2_HI, xc));
    let p = 1.987_569_2e-4;
    let p = fmadd::<F>(p, r, 1.398_199_9e-3);
    let p = fmadd::<F>(p, r, 8.333_452e-3);
    let p = fmadd::<F>(p, r, 4.166_579_6e-2);
    let p = fmadd::<F>(p, r, 1.666_666_5e-1);
    let p = fmadd::<F>(p, r, 0.5);
    let y = fmadd::<F>(p, r * r, r + 1.0);
    // the low bits of `t` hold n (|n| ≤ 150)
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f32::from_bits(((n1 + 127) << 23) as u32);
    let s2 = f32::from_bits(((n2 + 127) << 23) as u32);
    y * s1 * s2
}

#[inline(always)]
fn sigmoid<const F: bool>(x: f32) -> f32 {
    1.0 / (1.0 + exp::<F>(-x))
}

#[inline(always)]
fn silu<const F: bool>(x: f32) -> f32 {
    x / (1.0 + exp::<F>(-x))
}

/// GELU (tanh form), using `0.5·(1 + tanh u) = sigmoid(2u)`.
#[inline(always)]
fn gelu<const F: bool>(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // √(2/π)
    let u = C * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp::<F>(-2.0 * u))
}

#[inline(always)]
fn map1(x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

#[inline(always)]
fn map2(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

multiversion! {
    /// `out[i] = op(x[i])` over the common length.
    fn unary(op: UnaryOp, x: &[f32], out: &mut [f32]) {
        match op {
            UnaryOp::Neg => map1(x, out, |v| -v),
            UnaryOp::Abs => map1(x, out, f32::abs),
            UnaryOp::Sqrt => map1(x, out, f32::sqrt),
            UnaryOp::Exp => map1(x, out, exp::<FMA>),
            UnaryOp::Log => map1(x, out, f32::ln),
            UnaryOp::Sin => map1(x, out, f32::sin),
            UnaryOp::Cos => map1(x, out, f32::cos),
            UnaryOp::Tanh => map1(x, out, f32::tanh),
            UnaryOp::Relu => map1(x, out, |v| if v > 0.0 { v } else { 0.0 }),
            UnaryOp::Sigmoid => map1(x, out, sigmoid::<FMA>),
            UnaryOp::Silu => map1(x, out, silu::<FMA>),
            UnaryOp::Gelu => map1(x, out, gelu::<FMA>),
        }
    }
}

multiversion! {
    /// `out[i] = op(a[i], b[i])` over the common length.
    fn binary(op: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) {
        match op {
            BinaryOp::Add => map2(a, b, out, |x, y| x + y),
            BinaryOp::Sub => map2(a, b, out, |x, y| x - y),
            BinaryOp::Mul => map2(a, b, out, |x, y| x * y),
            BinaryOp::Div => map2(a, b, out, |x, y| x / y),
            BinaryOp::Max => map2(a, b, out, f32::max),
            BinaryOp::Min => map2(a, b, out, f32::min),
        }
    }
}

multiversion! {
    /// `out[i] = op(a[i], s)`.
    fn binary_scalar(op: BinaryOp, a: &[f32], s: f32, out: &mut [f32]) {
        match op {
            BinaryOp::Add => map1(a, out, |x| x + s),
            BinaryOp::Sub => map1(a, out, |x| x - s),
            BinaryOp::Mul => map1(a, out, |x| x * s),
            BinaryOp::Div => map1(a, out, |x| x / s),
            BinaryOp::Max => map1(a, out, |x| x.max(s)),
            BinaryOp::Min => map1(a, out, |x| x.min(s)),
        }
    }
}

multiversion! {
    /// `out[i] = silu(gate[i]) · up[i]`.
    fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
        map2(gate, up, out, |g, u| silu::<FMA>(g) * u)
    }
}

/// Folds `x` with `f` into [`LANES`] independent accumulators started at `init`, then
/// combines them with `f`.
#[inline(always)]
fn fold_lanes(x: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = f(acc[i], c[i]);
        }
    }
    let mut r = init;
    for a in acc {
        r = f(r, a);
    }
    for &v in rem {
        r = f(r, v);
    }
    r
}

multiversion! {
    /// Σ x accumulated in f64 lanes: a long sum of f32 values keeps f32 precision (an
    /// f32 accumulator drifts by parts per million over millions of elements).
    fn sum(x: &[f32]) -> f64 {
        const L: usize = 8;
        let mut acc = [0.0f64; L];
        let chunks = x.chunks_exact(L);
        let rem = chunks.remainder();
        for c in chunks {
            for i in 0..L {
                acc[i] += c[i] as f64;
            }
        }
        acc.iter().sum::<f64>() + rem.iter().map(|&v| v as f64).sum::<f64>()
    }
}

multiversion! {
    /// Σ x, Max x or Min x of a slice (`Mean` gives the sum; the caller divides).
    fn reduce_slice(op: ReduceOp, x: &[f32]) -> f32 {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => sum(x) as f32,
            ReduceOp::Max => fold_lanes(x, f32::NEG_INFINITY, f32::max),
            ReduceOp::Min => fold_lanes(x, f32::INFINITY, f32::min),
        }
    }
}

multiversion! {
    /// `acc[i] += x[i]`, in f64 (see [`sum`]).
    fn add_into(acc: &mut [f64], x: &[f32]) {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += v as f64;
        }
    }
}

multiversion! {
    /// `acc[i] = op(acc[i], x[i])` (`Mean` accumulates sums; long sums should use
    /// [`add_into`]).
    fn reduce_into(op: ReduceOp, acc: &mut [f32], x: &[f32]) {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => {
                for (a, &v) in acc.iter_mut().zip(x) {
                    *a += v;
                }
            }
            ReduceOp::Max => {
                for (a, &v) in acc.iter_mut().zip(x) {
                    *a = a.max(v);
                }
            }
            ReduceOp::Min => {
                for (a, &v) in acc.iter_mut().zip(x) {
                    *a = a.min(v);
                }
            }
        }
    }
}

#[inline(always)]
fn dot_body<const F: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] = fmadd::<F>(x[i], y[i], acc[i]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

multiversion! {
    /// Σ a[i]·b[i] over the common length.
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot_body::<FMA>(a, b)
    }
}

multiversion! {
    /// `[w₀·x, w₁·x, w₂·x, w₃·x]` for the four rows `wⱼ = w[j·n..(j+1)·n]`, `n = x.len()`:
    /// each the same sum, in the same order, as [`dot`], with each chunk of `x` loaded
    /// once for the four rows.
    fn dot4(w: &[f32], x: &[f32]) -> [f32; 4] {
        let n = x.len();
        let (w0, w1, w2, w3) = (&w[..n], &w[n..2 * n], &w[2 * n..3 * n], &w[3 * n..4 * n]);
        let (mut a0, mut a1, mut a2, mut a3) = ([0.0f32; LANES], [0.0f32; LANES], [0.0f32; LANES], [0.0f32; LANES]);
        fn c(r: &[f32]) -> std::slice::ChunksExact<'_, f32> {
            r.chunks_exact(LANES)
        }
        for ((((xs, r0), r1), r2), r3) in c(x).zip(c(w0)).zip(c(w1)).zip(c(w2)).zip(c(w3)) {
            for i in 0..LANES {
                a0[i] = fmadd::<FMA>(r0[i], xs[i], a0[i]);
                a1[i] = fmadd::<FMA>(r1[i], xs[i], a1[i]);
                a2[i] = fmadd::<FMA>(r2[i], xs[i], a2[i]);
                a3[i] = fmadd::<FMA>(r3[i], xs[i], a3[i]);
            }
        }
        let tail = n - n % LANES;
        let fin = |a: [f32; LANES], r: &[f32]| {
            let mut s: f32 = a.iter().sum();
            for (w, x) in r[tail..].iter().zip(&x[tail..]) {
                s += w * x;
            }
            s
        };
        [fin(a0, w0), fin(a1, w1), fin(a2, w2), fin(a3, w3)]
    }
}

multiversion! {
    /// `scores[j] = scale · q·K[j]` for the rows of `k` (row length `q.len()`).
    fn dot_rows(q: &[f32], k: &[f32], scale: f32, scores: &mut [f32]) {
        let d = q.len().max(1);
        for (s, row) in scores.iter_mut().zip(k.chunks_exact(d)) {
            *s = scale * dot_body::<FMA>(q, row);
        }
    }
}

multiversion! {
    /// `out = Σⱼ p[j] · V[j]` for the rows of `v` (row length `out.len()`).
    fn weighted_rows(p: &[f32], v: &[f32], out: &mut [f32]) {
        out.iter_mut().for_each(|o| *o = 0.0);
        let d = out.len().max(1);
        for (&w, row) in p.iter().zip(v.chunks_exact(d)) {
            for (o, &x) in out.iter_mut().zip(row) {
                *o = fmadd::<FMA>(w, x, *o);
            }
        }
    }
}

multiversion! {
    /// Stable softmax of one row into `out`.
    fn softmax_row(x: &[f32], out: &mut [f32]) {
        let max = fold_lanes(x, f32::NEG_INFINITY, f32::max);
        let mut acc = [0.0f32; LANES];
        let mut oc = out.chunks_exact_mut(LANES);
        let xc = x.chunks_exact(LANES);
        let xr = xc.remainder();
        for (o, v) in (&mut oc).zip(xc) {
            for i in 0..LANES {
                let e = exp::<FMA>(v[i] - max);
                o[i] = e;
                acc[i] += e;
            }
        }
        let mut sum: f32 = acc.iter().sum();
        for (o, &v) in oc.into_remainder().iter_mut().zip(xr) {
            let e = exp::<FMA>(v - max);
            *o = e;
            sum += e;
        }
        let inv = 1.0 / sum;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

multiversion! {
    /// `out = x / √(mean(x²) + eps) · w` for one row.
    fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let ss = dot_body::<FMA>(x, x);
        let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
        map2(x, w, out, |v, g| v * inv * g);
    }
}

multiversion! {
    /// `out = (x − mean) / √(var + eps) · w + b` for one row (two passes).
    fn layer_norm_row(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
        let n = x.len() as f32;
        let mean = fold_lanes(x, 0.0, |a, v| a + v) / n;
        let mut acc = [0.0f32; LANES];
        let xc = x.chunks_exact(LANES);
        let xr = xc.remainder();
        for c in xc {
            for i in 0..LANES {
                let d = c[i] - mean;
                acc[i] += d * d;
            }
        }
        let mut var: f32 = acc.iter().sum();
        for &v in xr {
            var += (v - mean) * (v - mean);
        }
        let inv = 1.0 / (var / n + eps).sqrt();
        for (((o, &v), &g), &bb) in out.iter_mut().zip(x).zip(w).zip(b) {
            *o = (v - mean) * inv * g + bb;
        }
    }
}

/// Row-op outputs at least this long (elements, 16 MiB) are written with non-temporal
/// stores: they would not stay in cache anyway, and streaming them skips the
/// read-for-ownership of every output cache line.
pub(crate) const STREAM_MIN: usize = 1 << 22;

/// Copies `src` into `dst` (same length) with non-temporal stores where the target has
/// them, then fences so the data is visible to other threads once this returns.
pub(crate) fn stream_copy(src: &[f32], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_sfence, _mm_stream_ps};
        // plain stores up to the first 16-byte aligned element of `dst`
        let head = (dst.as_ptr().align_offset(16)).min(n);
        dst[..head].copy_from_slice(&src[..head]);
        let mut i = head;
        while i + 4 <= n {
            // SAFETY: `i + 4 <= n` keeps both 4-element accesses in bounds of `src` and
            // `dst`; `dst + i` is 16-byte aligned (the head loop, and steps of 4 f32), as
            // `_mm_stream_ps` requires. SSE is part of the x86-64 baseline.
            unsafe { _mm_stream_ps(dst.as_mut_ptr().add(i), _mm_loadu_ps(src.as_ptr().add(i))) };
            i += 4;
        }
        dst[i..n].copy_from_slice(&src[i..n]);
        // SAFETY: a store fence has no preconditions; SSE is part of the x86-64 baseline.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst[..n].copy_from_slice(&src[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot4_is_four_dots() {
        let mut rng = ringkernel_core::util::SplitMix64::new(3);
        for n in [1, 15, 16, 37, 576] {
            let w = rng.vec(4 * n, -1.0, 1.0);
            let x = rng.vec(n, -1.0, 1.0);
            let got = dot4(&w, &x);
            for (j, g) in got.iter().enumerate() {
                assert_eq!(
                    g.to_bits(),
                    dot(&w[j * n..(j + 1) * n], &x).to_bits(),
                    "n={n}"
                );
            }
        }
    }

    #[test]
    fn fast_exp_matches_f64_over_the_whole_range() {
        check_exp::<false>();
        check_exp::<true>();
    }

    fn check_exp<const F: bool>() {
        let exp = exp::<F>;
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
        // gradual underflow near the bottom
        let d = exp(-100.0) as f64;
        assert!((d - (-100f64).exp()).abs() < 1e-44, "{d}");
    }

    #[test]
    fn stream_copy_copies_every_element_at_any_alignment() {
        let src: Vec<f32> = (0..103).map(|i| i as f32).collect();
        for off in 0..5 {
            for n in [0usize, 1, 3, 4, 5, 17, 98] {
                let mut dst = vec![-1.0f32; 103];
                stream_copy(&src[..n], &mut dst[off..off + n]);
                assert_eq!(&dst[off..off + n], &src[..n]);
                assert!(dst[..off].iter().chain(&dst[off + n..]).all(|&v| v == -1.0));
            }
        }
    }

    #[test]
    fn lane_loops_handle_remainders() {
        for n in [0usize, 1, 15, 16, 17, 33] {
            let x: Vec<f32> = (0..n).map(|i| i as f32 - 5.0).collect();
            let s: f32 = x.iter().sum();
            assert_eq!(reduce_slice(ReduceOp::Sum, &x), s);
            assert_eq!(dot(&x, &x), x.iter().map(|v| v * v).sum::<f32>());
            if n > 0 {
                assert_eq!(reduce_slice(ReduceOp::Max, &x), n as f32 - 6.0);
                assert_eq!(reduce_slice(ReduceOp::Min, &x), -5.0);
            }
        }
    }
}
