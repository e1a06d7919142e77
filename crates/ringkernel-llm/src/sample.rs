//! Choosing the next token from logits: greedy, or temperature with top-k and top-p
//! (nucleus) filtering, from a seeded generator so a run can be repeated.
//!
//! ```
//! use ringkernel_llm::sample::{Sampler, SamplerConfig};
//! let mut s = Sampler::new(SamplerConfig::greedy());
//! assert_eq!(s.sample(&[0.1, 2.0, -1.0]), 1);
//! let mut s = Sampler::new(SamplerConfig { temperature: 0.8, top_k: 2, top_p: 0.9, seed: 7 });
//! assert!(s.sample(&[0.1, 2.0, -1.0]) < 2);
//! ```

use crate::error::{LlmError, Result};

/// A small, fast, seedable generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in `[-1, 1)`.
    pub fn symmetric(&mut self) -> f32 {
        self.next_f32() * 2.0 - 1.0
    }
}

/// How to sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// 0 for greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`
    /// (1.0: all).
    pub top_p: f32,
    /// Seed of the generator.
    pub seed: u64,
}

impl SamplerConfig {
    /// Argmax decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Whether it picks the argmax (temperature 0), whatever `top_k` and `top_p` say.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// [`LlmError::InvalidArgument`] for a negative or non-finite temperature or a
    /// `top_p` outside `(0, 1]`.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(LlmError::InvalidArgument(format!(
                "temperature {} must be a finite number >= 0",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(LlmError::InvalidArgument(format!(
                "top_p {} must be in (0, 1]",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// Picks tokens according to a [`SamplerConfig`].
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
}

/// The index of the largest value (the first at a tie); 0 for an empty slice; NaNs are
/// passed over. The same function as the devices' `argmax` op
/// ([`ringkernel_core::compute::reference::argmax`]).
pub fn argmax(x: &[f32]) -> usize {
    ringkernel_core::compute::reference::argmax(x)
}

impl Sampler {
    /// A sampler seeded with `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Self {
        Self {
            cfg,
            rng: Rng::new(cfg.seed),
        }
    }

    /// The next token for `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.is_greedy() || logits.len() < 2 {
            return argmax(logits) as u32;
        }
        let mut cand: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(i, &v)| (v / self.cfg.temperature, i as u32))
            .collect();
        cand.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        if self.cfg.top_k > 0 {
            cand.truncate(self.cfg.top_k);
        }
        let Some(&(max, first)) = cand.first() else {
            return 0;
        };
        let mut sum = 0f32;
        for c in &mut cand {
            c.0 = (c.0 - max).exp();
            sum += c.0;
        }
        let n = cand.len();
        let mut keep = n;
        let mut acc = 0f32;
        for (i, c) in cand.iter_mut().enumerate() {
            c.0 /= sum;
            acc += c.0;
            if acc >= self.cfg.top_p && keep == n {
                keep = i + 1;
            }
        }
        cand.truncate(keep);
        let total: f32 = cand.iter().map(|c| c.0).sum();
        let mut r = self.rng.next_f32() * total;
        for &(p, id) in &cand {
            if r < p {
                return id;
            }
            r -= p;
        }
        cand.last().map_or(first, |c| c.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_is_the_first_largest_value_past_nans() {
        // the definition: one pass, strictly greater replaces
        let simple = |x: &[f32]| {
            let mut best = 0;
            for (i, &v) in x.iter().enumerate() {
                if v > x[best] {
                    best = i;
                }
            }
            best
        };
        let mut r = Rng::new(7);
        for len in [0usize, 1, 2, 15, 16, 17, 31, 100, 1000, 49_152] {
            for case in 0..6 {
                let mut x: Vec<f32> = (0..len)
                    .map(|_| (r.next_f32() * 8.0).floor() - 4.0)
                    .collect();
                match case {
                    1 if len > 3 => x[len / 2] = f32::NAN,
                    2 if len > 0 => x[0] = f32::NAN,
                    3 => x.iter_mut().for_each(|v| *v = -0.0),
                    4 if len > 1 => x[len - 1] = 0.0f32.max(x[len - 1]) + 100.0,
                    5 => x.iter_mut().step_by(3).for_each(|v| *v = f32::NAN),
                    _ => {}
                }
                assert_eq!(argmax(&x), simple(&x), "len {len} case {case}");
            }
        }
    }

    #[test]
    fn greedy_is_argmax_and_seeds_repeat() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        assert!(SamplerConfig::greedy().is_greedy());
        let mut g = Sampler::new(SamplerConfig::greedy());
        assert_eq!(g.sample(&logits) as usize, argmax(&logits));
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 3,
        };
        assert!(!cfg.is_greedy());
        let a: Vec<u32> = {
            let mut s = Sampler::new(cfg);
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        let mut s = Sampler::new(cfg);
        let b: Vec<u32> = (0..20).map(|_| s.sample(&logits)).collect();
        assert_eq!(a, b);
        assert!(
            a.iter().any(|&t| t != a[0]),
            "temperature 1 should vary: {a:?}"
        );
    }

    #[test]
    fn top_k_and_top_p_restrict_the_choice() {
        let logits = [5.0, 4.9, 1.0, 0.5, 0.0, -3.0];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            seed: 1,
        });
        let picks: Vec<u32> = (0..200).map(|_| s.sample(&logits)).collect();
        assert!(picks.iter().all(|&t| t < 2));
        assert!(picks.contains(&0) && picks.contains(&1));
        // p(0) ≈ 0.51 here: top_p 0.5 keeps token 0 alone.
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 1,
        });
        assert!((0..100).all(|_| s.sample(&logits) == 0));
        // Frequencies follow the softmax at temperature 1 (two tokens, p = 0.525/0.475).
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            seed: 9,
        });
        let n = 20_000;
        let zeros = (0..n).filter(|_| s.sample(&logits) == 0).count() as f64 / n as f64;
        let p0 = 1.0 / (1.0 + (-0.1f64).exp());
        assert!((zeros - p0).abs() < 0.02, "{zeros} vs {p0}");
    }

    #[test]
    fn bad_configs_are_rejected() {
        let mut c = SamplerConfig::greedy();
        c.temperature = -1.0;
        assert!(c.validate().is_err());
        c.temperature = 0.5;
        c.top_p = 0.0;
        assert!(c.validate().is_err());
        c.top_p = 1.0;
        assert!(c.validate().is_ok());
    }
}
