//! Threadgroup sizing and grid geometry, as pure functions.
//!
//! A Metal compute pipeline reports two limits after it is compiled:
//! `threadExecutionWidth` (the SIMD-group width, 32 on every Apple GPU so far) and
//! `maxTotalThreadsPerThreadgroup` (which depends on the kernel's register and
//! threadgroup-memory use and can be below the device's 1024). Kernels translated from
//! WGSL have a fixed `@workgroup_size`, which becomes the threadgroup size: the backend
//! checks it against the compiled pipeline with [`check_fixed_threadgroup`] (every
//! shared kernel is of this kind today). [`fit_threadgroup`] chooses a size for a kernel
//! whose size is free (a future kernel taking it as a pipeline constant).

use ringkernel_core::error::{Error, Result};

/// Limits of one compiled compute pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineLimits {
    /// SIMD-group width (`threadExecutionWidth`).
    pub thread_execution_width: u32,
    /// Most threads one threadgroup may have (`maxTotalThreadsPerThreadgroup`).
    pub max_total_threads: u32,
}

impl PipelineLimits {
    /// Limits to assume before a pipeline exists: 32-wide SIMD groups, 1024 threads.
    pub const APPLE_DEFAULT: PipelineLimits = PipelineLimits {
        thread_execution_width: 32,
        max_total_threads: 1024,
    };
}

/// The threadgroup size for a kernel whose size is free: `wanted` rounded down to a
/// multiple of the SIMD width and clamped to the pipeline's maximum (itself rounded
/// down to whole SIMD groups). Never below one SIMD group unless the pipeline's maximum
/// is smaller than that, and never 0. Bad limits (0) are [`Error::Device`].
///
/// ```
/// use ringkernel_drain::sizing::{fit_threadgroup, PipelineLimits};
/// let l = PipelineLimits { thread_execution_width: 32, max_total_threads: 896 };
/// assert_eq!(fit_threadgroup(l, 1024).unwrap(), 896);
/// assert_eq!(fit_threadgroup(l, 100).unwrap(), 96);
/// assert_eq!(fit_threadgroup(l, 1).unwrap(), 32);
/// ```
pub fn fit_threadgroup(limits: PipelineLimits, wanted: u32) -> Result<u32> {
    let w = limits.thread_execution_width;
    let max = limits.max_total_threads;
    if w == 0 || max == 0 {
        return Err(Error::Device(format!(
            "pipeline reports impossible limits {limits:?}"
        )));
    }
    if max < w {
        return Ok(max);
    }
    let max_whole = max / w * w;
    let wanted_whole = (wanted / w * w).max(w);
    Ok(wanted_whole.min(max_whole))
}

/// Checks that a kernel's fixed workgroup size (from its WGSL `@workgroup_size`) fits
/// the compiled pipeline. A size above `maxTotalThreadsPerThreadgroup` cannot be
/// dispatched and is [`Error::Device`] naming the kernel (dispatching it anyway would
/// fail inside Metal with a far less helpful message). A size that is not a multiple
/// of the SIMD width is allowed (it only leaves lanes idle).
pub fn check_fixed_threadgroup(
    kernel: &str,
    limits: PipelineLimits,
    size: [u32; 3],
) -> Result<u32> {
    let total = size.iter().try_fold(1u32, |acc, &d| acc.checked_mul(d));
    match total {
        Some(t) if t > 0 && t <= limits.max_total_threads => Ok(t),
        Some(0) => Err(Error::Device(format!("kernel {kernel}: workgroup size {size:?} has no threads"))),
        _ => Err(Error::Device(format!(
            "kernel {kernel}: workgroup size {size:?} exceeds the pipeline's maxTotalThreadsPerThreadgroup of {}",
            limits.max_total_threads
        ))),
    }
}

/// Number of groups of `per_group` items needed to cover `items` (ceil division).
/// `per_group` 0 is treated as 1.
pub fn groups_for(items: usize, per_group: usize) -> usize {
    items.div_ceil(per_group.max(1))
}

/// The largest number of workgroups one dimension of a WebGPU dispatch may have
/// (`maxComputeWorkgroupsPerDimension`); the shared kernels are written for it, so the
/// Metal backend keeps to it too.
pub const MAX_GROUPS_PER_DIM: u32 = 65_535;

