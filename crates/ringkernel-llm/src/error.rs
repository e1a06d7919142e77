//! The crate's typed errors; each converts into [`ringkernel_core::Error`].

use std::path::PathBuf;

/// What went wrong while reading a model file, tokenizing or running the model.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file ends before a structure it announces.
    #[error("truncated GGUF: {what} needs bytes {start}..{end} but the file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// First byte needed.
        start: u64,
        /// One past the last byte needed.
        end: u64,
        /// The file's length.
        len: u64,
    },
    /// The bytes are not a GGUF file or contradict themselves.
    #[error("corrupted GGUF: {0}")]
    Corrupted(String),
    /// A tensor type this crate cannot decode.
    #[error("tensor {tensor}: unknown or unsupported ggml type {type_id}")]
    UnknownTensorType {
        /// The tensor's name.
        tensor: String,
        /// The raw type id.
        type_id: u32,
    },
    /// A metadata key the model needs is absent.
    #[error("missing GGUF metadata key `{0}`")]
    MissingKey(String),
    /// A metadata key holds a value of another type than expected.
    #[error("GGUF metadata key `{key}` is {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What it holds.
        found: &'static str,
        /// What was asked for.
        expected: &'static str,
    },
    /// A tensor the model needs is absent.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// Tensor shapes that do not fit the model or the op.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// The model (weights and KV cache) will not fit into the memory allowed.
    #[error("model needs {needed} bytes ({detail}) but only {available} are available")]
    OutOfMemory {
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        available: u64,
        /// The breakdown.
        detail: String,
    },
    /// An argument that can never be valid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An op the chosen device does not provide.
    #[error("{device}: {what}")]
    Unsupported {
        /// The device.
        device: String,
        /// What is missing.
        what: String,
    },
    /// An error from RingKernel's core.
    #[error(transparent)]
    Core(#[from] ringkernel_core::Error),
}

impl From<LlmError> for ringkernel_core::Error {
    fn from(e: LlmError) -> Self {
        use ringkernel_core::Error as E;
        match e {
            LlmError::Core(e) => e,
            LlmError::Shape(s) => E::ShapeMismatch(s),
            LlmError::InvalidArgument(s) => E::InvalidArgument(s),
            other => E::Device(other.to_string()),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, LlmError>;
