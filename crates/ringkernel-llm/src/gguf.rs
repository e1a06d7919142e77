//! A reader for GGUF model files (version 2 and 3): metadata and tensor descriptions are
//! parsed up front, tensor data stays in the memory-mapped file and is borrowed.
//!
//! Every length and offset in the header is checked against the file before it is used:
//! a truncated file is [`LlmError::Truncated`], contradictory contents are
//! [`LlmError::Corrupted`], an unknown tensor type is [`LlmError::UnknownTensorType`].
//!
//! ```no_run
//! use ringkernel_llm::gguf::GgufFile;
//! let f = GgufFile::open("model.gguf")?;
//! println!("{} layers", f.get_u32("llama.block_count")?);
//! for t in f.tensors() {
//!     println!("{} {:?} {:?}", t.name, t.dtype, t.dims);
//! }
//! # Ok::<(), ringkernel_llm::LlmError>(())
//! ```

use crate::error::{LlmError, Result};
use crate::quant::GgmlType;
use std::collections::HashMap;
use std::path::Path;

/// `"GGUF"` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// u8
    U8(u8),
    /// i8
    I8(i8),
    /// u16
    U16(u16),
    /// i16
    I16(i16),
    /// u32
    U32(u32),
    /// i32
    I32(i32),
    /// f32
    F32(f32),
    /// bool
    Bool(bool),
    /// UTF-8 string
    String(String),
    /// An array of values of one type.
    Array(Vec<Value>),
    /// u64
    U64(u64),
    /// i64
    I64(i64),
    /// f64
    F64(f64),
}

impl Value {
    /// The type's name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
}

/// Where and what one tensor is.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, fastest-varying first (ggml order: `dims[0]` is a row's length).
    pub dims: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// Byte offset of the data from the start of the file.
    pub offset: u64,
    /// Length of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Length of one row (`dims[0]`).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }
    /// Number of rows (the product of the other dimensions).
    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file; tensor data is borrowed from the mapping.
