//! The kit's checks of the ops a language model needs: dtype conversions,
//! broadcasting, the block-format weight ops and the KV-cache attention.

use super::{compare, ErrKind, ForeignBuffer, Kit, Outcome, GUARD};
use crate::compute::dtype::{self, DType};
use crate::compute::quant::{self, WeightFormat};
use crate::compute::{
    checks, reference, BinaryOp, BlockWeights, BufferRef, DecoderDims, DecoderLayer,
    DecoderScratch, DeviceBuffer, EmbeddingDims, GreedyFeed, KvDims, QMatmulDims,
};
use crate::error::Result;

/// Values that exercise every rounding and range case of the half types.
/// The epsilon of the fused RMSNorm checks (SmolLM2's).
const NORM_EPS: f32 = 1e-5;

const SPECIAL: [f32; 16] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    1.000_488_3, // 1 + 2^-11: an f16 tie, to even
    1.001_464_8, // 1 + 3·2^-11: an f16 tie, to odd → up
    65504.0,     // largest f16
    65520.0,     // rounds to f16 infinity
    1.0e-7,      // f16 subnormal
    -6.0e-8,     // rounds to the smallest f16 subnormal
    1.0e-40,     // f32 subnormal
    -1.0e30,     // beyond f16, fine in bf16
    3.0e38,
    1.003_906_3, // 1 + 2^-8: a bf16 tie
    -2.5,
];

