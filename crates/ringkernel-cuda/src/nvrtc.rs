//! Run-time compilation of CUDA C with NVRTC, straight to a cubin for the device's own
//! architecture (`--gpu-architecture=sm_XY`), with an on-disk cache.
//!
//! The cache key is a 64-bit FNV-1a hash of the source, the options, the architecture,
//! the NVRTC version and the driver version. The cache lives in
//! `$RINGKERNEL_CUDA_CACHE`, else `$XDG_CACHE_HOME/ringkernel/cuda`, else
//! `$HOME/.cache/ringkernel/cuda` (`%LOCALAPPDATA%\ringkernel\cuda` on Windows).
//! `RINGKERNEL_CUDA_LINEINFO=1` compiles with source-line information (for
//! compute-sanitizer and ncu).
//! Cache problems (unwritable directory, a corrupt file) are logged and otherwise
//! ignored: the source is compiled again.

use crate::driver::ensure_nvrtc;
use cudarc::nvrtc::{result as nv, sys as nvsys};
use ringkernel_core::{BackendKind, Error, Result};
use std::ffi::CString;
use std::path::PathBuf;

/// Where compiled kernels are cached, if anywhere.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("RINGKERNEL_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("ringkernel").join("cuda"));
    }
    if cfg!(windows) {
        if let Some(d) = std::env::var_os("LOCALAPPDATA") {
            return Some(PathBuf::from(d).join("ringkernel").join("cuda"));
        }
    }
    std::env::var_os("HOME").map(|h| {
        PathBuf::from(h)
            .join(".cache")
            .join("ringkernel")
            .join("cuda")
    })
}

/// 64-bit FNV-1a, stable across builds (unlike `DefaultHasher`).
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints through valid pointers.
    unsafe { nvsys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::Device(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// Compiles `src` (program name `name`, for messages) to a cubin for compute capability
/// `cc`, or returns the cached cubin. Compile errors are [`Error::Compile`] with the
/// NVRTC log.
pub(crate) fn compile_cubin(
    src: &str,
    name: &str,
    cc: (i32, i32),
    driver_version: i32,
) -> Result<Vec<u8>> {
    let (vmaj, vmin) = nvrtc_version()?;
    let arch = format!("--gpu-architecture=sm_{}{}", cc.0, cc.1);
    let mut opts: Vec<String> = vec![
        arch,
        "--std=c++17".into(),
        "-default-device".into(),
        "--extra-device-vectorization".into(),
    ];
    // Source lines in the cubin, for compute-sanitizer and ncu reports
    // (scripts/gpu-sanitize.sh sets it); part of the cache key like every option.
    if std::env::var("RINGKERNEL_CUDA_LINEINFO").is_ok_and(|v| v == "1") {
        opts.push("--generate-line-info".into());
    }
    let key = fnv1a64(&[
        src.as_bytes(),
        opts.join(" ").as_bytes(),
        format!("nvrtc {vmaj}.{vmin} driver {driver_version}").as_bytes(),
    ]);
    let file = cache_dir().map(|d| {
        d.join(format!(
            "{}-sm{}{}-{key:016x}.cubin",
            sanitize(name),
            cc.0,
            cc.1
        ))
    });
    if let Some(f) = &file {
        match std::fs::read(f) {
            Ok(bytes) if bytes.starts_with(b"\x7fELF") => return Ok(bytes),
            Ok(_) => tracing::warn!(path = %f.display(), "ignoring a corrupt cached cubin"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %f.display(), error = %e, "cannot read the kernel cache")
            }
        }
    }
    let cubin = compile_uncached(src, name, &opts)?;
    if let Some(f) = &file {
        if let Err(e) = store(f, &cubin) {
            tracing::warn!(path = %f.display(), error = %e, "cannot write the kernel cache");
        }
    }
    Ok(cubin)
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn store(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Write then rename, so a concurrent reader never sees half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn compile_uncached(src: &str, name: &str, opts: &[String]) -> Result<Vec<u8>> {
    ensure_nvrtc()?;
    let csrc = CString::new(src).map_err(|_| Error::invalid("CUDA source contains a NUL byte"))?;
    let cname = CString::new(sanitize(name))
        .map_err(|_| Error::invalid("program name contains a NUL byte"))?;
    let prog = nv::create_program(&csrc, Some(&cname))
        .map_err(|e| Error::Device(format!("nvrtcCreateProgram: {e:?}")))?;
    struct Guard(nvsys::nvrtcProgram);
    impl Drop for Guard {
        fn drop(&mut self) {
            // SAFETY: destroys the program created above, exactly once.
            unsafe {
                let _ = nv::destroy_program(self.0);
            }
        }
    }
    let guard = Guard(prog);
    // SAFETY: prog is a valid program; the options are valid C strings.
    let compiled = unsafe { nv::compile_program(guard.0, opts) };
    if let Err(e) = compiled {
        // SAFETY: valid program; the log is read after a compile attempt.
        let log = unsafe { nv::get_program_log(guard.0) }
            .map(|v| {
                let bytes: Vec<u8> = v
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_else(|_| String::from("(no log)"));
        return Err(Error::Compile {
            backend: BackendKind::Cuda,
            log: format!("{name}: {e:?}\n{log}"),
        });
    }
    let mut size = 0usize;
    // SAFETY: valid, compiled program; writes one usize.
    unsafe { nvsys::nvrtcGetCUBINSize(guard.0, &mut size) }
        .result()
        .map_err(|e| Error::Device(format!("nvrtcGetCUBINSize: {e:?}")))?;
    if size == 0 {
        return Err(Error::Compile {
            backend: BackendKind::Cuda,
            log: format!("{name}: NVRTC produced no cubin"),
        });
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: the buffer holds exactly `size` bytes as NVRTC asked for.
    unsafe { nvsys::nvrtcGetCUBIN(guard.0, cubin.as_mut_ptr() as *mut std::ffi::c_char) }
        .result()
        .map_err(|e| Error::Device(format!("nvrtcGetCUBIN: {e:?}")))?;
    Ok(cubin)
}
