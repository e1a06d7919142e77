//! Byte-level BPE (GPT-2 style) read from a GGUF file's `tokenizer.ggml.*` keys.
//!
//! Encoding: control tokens (`<|im_start|>`, ...) are split out first; the rest is cut
//! into pieces by the pre-tokenizer (for `tokenizer.ggml.pre = "smollm"`: every digit on
//! its own, then GPT-2's pattern), each piece's UTF-8 bytes are mapped to GPT-2's
//! printable byte alphabet and merged by rank.
//!
//! ```no_run
//! use ringkernel_llm::{gguf::GgufFile, tokenizer::Tokenizer};
//! let f = GgufFile::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(&f)?;
//! let ids = tok.encode("Hello world", true);
//! assert_eq!(tok.decode(&ids), "Hello world");
//! # Ok::<(), ringkernel_llm::LlmError>(())
//! ```

use crate::error::{LlmError, Result};
use crate::gguf::{GgufFile, Value};
use std::collections::HashMap;

/// GGUF token type of control tokens.
const TOKEN_TYPE_CONTROL: u64 = 3;
/// GGUF token type of user-defined tokens (also matched literally).
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// GPT-2's pre-tokenizer pattern, with `\s+(?!\S)` done by hand (see `pieces`).
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// A byte-level BPE tokenizer.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Literal tokens (control and user-defined), longest first.
    specials: Vec<(String, u32)>,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
    /// The token of each byte's character; a few control bytes may have none.
    byte_ids: [Option<u32>; 256],
    split_digits: bool,
    pattern: regex::Regex,
    bos: Option<u32>,
    eos: u32,
}

/// GPT-2's map from bytes to printable characters.
fn byte_alphabet() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).expect("latin-1")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("BMP")
        };
    }
    map
}