impl Kit<'_> {
    /// Uploads words (as f32 bit patterns) followed by a NaN guard.
    fn upload_words(&self, words: &[u32], guard: bool) -> Result<BufferRef> {
        let mut w = words.to_vec();
        if guard {
            w.extend([f32::NAN.to_bits(); GUARD]);
        }
        self.b.upload(dtype::words_as_f32(&w))
    }

    /// Reads `n` words and checks the NaN guard after them.
    fn fetch_words(&self, out: &BufferRef, n: usize) -> Result<Vec<u32>> {
        let v = self.fetch(out, n)?;
        Ok(dtype::f32_as_words(&v).to_vec())
    }

    pub(super) fn convert(&mut self) {
        let floats = [DType::F32, DType::F16, DType::Bf16];
        for from in floats {
            for to in floats {
                for n in [1usize, 7, 33, 1023, 4097] {
                    let mut v = self.rng.vec(n, -70000.0, 70000.0);
                    for (i, x) in v.iter_mut().enumerate() {
                        match i % 4 {
                            1 => *x /= 50000.0,
                            2 => *x *= 1e-9,
                            _ => {}
                        }
                    }
                    for (x, s) in v.iter_mut().zip(SPECIAL) {
                        *x = s;
                    }
                    let input = dtype::pack(from, &v);
                    let want = reference::convert(&input, from, to, n);
                    let outcome = match self.run_convert(&input, from, to, n) {
                        Err(e) => Outcome::Failed(format!("error: {e}")),
                        Ok(got) => compare_elements(&got, &want, to, n),
                    };
                    self.record(
                        &format!("convert {from}→{to}"),
                        &format!("len={n}"),
                        outcome,
                    );
                }
            }
        }
        let ids: Vec<u32> = (0..33).map(|i| i * 0x0101_0101).collect();
        let outcome = match self.run_convert(&ids, DType::U32, DType::U32, 33) {
            Err(e) => Outcome::Failed(format!("error: {e}")),
            Ok(got) => compare_elements(&got, &ids, DType::U32, 33),
        };
        self.record("convert u32→u32", "len=33", outcome);
    }

    /// `argmax` against [`reference::argmax`]: few distinct values (ties), NaNs anywhere
    /// and first, every value -inf, the largest first or last; +inf after the input, so a
    /// read past `len` shows. Then its errors.
    pub(super) fn argmax(&mut self) {
        for n in [1usize, 2, 17, 256, 257, 1000, 49_152, 100_003] {
            for case in 0..6 {
                let mut x: Vec<f32> = self
                    .rng
                    .vec(n, 0.0, 8.0)
                    .iter()
                    .map(|v| v.floor() - 4.0)
                    .collect();
                let i = (self.rng.below(n as u64)) as usize;
                match case {
                    1 => x[i] = f32::NAN,
                    2 => x[0] = f32::NAN,
                    3 => x.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                    4 => x[n - 1] = 100.0,
                    5 => {
                        x[0] = 100.0;
                        x[i] = 100.0;
                        x.iter_mut().skip(1).step_by(3).for_each(|v| *v = f32::NAN);
                    }
                    _ => {}
                }
                let want = reference::argmax(&x) as u32;
                let outcome = match self.run_argmax(&x, n) {
                    Err(e) => Outcome::Failed(format!("error: {e}")),
                    Ok(got) if got == want => Outcome::Passed {
                        rel_error: 0.0,
                        tolerance: 0.0,
                    },
                    Ok(got) => Outcome::Failed(format!("index {got}, want {want}")),
                };
                self.record("argmax", &format!("len={n} case {case}"), outcome);
            }
        }
        let b = self.b;
        let bufs =
            (|| -> Result<(BufferRef, BufferRef)> { Ok((b.upload(&[1.0; 8])?, b.alloc(1)?)) })();
        let (x, out) = match bufs {
            Ok(v) => v,
            Err(e) => {
                self.record(
                    "argmax",
                    "errors setup",
                    Outcome::Failed(format!("error: {e}")),
                );
                return;
            }
        };
        use ErrKind::{Any, Shape};
        self.expect_err("argmax", "no elements", Any, b.argmax(&*x, 0, &*out));
        self.expect_err("argmax", "input too short", Shape, b.argmax(&*x, 9, &*out));
        self.expect_err(
            "argmax",
            "output aliases the input",
            Any,
            b.argmax(&*x, 4, &*x),
        );
    }

    /// `increment` on words near `u32::MAX` (wrap-around) at an offset, twice in a row,
    /// with the words around the range unchanged; `read_async` of a range followed by a
    /// write to it (the read sees the data from before the write). Then their errors.
    pub(super) fn counters(&mut self) {
        for n in [1usize, 5, 1000, 4099] {
            let words: Vec<u32> = (0..n + 6)
                .map(|_| {
                    let v = self.rng.below(1 << 32) as u32;
                    if v.is_multiple_of(3) {
                        u32::MAX - v % 5
                    } else {
                        v
                    }
                })
                .collect();
            let (at, by) = (3usize, 1 + self.rng.below(1000) as u32);
            let want: Vec<u32> = words
                .iter()
                .enumerate()
                .map(|(i, &w)| {
                    if (at..at + n).contains(&i) {
                        w.wrapping_add(by).wrapping_add(1)
                    } else {
                        w
                    }
                })
                .collect();
            let got = (|| -> Result<Vec<u32>> {
                let buf = self.upload_words(&words, true)?;
                self.b.increment(&*buf, at, n, by)?;
                self.b.increment(&*buf, at, n, 1)?;
                self.fetch_words(&buf, words.len())
            })();
            let outcome = match got {
                Err(e) => Outcome::Failed(format!("error: {e}")),
                Ok(got) => match got.iter().zip(&want).position(|(g, w)| g != w) {
                    None => Outcome::Passed {
                        rel_error: 0.0,
                        tolerance: 0.0,
                    },
                    Some(i) => Outcome::Failed(format!("word {i} is {}, want {}", got[i], want[i])),
                },
            };
            self.record("increment", &format!("len={n} by={by}+1"), outcome);

            let data = self.rng.vec(n + 6, -1.0, 1.0);
            let got = (|| -> Result<Vec<f32>> {
                let buf = self.b.upload(&data)?;
                let pending = self.b.read_async(&*buf, at, n)?;
                self.b.write(&*buf, 0, &vec![f32::NAN; n + 6])?;
                self.b.increment(&*buf, at, n, 1)?;
                pending.wait()
            })();
            let outcome = match got {
                Err(e) => Outcome::Failed(format!("error: {e}")),
                Ok(got) if got.len() != n => {
                    Outcome::Failed(format!("{} elements, want {n}", got.len()))
                }
                Ok(got) => match got
                    .iter()
                    .zip(&data[at..])
                    .position(|(g, w)| g.to_bits() != w.to_bits())
                {
                    None => Outcome::Passed {
                        rel_error: 0.0,
                        tolerance: 0.0,
                    },
                    Some(i) => Outcome::Failed(format!(
                        "element {i} is {}, want {} (read after a later write?)",
                        got[i],
                        data[at + i]
                    )),
                },
            };
            self.record("read_async", &format!("len={n} offset={at}"), outcome);
        }
        let b = self.b;
        let buf = match b.alloc(8) {
            Ok(v) => v,
            Err(e) => {
                self.record(
                    "increment",
                    "errors setup",
                    Outcome::Failed(format!("error: {e}")),
                );
                return;
            }
        };
        use ErrKind::Shape;
        self.expect_err(
            "increment",
            "past the end",
            Shape,
            b.increment(&*buf, 5, 4, 1),
        );
        self.expect_err(
            "increment",
            "offset overflows",
            Shape,
            b.increment(&*buf, usize::MAX, 2, 1),
        );
        self.expect_err(
            "read_async",
            "past the end",
            Shape,
            b.read_async(&*buf, 7, 2).map(drop),
        );
        let empty = (|| -> Result<Vec<f32>> {
            b.increment(&*buf, 8, 0, 1)?;
            b.read_async(&*buf, 8, 0)?.wait()
        })();
        let outcome = match empty {
            Ok(v) if v.is_empty() => Outcome::Passed {
                rel_error: 0.0,
                tolerance: 0.0,
            },
            Ok(v) => Outcome::Failed(format!("{} elements from an empty read", v.len())),
            Err(e) => Outcome::Failed(format!("error: {e}")),
        };
        self.record("increment/read_async", "len=0 at the end", outcome);
    }

    /// `greedy_feed` in every weight format: the token against [`reference::argmax`]
    /// (logits with ties, a NaN, +inf after them), the next input against
    /// [`reference::embedding`] of that token, the position word advanced (also across
    /// `u32::MAX`); a second feed on the same buffers advances it again. Then its errors.
    pub(super) fn greedy_feed(&mut self) {
        let sizes = [(1usize, 32usize), (37, 96), (1000, 64), (4099, 576)];
        for format in [WeightFormat::F32, WeightFormat::Q4_1, WeightFormat::Q8_0] {
            for (case, &(rows, cols)) in sizes.iter().enumerate() {
                let size = format!("{format} rows={rows} cols={cols}");
                let mut logits: Vec<f32> = self
                    .rng
                    .vec(rows, 0.0, 6.0)
                    .iter()
                    .map(|v| v.floor())
                    .collect();
                logits[self.rng.below(rows as u64) as usize] = f32::NAN;
                let pos = match case {
                    0 => u32::MAX,
                    _ => self.rng.below(1 << 32) as u32,
                };
                let twice = case == 2;
                let outcome = (|| -> Result<Outcome> {
                    let table = self.weights(format, rows, cols)?;
                    let want = reference::argmax(&logits) as u32;
                    let want_x = reference::embedding(
                        format,
                        &table,
                        &[want],
                        EmbeddingDims {
                            rows,
                            cols,
                            count: 1,
                        },
                    );
                    let mut padded = logits.clone();
                    padded.extend([f32::INFINITY; GUARD]);
                    let l = self.b.upload(&padded)?;
                    let t = self.upload_words(&table, false)?;
                    let (tok, x) = (self.poisoned(1)?, self.poisoned(cols)?);
                    let p = self.upload_words(&[pos], true)?;
                    let feed = GreedyFeed {
                        logits: &*l,
                        table: BlockWeights {
                            buffer: &*t,
                            format,
                        },
                        rows,
                        cols,
                        token: &*tok,
                        x: &*x,
                        position: &*p,
                    };
                    self.b.greedy_feed(&feed)?;
                    if twice {
                        self.b.greedy_feed(&feed)?;
                    }
                    let got_tok = self.fetch_words(&tok, 1)?[0];
                    let got_x = self.fetch(&x, cols)?;
                    let got_pos = self.fetch_words(&p, 1)?[0];
                    let want_pos = pos.wrapping_add(1 + u32::from(twice));
                    Ok(if got_tok != want {
                        Outcome::Failed(format!("token {got_tok}, want {want}"))
                    } else if got_pos != want_pos {
                        Outcome::Failed(format!("position {got_pos}, want {want_pos}"))
                    } else {
                        compare(&got_x, &want_x, self.tol.exact)
                    })
                })()
                .unwrap_or_else(|e| Outcome::Failed(format!("error: {e}")));
                let what = if twice { " (fed twice)" } else { "" };
                self.record("greedy_feed", &format!("{size}{what}"), outcome);
            }
        }
        self.greedy_feed_errors();
    }

    fn greedy_feed_errors(&mut self) {
        let b = self.b;
        let bufs = (|| -> Result<[BufferRef; 5]> {
            let table = self.weights(WeightFormat::Q8_0, 8, 96)?;
            Ok([
                b.upload(&[0.5; 8])?,
                self.upload_words(&table, false)?,
                b.alloc(1)?,
                b.alloc(64)?,
                b.alloc(1)?,
            ])
        })();
        let [l, t, tok, x, p] = match bufs {
            Ok(v) => v,
            Err(e) => {
                self.record(
                    "greedy_feed",
                    "errors setup",
                    Outcome::Failed(format!("error: {e}")),
                );
                return;
            }
        };
        let feed = GreedyFeed {
            logits: &*l,
            table: BlockWeights {
                buffer: &*t,
                format: WeightFormat::Q8_0,
            },
            rows: 8,
            cols: 64,
            token: &*tok,
            x: &*x,
            position: &*p,
        };
        use ErrKind::{Any, Shape};
        let cases: [(&str, ErrKind, GreedyFeed); 6] = [
            ("no rows", Any, GreedyFeed { rows: 0, ..feed }),
            ("logits too short", Shape, GreedyFeed { rows: 9, ..feed }),
            (
                "cols not a multiple of 32",
                Any,
                GreedyFeed { cols: 48, ..feed },
            ),
            (
                "next input too short",
                Shape,
                GreedyFeed { cols: 96, ..feed },
            ),
            (
                "token aliases the logits",
                Any,
                GreedyFeed { token: &*l, ..feed },
            ),
            (
                "position aliases the token",
                Any,
                GreedyFeed {
                    position: &*tok,
                    ..feed
                },
            ),
        ];
        for (case, kind, f) in cases {
            self.expect_err("greedy_feed", case, kind, b.greedy_feed(&f));
        }
        let foreign = ForeignBuffer::new(64, b.kind());
        self.expect_err(
            "greedy_feed",
            "foreign next input",
            ErrKind::Device,
            b.greedy_feed(&GreedyFeed {
                x: &foreign,
                ..feed
            }),
        );
    }

    fn run_argmax(&self, x: &[f32], n: usize) -> Result<u32> {
        let mut padded = x.to_vec();
        padded.extend([f32::INFINITY; GUARD]);
        let xb = self.b.upload(&padded)?;
        let out = self.poisoned(1)?;
        self.b.argmax(&*xb, n, &*out)?;
        Ok(self.fetch_words(&out, 1)?[0])
    }

    fn run_convert(&self, input: &[u32], from: DType, to: DType, n: usize) -> Result<Vec<u32>> {
        let x = self.upload_words(input, false)?;
        let out = self.poisoned(to.words(n))?;
        self.b.convert(&*x, from, &*out, to, n)?;
        self.fetch_words(&out, to.words(n))
    }

    pub(super) fn broadcast(&mut self) {
        let shapes: [(&[usize], &[usize]); 8] = [
            (&[2, 3], &[3]),
            (&[3], &[2, 3]),
            (&[4, 1, 5], &[3, 1]),
            (&[1], &[7]),
            (&[33, 1], &[1, 65]),
            (&[2, 3, 4, 5], &[3, 1, 5]),
            (&[5, 1, 3, 1, 2], &[4, 1, 2, 1]),
            (&[1023, 7], &[1023, 1]),
        ];
        for (i, (sa, sb)) in shapes.iter().enumerate() {
            let (shape, dims) = match checks::broadcast(sa, sb) {
                Ok(x) => x,
                Err(e) => {
                    self.record(
                        "broadcast",
                        &format!("{sa:?} {sb:?}"),
                        Outcome::Failed(format!("error: {e}")),
                    );
                    continue;
                }
            };
            let n: usize = shape.iter().product();
            let a = self.rng.vec(sa.iter().product(), -4.0, 4.0);
            let b = self.rng.vec(sb.iter().product(), 0.25, 4.0);
            let ops: &[BinaryOp] = if i < 2 {
                &BinaryOp::ALL
            } else {
                &[BinaryOp::Add, BinaryOp::Div]
            };
            for &op in ops {
                let r = reference::broadcast_binary(op, &a, &b, &dims);
                self.numeric(
                    &format!("broadcast {}", op.name()),
                    &format!("{sa:?} {sb:?} → {shape:?}"),
                    self.tol.exact,
                    &r,
                    |k| {
                        k.run_unary_shape(&[&a, &b], n, |bb, out| {
                            k.b.broadcast_binary(op, &*bb[0], &*bb[1], out, &dims)
                        })
                    },
                );
            }
        }
    }

    pub(super) fn quantized(&mut self) {
        // (batch, rows, cols, accumulate)
        let cases = [
            (1, 1, 32, false),
            (1, 7, 64, false),
            (1, 33, 576, true),
            (3, 65, 96, false),
            (8, 129, 160, true),
            (1, 1025, 32, false),
            (17, 9, 1536, false),
            // a tall matrix for one token (CUDA: four rows a warp, the last warp's partly
            // past the end)
            (1, 16411, 64, true),
        ];
        for format in WeightFormat::ALL {
            for (batch, rows, cols, accumulate) in cases {
                let d = QMatmulDims {
                    batch,
                    rows,
                    cols,
                    accumulate,
                };
                let size = format!(
                    "b={batch} rows={rows} cols={cols}{}",
                    if accumulate { " +=" } else { "" }
                );
                let (w, w2) = match (
                    self.weights(format, rows, cols),
                    self.weights(format, rows, cols),
                ) {
                    (Ok(a), Ok(b)) => (a, b),
                    (Err(e), _) | (_, Err(e)) => {
                        self.record("qmatmul", &size, Outcome::Failed(format!("error: {e}")));
                        continue;
                    }
                };
                let x = self.rng.vec(batch * cols, -1.0, 1.0);
                let init = self.rng.vec(batch * rows, -1.0, 1.0);
                // A kernel sums in f32: its error is bounded relative to the sums of the
                // terms' magnitudes, not to the results (a 32-term row can cancel to a
                // result far smaller than its terms).
                let kappa = cancellation(format, &w, &x, &init, d)
                    .max(cancellation(format, &w2, &x, &init, d));
                let r = reference::qmatmul(format, &w, &x, &init, d);
                self.numeric(
                    &format!("qmatmul {format}"),
                    &size,
                    self.tol.linear * kappa,
                    &r,
                    |k| k.run_qmatmul(format, &[&w], &x, None, &init, d),
                );
                let r = reference::qmatmul_swiglu(format, &w, &w2, &x, &init, d);
                self.numeric(
                    &format!("qmatmul_swiglu {format}"),
                    &size,
                    self.tol.linear.max(self.tol.transcendental) * kappa,
                    &r,
                    |k| k.run_qmatmul(format, &[&w, &w2], &x, None, &init, d),
                );
                // RMSNorm before the matvec (CUDA fuses up to 4 tokens into one kernel;
                // 8 and 17 take the two ops), one matrix and gate/up.
                let norm = self.rng.vec(cols, 0.5, 1.5);
                let xn = reference::rms_norm(&x, &norm, batch, cols, NORM_EPS);
                let xn32: Vec<f32> = xn.iter().map(|&v| v as f32).collect();
                let kappa = cancellation(format, &w, &xn32, &init, d)
                    .max(cancellation(format, &w2, &xn32, &init, d));
                for (gated, r) in [
                    (false, reference::qmatmul(format, &w, &xn, &init, d)),
                    (
                        true,
                        reference::qmatmul_swiglu(format, &w, &w2, &xn, &init, d),
                    ),
                ] {
                    let ws: Vec<&[u32]> = if gated { vec![&w, &w2] } else { vec![&w] };
                    self.numeric(
                        &format!(
                            "rms_norm_qmatmul{} {format}",
                            if gated { " swiglu" } else { "" }
                        ),
                        &size,
                        self.tol.linear.max(self.tol.transcendental) * kappa,
                        &r,
                        |k| k.run_qmatmul(format, &ws, &x, Some(&norm), &init, d),
                    );
                }
            }
            for (rows, cols, count) in [(1, 32, 1), (7, 64, 5), (100, 96, 9), (50, 576, 3)] {
                let d = EmbeddingDims { rows, cols, count };
                let table = match self.weights(format, rows, cols) {
                    Ok(t) => t,
                    Err(e) => {
                        self.record("embedding", "", Outcome::Failed(format!("error: {e}")));
                        continue;
                    }
                };
                // the last id is past the table: a zero row
                let mut ids: Vec<u32> = (0..count)
                    .map(|_| self.rng.below(rows as u64) as u32)
                    .collect();
                if count > 1 {
                    ids[count - 1] = rows as u32 + 3;
                }
                let r = reference::embedding(format, &table, &ids, d);
                self.numeric(
                    &format!("embedding {format}"),
                    &format!("rows={rows} cols={cols} ids={count}"),
                    self.tol.exact,
                    &r,
                    |k| {
                        let t = k.upload_words(&table, false)?;
                        let i = k.upload_words(&ids, false)?;
                        let out = k.poisoned(count * cols)?;
                        k.b.embedding(&*t, format, &*i, &*out, d)?;
                        k.fetch(&out, count * cols)
                    },
                );
            }
        }
    }

    /// A random `rows × cols` matrix in `format`.
    fn weights(&mut self, format: WeightFormat, rows: usize, cols: usize) -> Result<Vec<u32>> {
        let x = self.rng.vec(rows * cols, -1.0, 1.0);
        quant::quantize(format, &x)
    }

    /// `qmatmul` (one weight matrix) or `qmatmul_swiglu` (two), the output starting as
    /// `init`; with `norm`, `rms_norm_qmatmul` with those norm weights.
    fn run_qmatmul(
        &self,
        format: WeightFormat,
        w: &[&[u32]],
        x: &[f32],
        norm: Option<&[f32]>,
        init: &[f32],
        d: QMatmulDims,
    ) -> Result<Vec<f32>> {
        let ws = w
            .iter()
            .map(|w| self.upload_words(w, false))
            .collect::<Result<Vec<_>>>()?;
        let xb = self.b.upload(x)?;
        let mut o = init.to_vec();
        if !d.accumulate {
            o.iter_mut().for_each(|v| *v = f32::NAN);
        }
        o.extend([f32::NAN; GUARD]);
        let out = self.b.upload(&o)?;
        if let Some(norm) = norm {
            let wr: Vec<&dyn DeviceBuffer> = ws.iter().map(|b| &**b).collect();
            let nb = self.b.upload(norm)?;
            let normed = self.poisoned(d.batch * d.cols)?;
            self.b
                .rms_norm_qmatmul(&*xb, &*nb, NORM_EPS, &*normed, &wr, format, &*out, d)?;
        } else if ws.len() == 1 {
            self.b.qmatmul(&*ws[0], format, &*xb, &*out, d)?;
        } else {
            self.b
                .qmatmul_swiglu(&*ws[0], &*ws[1], format, &*xb, &*out, d)?;
        }
        self.fetch(&out, d.batch * d.rows)
    }

    pub(super) fn kv_attention(&mut self) {
        // (tokens, heads, kv_heads, head_dim, capacity)
        let cases = [
            (1, 1, 1, 2, 1),
            (1, 9, 3, 64, 40),
            (5, 4, 2, 16, 12),
            (3, 6, 6, 8, 5),
            (16, 8, 1, 32, 300),
            // past one tile of keys (1,024 in the CUDA kernel), float4 and scalar heads
            (2, 9, 3, 64, 2500),
            (3, 2, 1, 6, 1100),
        ];
        for (tokens, heads, kv_heads, head_dim, capacity) in cases {
            let d = KvDims {
                tokens,
                heads,
                kv_heads,
                head_dim,
                capacity,
                rope_base: 10000.0,
                scale: 1.0 / (head_dim as f32).sqrt(),
            };
            let size = format!("t={tokens} h={heads}/{kv_heads} d={head_dim} cap={capacity}");
            let s = match checks::kv_sizes(&d) {
                Ok(s) => s,
                Err(e) => {
                    self.record("rope_kv", &size, Outcome::Failed(format!("error: {e}")));
                    continue;
                }
            };
            let qkv = self.rng.vec(s.qkv, -1.0, 1.0);
            let kc = self.rng.vec(s.cache, -1.0, 1.0);
            let vc = self.rng.vec(s.cache, -1.0, 1.0);
            // distinct positions, the last token at the last position (a prefill's end)
            let mut positions: Vec<u32> = (0..tokens)
                .map(|t| (capacity - tokens + t) as u32)
                .collect();
            if tokens > 2 {
                positions.swap(0, 1);
            }
            let (rq, rk, rv) = reference::rope_kv(&qkv, &positions, &kc, &vc, d);
            let run = self.run_rope_kv(&qkv, &positions, &kc, &vc, d);
            for (what, i, r, tol) in [
                ("queries", 0, &rq, self.tol.rope),
                ("k cache", 1, &rk, self.tol.rope),
                ("v cache", 2, &rv, 0.0),
            ] {
                let outcome = match &run {
                    Err(e) => Outcome::Failed(format!("error: {e}")),
                    Ok(outs) => compare(&outs[i], r, tol),
                };
                self.record(&format!("rope_kv {what}"), &size, outcome);
            }
            // attention over the caches as rope_kv left them, each token seeing rows up
            // to its position
            let q = self.rng.vec(s.q, -1.0, 1.0);
            let kf: Vec<f32> = rk.iter().map(|&v| v as f32).collect();
            let vf: Vec<f32> = rv.iter().map(|&v| v as f32).collect();
            let r = reference::attention_kv(&q, &kf, &vf, &positions, d);
            self.numeric("attention_kv", &size, self.tol.attention, &r, |k| {
                let bufs = [
                    k.b.upload(&q)?,
                    k.b.upload(&kf)?,
                    k.b.upload(&vf)?,
                    k.upload_words(&positions, false)?,
                ];
                let out = k.poisoned(s.q)?;
                k.b.attention_kv(&*bufs[0], &*bufs[1], &*bufs[2], &*bufs[3], &*out, d)?;
                k.fetch(&out, s.q)
            });
        }
        self.decode_loop();
        self.recorded_step();
        self.decoder_layer_loop();
        // a position past the cache writes nothing there
        let d = KvDims {
            tokens: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            capacity: 3,
            rope_base: 10000.0,
            scale: 0.5,
        };
        let qkv = self.rng.vec(16, -1.0, 1.0);
        let kc = self.rng.vec(12, -1.0, 1.0);
        let (_, rk, _) = reference::rope_kv(&qkv, &[3], &kc, &kc, d);
        let outcome = match self.run_rope_kv(&qkv, &[3], &kc, &kc, d) {
            Err(e) => Outcome::Failed(format!("error: {e}")),
            Ok(outs) => compare(&outs[1], &rk, 0.0),
        };
        self.record("rope_kv", "position past the cache", outcome);
    }

    /// A decode loop: one token a step into the same buffers, the position in a device
    /// buffer; the step is recorded once ([`ComputeBackend::record`](crate::compute::ComputeBackend::record), a CUDA graph) where
    /// the backend can, and replayed.
    fn decode_loop(&mut self) {
        let d = KvDims {
            tokens: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            capacity: 6,
            rope_base: 10000.0,
            scale: 0.25,
        };
        let steps: Vec<Vec<f32>> = (0..d.capacity)
            .map(|_| self.rng.vec(128, -1.0, 1.0))
            .collect();
        for (fused, op) in [
            (false, "rope_kv + attention_kv"),
            (true, "rope_attention_kv"),
        ] {
            let outcome = match self.run_decode_loop(&steps, d, fused) {
                Err(e) => Outcome::Failed(format!("error: {e}")),
                Ok((got, want)) => compare(&got, &want, self.tol.attention.max(self.tol.rope)),
            };
            self.record(op, "recorded decode loop, 6 steps", outcome);
        }
    }

    /// Runs the loop (the two ops, or `rope_attention_kv`); returns every step's attention
    /// output and then both caches, and the reference's.
    fn run_decode_loop(
        &self,
        steps: &[Vec<f32>],
        d: KvDims,
        fused: bool,
    ) -> Result<(Vec<f32>, Vec<f64>)> {
        let b = self.b;
        let s = checks::kv_sizes(&d)?;
        let qkv = b.alloc(s.qkv)?;
        let pos = b.alloc(1)?;
        let q = b.alloc(s.q)?;
        let zeros = vec![0.0f32; s.cache];
        let (kc, vc) = (b.upload(&zeros)?, b.upload(&zeros)?);
        let out = b.alloc(s.q)?;
        let mut ops = || -> Result<()> {
            if fused {
                return b.rope_attention_kv(&*qkv, &*pos, &*q, &*kc, &*vc, &*out, d);
            }
            b.rope_kv(&*qkv, &*pos, &*q, &*kc, &*vc, d)?;
            b.attention_kv(&*q, &*kc, &*vc, &*pos, &*out, d)
        };
        let recorded = b.record(&mut ops)?;
        let (mut hk, mut hv) = (zeros.clone(), zeros);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (step, x) in steps.iter().enumerate() {
            b.write(&*qkv, 0, x)?;
            b.write(&*pos, 0, dtype::words_as_f32(&[step as u32]))?;
            match &recorded {
                Some(r) => r.replay()?,
                None => ops()?,
            }
            let mut o = vec![0.0f32; s.q];
            b.read(&*out, 0, &mut o)?;
            got.extend(o);
            let (rq, rk, rv) = reference::rope_kv(x, &[step as u32], &hk, &hv, d);
            hk = rk.iter().map(|&v| v as f32).collect();
            hv = rv.iter().map(|&v| v as f32).collect();
            let rq: Vec<f32> = rq.iter().map(|&v| v as f32).collect();
            want.extend(reference::attention_kv(&rq, &hk, &hv, &[step as u32], d));
        }
        for (cache, reference) in [(&kc, &hk), (&vc, &hv)] {
            let mut c = vec![0.0f32; s.cache];
            b.read(&**cache, 0, &mut c)?;
            got.extend(c);
            want.extend(reference.iter().map(|&v| v as f64));
        }
        Ok((got, want))
    }

    /// Runs `rope_kv` and returns the queries and both caches.
    fn run_rope_kv(
        &self,
        qkv: &[f32],
        positions: &[u32],
        kc: &[f32],
        vc: &[f32],
        d: KvDims,
    ) -> Result<[Vec<f32>; 3]> {
        let s = checks::kv_sizes(&d)?;
        let x = self.b.upload(qkv)?;
        let p = self.upload_words(positions, false)?;
        let q = self.poisoned(s.q)?;
        let guarded = |c: &[f32]| {
            let mut v = c.to_vec();
            v.extend([f32::NAN; GUARD]);
            self.b.upload(&v)
        };
        let (k, v) = (guarded(kc)?, guarded(vc)?);
        self.b.rope_kv(&*x, &*p, &*q, &*k, &*v, d)?;
        Ok([
            self.fetch(&q, s.q)?,
            self.fetch(&k, s.cache)?,
            self.fetch(&v, s.cache)?,
        ])
    }

    pub(super) fn model_op_errors(&mut self) {
        let b = self.b;
        let setup = (|| -> Result<(BufferRef, BufferRef)> {
            Ok((b.upload(&[1.0; 64])?, b.upload(&[1.0; 8])?))
        })();
        let (big, small) = match setup {
            Ok(x) => x,
            Err(e) => {
                self.record(
                    "errors setup",
                    "upload",
                    Outcome::Failed(format!("error: {e}")),
                );
                return;
            }
        };
        let (g, s) = (&*big, &*small);
        let foreign = ForeignBuffer::new(64, b.kind());
        let f: &dyn crate::compute::DeviceBuffer = &foreign;
        use ErrKind::{Any, Device, Shape};
        self.expect_err(
            "convert",
            "f16 output too short",
            Shape,
            b.convert(g, DType::F32, s, DType::F16, 17),
        );
        self.expect_err(
            "convert",
            "u32 to f32",
            Any,
            b.convert(g, DType::U32, g, DType::F32, 4),
        );
        self.expect_err(
            "convert",
            "foreign out",
            Device,
            b.convert(g, DType::F32, f, DType::F32, 4),
        );
        let (_, bd) = checks::broadcast(&[4, 4], &[4]).expect("valid shapes");
        self.expect_err(
            "broadcast_binary",
            "out too short",
            Shape,
            b.broadcast_binary(BinaryOp::Add, g, g, s, &bd),
        );
        self.expect_err(
            "broadcast_binary",
            "foreign b",
            Device,
            b.broadcast_binary(BinaryOp::Add, g, f, g, &bd),
        );
        let qd = QMatmulDims {
            batch: 1,
            rows: 2,
            cols: 32,
            accumulate: false,
        };
        self.expect_err(
            "qmatmul",
            "q8_0 weights too short",
            Shape,
            b.qmatmul(s, WeightFormat::Q8_0, g, g, qd),
        );
        self.expect_err(
            "qmatmul",
            "cols not a multiple of 32",
            Shape,
            b.qmatmul(g, WeightFormat::Q4_1, g, g, QMatmulDims { cols: 16, ..qd }),
        );
        self.expect_err(
            "qmatmul",
            "input too short",
            Shape,
            b.qmatmul(g, WeightFormat::Q4_1, s, g, qd),
        );
        self.expect_err(
            "qmatmul",
            "foreign weights",
            Device,
            b.qmatmul(f, WeightFormat::Q4_1, g, g, qd),
        );
        self.expect_err(
            "qmatmul_swiglu",
            "up weights too short",
            Shape,
            b.qmatmul_swiglu(g, s, WeightFormat::Q8_0, g, g, qd),
        );
        if let (Ok(x), Ok(normed), Ok(out)) = (
            b.upload(&[1.0; 64]),
            b.upload(&[1.0; 64]),
            b.upload(&[1.0; 64]),
        ) {
            let (x, n, o) = (&*x, &*normed, &*out);
            let q4 = WeightFormat::Q4_1;
            self.expect_err(
                "rms_norm_qmatmul",
                "three weight matrices",
                Any,
                b.rms_norm_qmatmul(x, g, 1e-5, n, &[g, g, g], q4, o, qd),
            );
            self.expect_err(
                "rms_norm_qmatmul",
                "norm weights too short",
                Shape,
                b.rms_norm_qmatmul(x, s, 1e-5, n, &[g], q4, o, qd),
            );
            self.expect_err(
                "rms_norm_qmatmul",
                "gate weights too short",
                Shape,
                b.rms_norm_qmatmul(x, g, 1e-5, n, &[s, g], WeightFormat::Q8_0, o, qd),
            );
        }
        let ed = EmbeddingDims {
            rows: 2,
            cols: 32,
            count: 2,
        };
        self.expect_err(
            "embedding",
            "output too short",
            Shape,
            b.embedding(g, WeightFormat::Q4_1, g, s, ed),
        );
        self.expect_err(
            "embedding",
            "foreign ids",
            Device,
            b.embedding(g, WeightFormat::Q4_1, f, g, ed),
        );
        let kd = KvDims {
            tokens: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            capacity: 4,
            rope_base: 10000.0,
            scale: 0.5,
        };
        self.expect_err(
            "rope_kv",
            "k cache too short",
            Shape,
            b.rope_kv(g, g, g, s, g, kd),
        );
        self.expect_err(
            "rope_kv",
            "heads not a multiple of kv_heads",
            Shape,
            b.rope_kv(
                g,
                g,
                g,
                g,
                g,
                KvDims {
                    heads: 3,
                    kv_heads: 2,
                    ..kd
                },
            ),
        );
        self.expect_err(
            "rope_kv",
            "foreign qkv",
            Device,
            b.rope_kv(f, g, g, g, g, kd),
        );
        self.expect_err(
            "attention_kv",
            "output too short",
            Shape,
            b.attention_kv(g, g, g, g, s, KvDims { heads: 4, ..kd }),
        );
        self.expect_err(
            "attention_kv",
            "foreign v cache",
            Device,
            b.attention_kv(g, g, f, g, g, kd),
        );
        let layer = DecoderLayer {
            attn_norm: g,
            qkv: BlockWeights {
                buffer: g,
                format: WeightFormat::F32,
            },
            wo: BlockWeights {
                buffer: g,
                format: WeightFormat::F32,
            },
            ffn_norm: g,
            gate: BlockWeights {
                buffer: g,
                format: WeightFormat::F32,
            },
            up: g,
            down: BlockWeights {
                buffer: g,
                format: WeightFormat::F32,
            },
            k_cache: g,
            v_cache: g,
        };
        let scratch = |residual| DecoderScratch {
            normed: g,
            qkv: g,
            q: g,
            att: g,
            hidden: g,
            residual,
        };
        let dd = DecoderDims {
            kv: KvDims { tokens: 1, ..kd },
            dim: 32,
            hidden: 32,
            eps: NORM_EPS,
        };
        if let Ok(x) = b.upload(&[1.0; 64]) {
            let x = &*x;
            self.expect_err(
                "decoder_layer",
                "dim 48 (not a multiple of 32)",
                Any,
                b.decoder_layer(x, g, &layer, &scratch(g), DecoderDims { dim: 48, ..dd }),
            );
            self.expect_err(
                "decoder_layer",
                "residual copy is x",
                Any,
                b.decoder_layer(x, g, &layer, &scratch(x), dd),
            );
            self.expect_err(
                "decoder_layer",
                "residual copy too short",
                Shape,
                b.decoder_layer(x, g, &layer, &scratch(s), DecoderDims { dim: 64, ..dd }),
            );
        }
        if let (Ok(q), Ok(kc), Ok(vc)) = (
            b.upload(&[1.0; 64]),
            b.upload(&[1.0; 64]),
            b.upload(&[1.0; 64]),
        ) {
            // positions from g: 1.0's bits, far past the cache (nothing written there)
            let (q, kc, vc) = (&*q, &*kc, &*vc);
            self.expect_err(
                "rope_attention_kv",
                "output too short",
                Shape,
                b.rope_attention_kv(g, g, q, kc, vc, s, KvDims { heads: 4, ..kd }),
            );
            self.expect_err(
                "rope_attention_kv",
                "output is the query buffer",
                Any,
                b.rope_attention_kv(g, g, q, kc, vc, q, kd),
            );
        }
    }
}