pub struct GgufFile {
    bytes: Bytes,
    version: u32,
    metadata: HashMap<String, Value>,
    keys: Vec<String>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.keys.len())
            .field("tensors", &self.tensors.len())
            .field("bytes", &self.bytes.as_slice().len())
            .finish()
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let len = self.b.len() as u64;
        let start = self.pos as u64;
        let end =
            start
                .checked_add(n)
                .filter(|&e| e <= len)
                .ok_or_else(|| LlmError::Truncated {
                    what: what(),
                    start,
                    end: start.saturating_add(n),
                    len,
                })?;
        let s = &self.b[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(what)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec())
            .map_err(|_| LlmError::Corrupted(format!("{} is not valid UTF-8", what())))
    }
    fn value(&mut self, ty: u32, what: &dyn Fn() -> String, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(LlmError::Corrupted(format!(
                        "{}: bool byte {b} is neither 0 nor 1",
                        what()
                    )))
                }
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth > 4 {
                    return Err(LlmError::Corrupted(format!(
                        "{}: arrays nested deeper than 4",
                        what()
                    )));
                }
                let item = self.u32(what)?;
                let n = self.u64(what)?;
                // Every item takes at least one byte: a count beyond the rest of the
                // file is corruption, not a reason to allocate.
                let left = (self.b.len() - self.pos) as u64;
                if n > left {
                    return Err(LlmError::Truncated {
                        what: format!("{} ({n} array items)", what()),
                        start: self.pos as u64,
                        end: self.pos as u64 + n,
                        len: self.b.len() as u64,
                    });
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(item, what, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t => {
                return Err(LlmError::Corrupted(format!(
                    "{}: unknown metadata value type {t}",
                    what()
                )))
            }
        })
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only and private to this process; the file must not
        // be truncated by another process while it is mapped (the usual contract of
        // memory-mapped model files). Every access is bounds-checked against the length
        // the mapping had when it was made.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Bytes::Mapped(map))
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<Self> {
        let b = bytes.as_slice();
        let mut r = Reader { b, pos: 0 };
        let magic = r.u32(&|| "the magic number".into())?;
        if magic != GGUF_MAGIC {
            return Err(LlmError::Corrupted(format!(
                "magic is {magic:#010x}, not GGUF ({GGUF_MAGIC:#010x}): not a GGUF file"
            )));
        }
        let version = r.u32(&|| "the version".into())?;
        if !(2..=3).contains(&version) {
            return Err(LlmError::Corrupted(format!(
                "GGUF version {version} (this reader knows 2 and 3)"
            )));
        }
        let n_tensors = r.u64(&|| "the tensor count".into())?;
        let n_kv = r.u64(&|| "the metadata count".into())?;
        // Each entry takes well over one byte: counts beyond the file are corruption.
        for (n, what) in [(n_tensors, "tensor"), (n_kv, "metadata")] {
            if n > b.len() as u64 {
                return Err(LlmError::Corrupted(format!(
                    "{what} count {n} exceeds the file's {} bytes",
                    b.len()
                )));
            }
        }
        let mut metadata = HashMap::new();
        let mut keys = Vec::new();
        for i in 0..n_kv {
            let key = r.string(&|| format!("metadata key #{i}"))?;
            let what = || format!("metadata value `{key}`");
            let ty = r.u32(&what)?;
            let v = r.value(ty, &what, 0)?;
            if metadata.insert(key.clone(), v).is_some() {
                return Err(LlmError::Corrupted(format!(
                    "metadata key `{key}` repeated"
                )));
            }
            keys.push(key);
        }
        let mut infos = Vec::new();
        for i in 0..n_tensors {
            let name = r.string(&|| format!("tensor #{i}'s name"))?;
            let what = || format!("tensor `{name}`'s description");
            let nd = r.u32(&what)?;
            if nd == 0 || nd > 4 {
                return Err(LlmError::Corrupted(format!(
                    "tensor `{name}` has {nd} dimensions (1 to 4 allowed)"
                )));
            }
            let mut dims = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                dims.push(r.u64(&what)?);
            }
            let type_id = r.u32(&what)?;
            let offset = r.u64(&what)?;
            infos.push((name, dims, type_id, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(LlmError::Corrupted(format!(
                        "general.alignment {v:?} is not a power of two"
                    )))
                }
            },
        };
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        let len = b.len() as u64;
        let mut tensors = Vec::with_capacity(infos.len());
        let mut by_name = HashMap::new();
        for (name, dims, type_id, rel) in infos {
            let dtype = GgmlType::from_id(type_id).ok_or_else(|| LlmError::UnknownTensorType {
                tensor: name.clone(),
                type_id,
            })?;
            let elements = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| {
                    LlmError::Corrupted(format!("tensor `{name}`: dimensions {dims:?} overflow"))
                })?;
            if dims[0] % dtype.block_len() as u64 != 0 {
                return Err(LlmError::Corrupted(format!(
                    "tensor `{name}`: row length {} is not a multiple of {}'s block of {}",
                    dims[0],
                    dtype.name(),
                    dtype.block_len()
                )));
            }
            let size = (elements / dtype.block_len() as u64)
                .checked_mul(dtype.block_bytes() as u64)
                .ok_or_else(|| LlmError::Corrupted(format!("tensor `{name}`: size overflows")))?;
            if rel % alignment != 0 {
                return Err(LlmError::Corrupted(format!(
                    "tensor `{name}`: offset {rel} is not aligned to {alignment}"
                )));
            }
            let offset = data_offset.checked_add(rel).ok_or_else(|| {
                LlmError::Corrupted(format!("tensor `{name}`: offset {rel} overflows"))
            })?;
            let end = offset.saturating_add(size);
            if end > len {
                return Err(LlmError::Truncated {
                    what: format!("tensor `{name}` ({} {dims:?})", dtype.name()),
                    start: offset,
                    end,
                    len,
                });
            }
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(LlmError::Corrupted(format!("tensor `{name}` repeated")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                dtype,
                offset,
                size,
            });
        }
        Ok(Self {
            bytes,
            version,
            metadata,
            keys,
            tensors,
            by_name,
            data_offset,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Byte offset where tensor data starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Metadata keys, in file order.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The value of `key`, or [`LlmError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| LlmError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, v: &Value, expected: &'static str) -> LlmError {
        LlmError::WrongType {
            key: key.to_string(),
            found: v.type_name(),
            expected,
        }
    }

    /// An unsigned integer key that fits a u32.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| Self::wrong(key, v, "an unsigned 32-bit integer"))
    }

    /// A float key (an integer is accepted).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| Self::wrong(key, v, "a number"))
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(Self::wrong(key, v, "a string")),
        }
    }

    /// An array key.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(Self::wrong(key, v, "an array")),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get_array(key)?
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                v => Err(Self::wrong(key, v, "an array of strings")),
            })
            .collect()
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, or [`LlmError::MissingTensor`].
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| LlmError::MissingTensor(name.to_string()))
    }

    /// The raw bytes of a tensor (bounds were checked when the file was parsed).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.bytes.as_slice()[t.offset as usize..(t.offset + t.size) as usize]
    }

    /// Total bytes of tensor data.
    pub fn tensor_data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size).sum()
    }
}

/// Writes GGUF images: for tests and tools that make small model files.
#[derive(Debug, Default)]
pub struct GgufWriter {
    kv: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    alignment: u64,
}

impl GgufWriter {
    /// An empty file with the default alignment.
    pub fn new() -> Self {
        Self {
            alignment: DEFAULT_ALIGNMENT,
            ..Default::default()
        }
    }

    /// Adds a metadata entry.
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        if key == "general.alignment" {
            if let Some(a) = v.as_u64() {
                self.alignment = a.max(1);
            }
        }
        self.kv.push((key.to_string(), v));
        self
    }

    /// Adds a tensor of type `type_id` with dims (ggml order) and raw data bytes.
    pub fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), type_id, data));
        self
    }

    fn put_value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.push(*x as u8),
            Value::U16(x) => out.extend(x.to_le_bytes()),
            Value::I16(x) => out.extend(x.to_le_bytes()),
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::I32(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::String(s) => {
                out.extend((s.len() as u64).to_le_bytes());
                out.extend(s.as_bytes());
            }
            Value::Array(a) => {
                let item = a.first().map_or(4, Self::type_id);
                out.extend(item.to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for x in a {
                    Self::put_value(out, x);
                }
            }
            Value::U64(x) => out.extend(x.to_le_bytes()),
            Value::I64(x) => out.extend(x.to_le_bytes()),
            Value::F64(x) => out.extend(x.to_le_bytes()),
        }
    }

    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(GGUF_MAGIC.to_le_bytes());
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            Self::put_value(&mut out, &Value::String(k.clone()));
            out.extend(Self::type_id(v).to_le_bytes());
            Self::put_value(&mut out, v);
        }
        let a = self.alignment;
        let mut rel = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            Self::put_value(&mut out, &Value::String(name.clone()));
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(rel.to_le_bytes());
            offsets.push(rel);
            rel = (rel + data.len() as u64).div_ceil(a) * a;
        }
        let start = (out.len() as u64).div_ceil(a) * a;
        out.resize(start as usize, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize((start + off) as usize, 0);
            out.extend(data);
        }
        out
    }
}