impl Tokenizer {
    /// Reads the vocabulary, token types, merges and special ids from a GGUF file.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let model = f.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(LlmError::InvalidArgument(format!(
                "tokenizer.ggml.model is `{model}`: only byte-level BPE (`gpt2`) is supported"
            )));
        }
        let tokens: Vec<String> = f
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let types: Vec<u64> = match f.get("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            _ => vec![1; tokens.len()],
        };
        let merges = f.get_str_array("tokenizer.ggml.merges")?;
        let pre = f
            .get("tokenizer.ggml.pre")
            .and_then(|v| match v {
                Value::String(s) => Some(s.as_str()),
                _ => None,
            })
            .unwrap_or("default");
        let eos = f.get_u32("tokenizer.ggml.eos_token_id")?;
        let bos = f.get_u32("tokenizer.ggml.bos_token_id").ok();
        let add_bos = matches!(
            f.get("tokenizer.ggml.add_bos_token"),
            Some(Value::Bool(true))
        );
        Self::new(
            tokens,
            &types,
            &merges,
            pre == "smollm",
            if add_bos { bos } else { None },
            eos,
        )
    }

    /// Builds a tokenizer from its parts: `types` as GGUF token types (3 control, 4 user
    /// defined: matched literally), `merges` as `"left right"` strings in rank order.
    pub fn new(
        tokens: Vec<String>,
        types: &[u64],
        merges: &[&str],
        split_digits: bool,
        bos: Option<u32>,
        eos: u32,
    ) -> Result<Self> {
        if u32::try_from(tokens.len()).is_err() {
            return Err(LlmError::InvalidArgument("vocabulary too large".into()));
        }
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let byte_to_char = byte_alphabet();
        let char_to_byte = byte_to_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let mut byte_ids = [None; 256];
        for (b, &c) in byte_to_char.iter().enumerate() {
            byte_ids[b] = ids.get(c.encode_utf8(&mut [0; 4]) as &str).copied();
        }
        if byte_ids.iter().filter(|i| i.is_some()).count() < 128 {
            return Err(LlmError::Corrupted(
                "the vocabulary lacks most single-byte tokens: not a byte-level BPE".into(),
            ));
        }
        let mut mtab = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| LlmError::Corrupted(format!("merge #{rank} `{m}` has no space")))?;
            let look = |s: &str| {
                ids.get(s).copied().ok_or_else(|| {
                    LlmError::Corrupted(format!(
                        "merge #{rank} `{m}`: `{s}` is not in the vocabulary"
                    ))
                })
            };
            let merged = format!("{a}{b}");
            mtab.entry((look(a)?, look(b)?))
                .or_insert((rank as u32, look(&merged)?));
        }
        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (t, &ty))| {
                (ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED) && !t.is_empty()
            })
            .map(|(i, (t, _))| (t.clone(), i as u32))
            .collect();
        specials.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        if eos as usize >= tokens.len() || bos.is_some_and(|b| b as usize >= tokens.len()) {
            return Err(LlmError::Corrupted(format!(
                "special token ids (bos {bos:?}, eos {eos}) outside the vocabulary of {}",
                tokens.len()
            )));
        }
        Ok(Self {
            tokens,
            ids,
            merges: mtab,
            specials,
            byte_to_char,
            char_to_byte,
            byte_ids,
            split_digits,
            pattern: regex::Regex::new(GPT2_PATTERN).expect("valid pattern"),
            bos,
            eos,
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// The beginning-of-text token [`Tokenizer::encode`] puts first (when the file asks
    /// for one).
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The id of a literal token (`<|im_end|>`), if in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// Whether `id` is a control/user-defined token.
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.iter().any(|&(_, i)| i == id)
    }

    /// Token ids for `text`. With `parse_special`, control tokens written in the text
    /// (`<|im_start|>`) become their ids; otherwise they are tokenized as plain text. A BOS
    /// token is prepended when the model file asks for one.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if let Some(b) = self.bos {
            out.push(b);
        }
        let mut rest = text;
        while !rest.is_empty() {
            let next = if parse_special {
                self.next_special(rest)
            } else {
                None
            };
            match next {
                Some((at, tok, id)) => {
                    self.encode_plain(&rest[..at], &mut out);
                    out.push(id);
                    rest = &rest[at + tok.len()..];
                }
                None => {
                    self.encode_plain(rest, &mut out);
                    break;
                }
            }
        }
        out
    }

    /// The first special token in `s`: (byte offset, token, id); longest wins at a tie.
    fn next_special<'a>(&'a self, s: &str) -> Option<(usize, &'a str, u32)> {
        let mut best: Option<(usize, &str, u32)> = None;
        for (t, id) in &self.specials {
            if let Some(at) = s.find(t.as_str()) {
                if best.is_none_or(|(b, _, _)| at < b) {
                    best = Some((at, t, *id));
                }
            }
        }
        best
    }

    /// Pre-tokenized pieces of `text`.
    pub fn pieces<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut chunks = Vec::new();
        if self.split_digits {
            let mut start = 0;
            for (i, c) in text.char_indices() {
                if c.is_numeric() {
                    if start < i {
                        chunks.push(&text[start..i]);
                    }
                    chunks.push(&text[i..i + c.len_utf8()]);
                    start = i + c.len_utf8();
                }
            }
            if start < text.len() {
                chunks.push(&text[start..]);
            }
        } else {
            chunks.push(text);
        }
        let mut out = Vec::new();
        for chunk in chunks {
            let mut pos = 0;
            while let Some(m) = self.pattern.find_at(chunk, pos) {
                let (s, mut e) = (m.start(), m.end());
                let piece = &chunk[s..e];
                // `\s+(?!\S)`: a run of more than one whitespace character followed by a
                // non-space gives its last character to what follows.
                if e < chunk.len() && piece.chars().all(char::is_whitespace) {
                    let last = piece.chars().next_back().map_or(0, char::len_utf8);
                    if piece.len() > last {
                        e -= last;
                    }
                }
                out.push(&chunk[s..e]);
                pos = e;
            }
        }
        out
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        for piece in self.pieces(text) {
            let whole: String = piece
                .bytes()
                .map(|b| self.byte_to_char[b as usize])
                .collect();
            if let Some(&id) = self.ids.get(&whole) {
                out.push(id);
                continue;
            }
            // A byte without a token (rare control characters) is dropped, as Hugging
            // Face's BPE without an unknown token does.
            let mut syms: Vec<u32> = piece
                .bytes()
                .filter_map(|b| self.byte_ids[b as usize])
                .collect();
            loop {
                let best = syms
                    .windows(2)
                    .enumerate()
                    .filter_map(|(i, w)| self.merges.get(&(w[0], w[1])).map(|&(r, m)| (r, i, m)))
                    .min();
                let Some((_, i, merged)) = best else { break };
                syms[i] = merged;
                syms.remove(i + 1);
            }
            out.extend(syms);
        }
    }

    /// The bytes token `id` stands for (control tokens: their text).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        if self.is_special(id) {
            return t.as_bytes().to_vec();
        }
        let mut bytes = Vec::with_capacity(t.len());
        for c in t.chars() {
            match self.char_to_byte.get(&c) {
                Some(&b) => bytes.push(b),
                None => bytes.extend(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        bytes
    }

    /// The text of `ids` (invalid UTF-8 replaced by U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.token_bytes(i)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Turns a stream of token ids into text pieces, holding back bytes of an incomplete
/// UTF-8 character until its last byte arrives.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// The text that token `id` completes (may be empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend(tok.token_bytes(id));
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            Err(e) if e.error_len().is_none() => {
                // An incomplete character at the end: emit what comes before it.
                let n = e.valid_up_to();
                let s = String::from_utf8_lossy(&self.pending[..n]).into_owned();
                self.pending.drain(..n);
                s
            }
            Err(_) => {
                let s = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                s
            }
        }
    }

    /// Whatever is still pending, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: the 256 byte characters, a few merges, one control token.
    fn toy() -> Tokenizer {
        let alpha = byte_alphabet();
        let mut tokens: Vec<String> = alpha.iter().map(|c| c.to_string()).collect();
        for t in ["he", "ll", "hell", "hello", "Ġw", "Ġwo", "<|end|>"] {
            tokens.push(t.to_string());
        }
        let mut types = vec![1u64; tokens.len()];
        *types.last_mut().unwrap() = 3;
        let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"];
        Tokenizer::new(tokens, &types, &merges, true, None, 0).unwrap()
    }

    #[test]
    fn merges_by_rank_and_round_trips() {
        let t = toy();
        let ids = t.encode("hello world<|end|>x", true);
        let hello = t.token_id("hello").unwrap();
        let gwo = t.token_id("Ġwo").unwrap();
        let end = t.token_id("<|end|>").unwrap();
        assert_eq!(ids[0], hello);
        assert_eq!(ids[1], gwo);
        assert!(ids.contains(&end));
        assert_eq!(t.decode(&ids), "hello world<|end|>x");
        // Without special parsing the control token is plain text.
        let plain = t.encode("<|end|>", false);
        assert!(!plain.contains(&end));
        assert_eq!(t.decode(&plain), "<|end|>");
    }

    #[test]
    fn pretokenizer_splits_like_gpt2_with_digits() {
        let t = toy();
        assert_eq!(
            t.pieces("I'm  at 123abc,  ok\n\nyes  "),
            vec![
                "I", "'m", " ", " at", " ", "1", "2", "3", "abc", ",", " ", " ok", "\n", "\n",
                "yes", "  "
            ]
        );
    }

    #[test]
    fn stream_decoder_holds_incomplete_characters() {
        let t = toy();
        let ids = t.encode("é€x", false);
        let mut d = StreamDecoder::new();
        let mut s = String::new();
        for &i in &ids {
            let piece = d.push(&t, i);
            assert!(!piece.contains('\u{FFFD}'));
            s += &piece;
        }
        s += &d.finish();
        assert_eq!(s, "é€x");
    }

    #[test]
    fn bad_merges_are_typed_errors() {
        let alpha = byte_alphabet();
        let tokens: Vec<String> = alpha.iter().map(|c| c.to_string()).collect();
        let types = vec![1u64; 256];
        let e = Tokenizer::new(vec!["x".into()], &types, &[], false, None, 0).unwrap_err();
        assert!(
            matches!(e, LlmError::Corrupted(ref m) if m.contains("byte-level")),
            "{e}"
        );
        let e = Tokenizer::new(tokens.clone(), &types, &["ab"], false, None, 0).unwrap_err();
        assert!(
            matches!(e, LlmError::Corrupted(ref m) if m.contains("no space")),
            "{e}"
        );
        let e = Tokenizer::new(tokens, &types, &["a b"], false, None, 0).unwrap_err();
        assert!(
            matches!(e, LlmError::Corrupted(ref m) if m.contains("`ab`")),
            "{e}"
        );
    }
}