/// How much smaller the results of `x · Wᵀ (+ init)` are than the sums of their terms'
/// magnitudes (norm over norm, at least 1): the factor by which a correctly rounded f32
/// summation's relative error can exceed that of one rounding.
fn cancellation(format: WeightFormat, w: &[u32], x: &[f32], init: &[f32], d: QMatmulDims) -> f64 {
    let Ok(wd) = quant::dequantize_f64(format, w, d.rows * d.cols) else {
        return 1.0;
    };
    let (mut signed, mut magnitude) = (0.0f64, 0.0f64);
    for t in 0..d.batch {
        for r in 0..d.rows {
            let (mut s, mut a) = (0.0f64, 0.0f64);
            for c in 0..d.cols {
                let p = wd[r * d.cols + c] * f64::from(x[t * d.cols + c]);
                s += p;
                a += p.abs();
            }
            if d.accumulate {
                let i = f64::from(init[t * d.rows + r]);
                s += i;
                a += i.abs();
            }
            signed += s * s;
            magnitude += a * a;
        }
    }
    if signed == 0.0 {
        return 1.0;
    }
    (magnitude / signed).sqrt().max(1.0)
}

/// Exact comparison of `n` elements stored as `ty`, NaN matching any NaN.
fn compare_elements(got: &[u32], want: &[u32], ty: DType, n: usize) -> Outcome {
    if matches!(ty, DType::F16 | DType::Bf16) && n % 2 == 1 {
        let last = got[n / 2] >> 16;
        if last != 0 {
            return Outcome::Failed(format!(
                "padding half of the last word is {last:#x}, want 0"
            ));
        }
    }
    for i in 0..n {
        let (a, b) = if ty == DType::U32 {
            (got[i] as f64, want[i] as f64)
        } else {
            (
                f64::from(dtype::element(ty, got, i)),
                f64::from(dtype::element(ty, want, i)),
            )
        };
        let same = (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
        if !same {
            return Outcome::Failed(format!("element {i}: got {a:e}, want {b:e} ({ty})"));
        }
    }
    Outcome::Passed {
        rel_error: 0.0,
        tolerance: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_comparison_is_exact_up_to_nan_payloads() {
        let want = dtype::pack(DType::F16, &[1.0, f32::NAN, -0.0]);
        let mut got = want.clone();
        assert!(matches!(
            compare_elements(&got, &want, DType::F16, 3),
            Outcome::Passed { .. }
        ));
        got[0] ^= 0x0001_0000; // another NaN payload (the quiet bit stays set)
        assert!(matches!(
            compare_elements(&got, &want, DType::F16, 3),
            Outcome::Passed { .. }
        ));
        got[1] = 0x0001_8000; // +0 instead of -0 (and a dirty padding half)
        assert!(matches!(
            compare_elements(&got, &want, DType::F16, 3),
            Outcome::Failed(_)
        ));
    }
}