/// Spreads `groups` workgroups over a 2-D grid `[x, y, 1]` with `x ≤ 65535`, for kernels
/// that linearise `workgroup_id.x + workgroup_id.y · num_workgroups.x` (extra groups in
/// the last row exit early). [`Error::InvalidArgument`] beyond 65535².
pub fn spread_groups(groups: usize) -> Result<[u32; 3]> {
    let max = MAX_GROUPS_PER_DIM as usize;
    if groups <= max {
        return Ok([groups.max(1) as u32, 1, 1]);
    }
    let y = groups.div_ceil(max);
    if y > max {
        return Err(Error::invalid(format!(
            "{groups} workgroups exceed a 65535 × 65535 grid"
        )));
    }
    let x = groups.div_ceil(y);
    Ok([x as u32, y as u32, 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_respects_simd_width_and_max() {
        let l = PipelineLimits {
            thread_execution_width: 32,
            max_total_threads: 1024,
        };
        assert_eq!(fit_threadgroup(l, 256).unwrap(), 256);
        assert_eq!(fit_threadgroup(l, 4096).unwrap(), 1024);
        assert_eq!(fit_threadgroup(l, 33).unwrap(), 32);
        assert_eq!(fit_threadgroup(l, 0).unwrap(), 32);
        // A register-heavy pipeline whose max is not a multiple of the width.
        let l = PipelineLimits {
            thread_execution_width: 32,
            max_total_threads: 200,
        };
        assert_eq!(fit_threadgroup(l, 256).unwrap(), 192);
        // Max below one SIMD group: the max itself.
        let l = PipelineLimits {
            thread_execution_width: 32,
            max_total_threads: 16,
        };
        assert_eq!(fit_threadgroup(l, 256).unwrap(), 16);
        let bad = PipelineLimits {
            thread_execution_width: 0,
            max_total_threads: 16,
        };
        assert!(matches!(fit_threadgroup(bad, 64), Err(Error::Device(_))));
        // Exhaustive small sweep: result is within limits and a multiple of the width.
        for w in [1u32, 8, 16, 32, 64] {
            for max in (1..=1024).step_by(7) {
                for wanted in [1u32, 31, 64, 100, 255, 256, 1000, 2048] {
                    let l = PipelineLimits {
                        thread_execution_width: w,
                        max_total_threads: max,
                    };
                    let t = fit_threadgroup(l, wanted).unwrap();
                    assert!(t >= 1 && t <= max, "{l:?} {wanted} -> {t}");
                    if max >= w {
                        assert_eq!(t % w, 0, "{l:?} {wanted} -> {t}");
                    }
                }
            }
        }
    }

    #[test]
    fn fixed_sizes_are_checked() {
        let l = PipelineLimits {
            thread_execution_width: 32,
            max_total_threads: 512,
        };
        assert_eq!(check_fixed_threadgroup("k", l, [16, 16, 1]).unwrap(), 256);
        let e = check_fixed_threadgroup("matmul", l, [32, 32, 1]).unwrap_err();
        assert!(
            e.to_string().contains("matmul") && e.to_string().contains("512"),
            "{e}"
        );
        assert!(check_fixed_threadgroup("k", l, [0, 1, 1]).is_err());
        assert!(check_fixed_threadgroup("k", l, [u32::MAX, u32::MAX, 2]).is_err());
    }

    #[test]
    fn grids_cover_every_group() {
        assert_eq!(groups_for(0, 256), 0);
        assert_eq!(groups_for(1, 256), 1);
        assert_eq!(groups_for(257, 256), 2);
        assert_eq!(spread_groups(0).unwrap(), [1, 1, 1]);
        assert_eq!(spread_groups(65_535).unwrap(), [65_535, 1, 1]);
        for g in [65_536usize, 1_000_000, 65_535 * 65_535] {
            let [x, y, z] = spread_groups(g).unwrap();
            assert_eq!(z, 1);
            assert!(x <= MAX_GROUPS_PER_DIM && y <= MAX_GROUPS_PER_DIM);
            assert!(x as usize * y as usize >= g, "{g}: {x}×{y}");
            assert!((x as usize * (y as usize - 1)) < g, "no empty last row");
        }
        assert!(spread_groups(65_535 * 65_535 + 1).is_err());
    }
}
