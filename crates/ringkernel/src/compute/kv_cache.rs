//! [`KvCache`]: per-layer key and value buffers that grow by one decode step at a time
//! and are used in place by attention.

use super::tensor::numel;
use super::{Device, Tensor};
use crate::core::compute::{AttentionDims, BufferRef};
use crate::{Error, Result};

/// The keys and values of one attention layer, `[heads, max_len, head_dim]` each, on a
/// device. [`KvCache::append`] copies a step's keys and values in on the device (no
/// host round trip); [`KvCache::attention`] and [`KvView`] hand the first `len`
/// positions to the attention ops through `AttentionDims::kv_stride`, without copying.
///
/// ```
/// use ringkernel::compute::{Device, KvCache, Tensor};
/// let dev = Device::cpu();
/// let (heads, d) = (2, 4);
/// let mut cache = KvCache::new(&dev, heads, 8, d)?;
/// for step in 0..3 {
///     let k = Tensor::full(&dev, &[heads, 1, d], step as f32)?;
///     let v = Tensor::full(&dev, &[heads, 1, d], 10.0 * step as f32)?;
///     cache.append(&k, &v)?;
/// }
/// assert_eq!(cache.len(), 3);
/// let q = Tensor::zeros(&dev, &[heads, 1, d])?; // equal scores: the mean of the values
/// let out = cache.attention(&q)?.to_vec()?;
/// assert!(out.iter().all(|&x| (x - 10.0).abs() < 1e-5));
/// # Ok::<(), ringkernel::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct KvCache {
    device: Device,
    k: BufferRef,
    v: BufferRef,
    heads: usize,
    max_len: usize,
    head_dim: usize,
    len: usize,
}

impl KvCache {
    /// An empty cache for `heads` heads of `head_dim`, holding up to `max_len`
    /// positions.
    pub fn new(device: &Device, heads: usize, max_len: usize, head_dim: usize) -> Result<KvCache> {
        let n = numel(&[heads, max_len, head_dim])?;
        let b = device.backend();
        Ok(KvCache {
            device: device.clone(),
            k: b.alloc(n)?,
            v: b.alloc(n)?,
            heads,
            max_len,
            head_dim,
            len: 0,
        })
    }

    /// Positions stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is stored yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity in positions.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Forgets every position (the buffers are kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `t` positions: `k_step` and `v_step` of shape `[heads, t, head_dim]` (or
    /// `[heads, head_dim]` for one position). Past `max_len` this is an
    /// [`Error::ShapeMismatch`] and the cache is unchanged.
    pub fn append(&mut self, k_step: &Tensor, v_step: &Tensor) -> Result<()> {
        let (h, d) = (self.heads, self.head_dim);
        let t = match k_step.shape() {
            &[hh, t, dd] if hh == h && dd == d => t,
            &[hh, dd] if hh == h && dd == d => 1,
            s => {
                return Err(Error::shape(format!(
                    "KvCache::append: keys of shape {s:?}, want [{h}, t, {d}]"
                )))
            }
        };
        if v_step.len() != k_step.len() {
            return Err(Error::shape(format!(
                "KvCache::append: values of shape {:?} do not match keys {:?}",
                v_step.shape(),
                k_step.shape()
            )));
        }
        for s in [k_step, v_step] {
            if s.device() != &self.device {
                return Err(Error::Device(format!(
                    "KvCache::append: step on {}, cache on {}; move it with to_device",
                    s.device(),
                    self.device
                )));
            }
        }
        if self.len + t > self.max_len {
            return Err(Error::shape(format!(
                "KvCache::append: {} + {t} positions overflow the cache of {} positions",
                self.len, self.max_len
            )));
        }
        let b = self.device.backend();
        for (src, dst) in [(k_step, &self.k), (v_step, &self.v)] {
            for head in 0..h {
                b.copy(
                    &**src.buffer(),
                    head * t * d,
                    &**dst,
                    (head * self.max_len + self.len) * d,
                    t * d,
                )?;
            }
        }
        self.len += t;
        Ok(())
    }

    /// A view of the first `n` positions (`n ≤ len`).
    pub fn view(&self, n: usize) -> Result<KvView<'_>> {
        if n == 0 || n > self.len {
            return Err(Error::shape(format!(
                "KvCache::view: {n} positions asked, {} stored",
                self.len
            )));
        }
        Ok(KvView { cache: self, n })
    }

    /// Causal attention of `q: [heads, q_len, head_dim]` (the last `q_len` positions)
    /// over every stored position.
    pub fn attention(&self, q: &Tensor) -> Result<Tensor> {
        self.view(self.len)?.attention(q, true)
    }

    /// The key buffer, `[heads, max_len, head_dim]`.
    pub fn keys_buffer(&self) -> &BufferRef {
        &self.k
    }

    /// The value buffer, `[heads, max_len, head_dim]`.
    pub fn values_buffer(&self) -> &BufferRef {
        &self.v
    }
}

/// The first `n` positions of a [`KvCache`], used in place.
#[derive(Debug, Clone, Copy)]
pub struct KvView<'a> {
    cache: &'a KvCache,
    n: usize,
}

impl KvView<'_> {
    /// Positions in the view.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Always false (views hold at least one position).
    pub fn is_empty(&self) -> bool {
        false
    }

    fn dims(&self, q: &Tensor, causal: bool, op: &str) -> Result<AttentionDims> {
        let c = self.cache;
        if q.device() != &c.device {
            return Err(Error::Device(format!(
                "{op}: query on {}, cache on {}",
                q.device(),
                c.device
            )));
        }
        match q.shape() {
            &[h, q_len, d]
                if h == c.heads
                    && d == c.head_dim
                    && q_len >= 1
                    && (!causal || q_len <= self.n) =>
            {
                Ok(AttentionDims {
                    batch_heads: h,
                    q_len,
                    kv_len: self.n,
                    kv_stride: c.max_len,
                    head_dim: d,
                    scale: 1.0 / (d as f32).sqrt(),
                    causal,
                    q_offset: self.n - q_len.min(self.n),
                })
            }
            s => Err(Error::shape(format!(
                "{op}: query of shape {s:?}, want [{}, q_len, {}] with q_len ≤ {} when causal",
                c.heads, c.head_dim, self.n
            ))),
        }
    }

    /// Fused attention of `q: [heads, q_len, head_dim]` over the view; with `causal` the
    /// queries are its last `q_len` positions.
    pub fn attention(&self, q: &Tensor, causal: bool) -> Result<Tensor> {
        let dims = self.dims(q, causal, "KvView::attention")?;
        let c = self.cache;
        let out = Tensor::alloc(&c.device, q.shape().to_vec())?;
        c.device
            .backend()
            .attention(&**q.buffer(), &*c.k, &*c.v, &**out.buffer(), dims)?;
        Ok(out)
    }

    /// Attention scores `[heads, q_len, n]` of `q` over the view.
    pub fn scores(&self, q: &Tensor, causal: bool) -> Result<Tensor> {
        let dims = self.dims(q, causal, "KvView::scores")?;
        let c = self.cache;
        let out = Tensor::alloc(&c.device, vec![dims.batch_heads, dims.q_len, self.n])?;
        c.device
            .backend()
            .attention_scores(&**q.buffer(), &*c.k, &**out.buffer(), dims)?;
        Ok(out)
    }

    /// `P·V` for probabilities `p: [heads, q_len, n]` over the view's values.
    pub fn weighted_sum(&self, p: &Tensor) -> Result<Tensor> {
        let c = self.cache;
        let (h, q_len) = match p.shape() {
            &[h, q_len, n] if h == c.heads && n == self.n => (h, q_len),
            s => {
                return Err(Error::shape(format!(
                    "KvView::weighted_sum: p of shape {s:?}, want [{}, q_len, {}]",
                    c.heads, self.n
                )))
            }
        };
        if p.device() != &c.device {
            return Err(Error::Device(format!(
                "KvView::weighted_sum: p on {}, cache on {}",
                p.device(),
                c.device
            )));
        }
        let dims = AttentionDims {
            batch_heads: h,
            q_len,
            kv_len: self.n,
            kv_stride: c.max_len,
            head_dim: c.head_dim,
            scale: 1.0,
            causal: false,
            q_offset: 0,
        };
        let out = Tensor::alloc(&c.device, vec![h, q_len, c.head_dim])?;
        c.device
            .backend()
            .attention_weighted_sum(&**p.buffer(), &*c.v, &**out.buffer(), dims)?;
        Ok(out)
    }

    /// Copies of the keys and values of the view, `[heads, n, head_dim]` each.
    pub fn to_tensors(&self) -> Result<(Tensor, Tensor)> {
        let c = self.cache;
        let (h, n, d) = (c.heads, self.n, c.head_dim);
        let b = c.device.backend();
        let mut out = Vec::with_capacity(2);
        for src in [&c.k, &c.v] {
            let t = Tensor::alloc(&c.device, vec![h, n, d])?;
            for head in 0..h {
                b.copy(
                    &**src,
                    head * c.max_len * d,
                    &**t.buffer(),
                    head * n * d,
                    n * d,
                )?;
            }
            out.push(t);
        }
        let v = out
            .pop()
            .ok_or_else(|| Error::Device("internal: missing values".into()))?;
        let k = out
            .pop()
            .ok_or_else(|| Error::Device("internal: missing keys".into()))?;
        Ok((k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::util::{rel_error, SplitMix64};

    #[test]
    fn cache_attention_equals_attention_over_the_whole_prefix() {
        let d = Device::cpu();
        let mut rng = SplitMix64::from_entropy();
        let (h, hd, max) = (3, 8, 7);
        let mut cache = KvCache::new(&d, h, max, hd).unwrap();
        let mut ks = vec![Vec::new(); h];
        let mut vs = vec![Vec::new(); h];
        for step in 0..max {
            let k = rng.vec(h * hd, -1.0, 1.0);
            let v = rng.vec(h * hd, -1.0, 1.0);
            for head in 0..h {
                ks[head].extend_from_slice(&k[head * hd..(head + 1) * hd]);
                vs[head].extend_from_slice(&v[head * hd..(head + 1) * hd]);
            }
            let shape = if step % 2 == 0 {
                vec![h, 1, hd]
            } else {
                vec![h, hd]
            };
            cache
                .append(
                    &Tensor::from_slice(&d, &k, &shape).unwrap(),
                    &Tensor::from_slice(&d, &v, &shape).unwrap(),
                )
                .unwrap();
            let n = step + 1;
            assert_eq!(cache.len(), n);
            let q = rng.vec(h * hd, -1.0, 1.0);
            let tq = Tensor::from_slice(&d, &q, &[h, 1, hd]).unwrap();
            let kk: Vec<f32> = ks.concat();
            let vv: Vec<f32> = vs.concat();
            let dims = AttentionDims {
                batch_heads: h,
                q_len: 1,
                kv_len: n,
                kv_stride: n,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                causal: true,
                q_offset: n - 1,
            };
            let want = crate::core::compute::reference::attention(&q, &kk, &vv, dims);
            assert!(rel_error(&cache.attention(&tq).unwrap().to_vec().unwrap(), &want) < 1e-5);
            let (tk, tv) = cache.view(n).unwrap().to_tensors().unwrap();
            assert_eq!(tk.to_vec().unwrap(), kk);
            assert_eq!(tv.to_vec().unwrap(), vv);
            // the unfused path through the view gives the same
            let view = cache.view(n).unwrap();
            let p = view.scores(&tq, true).unwrap().softmax().unwrap();
            assert!(rel_error(&view.weighted_sum(&p).unwrap().to_vec().unwrap(), &want) < 1e-5);
        }
        // full: a clear error, and the cache is unchanged
        let one = Tensor::zeros(&d, &[h, 1, hd]).unwrap();
        let err = cache.append(&one, &one).unwrap_err();
        assert!(
            matches!(err, Error::ShapeMismatch(_)) && err.to_string().contains("overflow"),
            "{err}"
        );
        assert_eq!(cache.len(), max);
        assert!(cache.view(max + 1).is_err());
        assert!(matches!(
            cache.append(&Tensor::zeros(&d, &[h + 1, 1, hd]).unwrap(), &one),
            Err(Error::ShapeMismatch(_))
        ));
        cache.clear();
        assert!(cache.is_empty());
        assert!(cache.attention(&one).is_err());
    }
}
