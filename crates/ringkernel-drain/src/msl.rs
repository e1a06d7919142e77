//! A small reader for the entry-point signatures of naga-generated MSL.
//!
//! naga writes each compute entry point as
//!
//! ```text
//! kernel void name(
//!   metal::uint3 gid [[thread_position_in_grid]]
//! , constant ElementwiseParams& p [[buffer(0)]]
//! , device metal::float const* a [[buffer(1)]]
//! ) {
//! ```
//!
//! [`parse_entry_points`] recovers every parameter with its `[[...]]` attribute, so the
//! Linux tests can check that the buffer indices in the MSL the Metal backend compiles
//! are the ones its host code binds — without a Mac.

use ringkernel_core::error::{Error, Result};

/// The address space of an entry-point parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressSpace {
    /// `device` (storage buffers).
    Device,
    /// `constant` (uniform buffers).
    Constant,
    /// `threadgroup` memory.
    Threadgroup,
    /// Anything else (built-in values, stage inputs).
    Other,
}

/// One parameter of an MSL entry point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MslParam {
    /// Parameter name as written (naga appends `_` to names MSL reserves).
    pub name: String,
    /// Type text before the name, including address space and qualifiers.
    pub ty: String,
    /// Address space.
    pub space: AddressSpace,
    /// Whether the pointee is `const` (read-only).
    pub read_only: bool,
    /// `N` of a `[[buffer(N)]]` attribute.
    pub buffer: Option<u32>,
    /// The attribute text between `[[` and `]]`, if any.
    pub attribute: Option<String>,
}

impl MslParam {
    /// The name with naga's reserved-word suffix removed (`out_` → `out`).
    pub fn base_name(&self) -> &str {
        self.name.trim_end_matches('_')
    }
}

/// One `kernel void` function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MslEntryPoint {
    /// Function name.
    pub name: String,
    /// Parameters in order.
    pub params: Vec<MslParam>,
}

impl MslEntryPoint {
    /// `(buffer index, parameter)` of every buffer parameter, by index.
    pub fn buffers(&self) -> Vec<(u32, &MslParam)> {
        let mut v: Vec<_> = self
            .params
            .iter()
            .filter_map(|p| p.buffer.map(|b| (b, p)))
            .collect();
        v.sort_by_key(|(b, _)| *b);
        v
    }

    /// The parameter bound at `[[buffer(index)]]`.
    pub fn buffer(&self, index: u32) -> Option<&MslParam> {
        self.params.iter().find(|p| p.buffer == Some(index))
    }
}

fn malformed(what: &str) -> Error {
    Error::invalid(format!("malformed MSL entry point: {what}"))
}

/// Splits `s` at commas that are not nested in `()`, `[]` or `<>`.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' | '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_param(text: &str) -> Result<MslParam> {
    let text = text.trim();
    let (decl, attribute) = match text.find("[[") {
        Some(at) => {
            let end = text[at..]
                .find("]]")
                .ok_or_else(|| malformed("unterminated [[attribute"))?
                + at;
            (
                text[..at].trim(),
                Some(text[at + 2..end].trim().to_string()),
            )
        }
        None => (text, None),
    };
    let name_start = decl
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map(|i| i + 1)
        .unwrap_or(0);
    let name = decl[name_start..].to_string();
    let ty = decl[..name_start].trim().to_string();
    if name.is_empty() || ty.is_empty() {
        return Err(malformed(&format!("parameter {text:?}")));
    }
    let first = ty.split_whitespace().next().unwrap_or("");
    let space = match first {
        "device" => AddressSpace::Device,
        "constant" => AddressSpace::Constant,
        "threadgroup" => AddressSpace::Threadgroup,
        _ => AddressSpace::Other,
    };
    let read_only = space == AddressSpace::Constant
        || ty
            .split(|c: char| c.is_whitespace() || c == '&' || c == '*')
            .any(|w| w == "const");
    let buffer = match &attribute {
        Some(a) if a.starts_with("buffer(") => {
            let n = a["buffer(".len()..].trim_end_matches(')').trim();
            Some(
                n.parse::<u32>()
                    .map_err(|_| malformed(&format!("buffer index in {a:?}")))?,
            )
        }
        _ => None,
    };
    Ok(MslParam {
        name,
        ty,
        space,
        read_only,
        buffer,
        attribute,
    })
}

/// Every `kernel void` entry point of an MSL source, with its parameters.
/// [`Error::InvalidArgument`] when a signature cannot be read.
pub fn parse_entry_points(msl: &str) -> Result<Vec<MslEntryPoint>> {
    let mut out = Vec::new();
    let mut rest = msl;
    while let Some(at) = rest.find("kernel void ") {
        let after = &rest[at + "kernel void ".len()..];
        let open = after
            .find('(')
            .ok_or_else(|| malformed("no parameter list"))?;
        let name = after[..open].trim().to_string();
        let body = &after[open + 1..];
        let mut depth = 1i32;
        let mut close = None;
        for (i, c) in body.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close =
            close.ok_or_else(|| malformed(&format!("unbalanced parameter list of {name}")))?;
        let list = &body[..close];
        let params = if list.trim().is_empty() {
            Vec::new()
        } else {
            split_top_level(list)
                .into_iter()
                .map(parse_param)
                .collect::<Result<Vec<_>>>()?
        };
        out.push(MslEntryPoint { name, params });
        rest = &body[close..];
    }
    Ok(out)
}

/// What the host binds at one Metal buffer index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSlot {
    /// `[[buffer(index)]]`.
    pub index: u32,
    /// Name of the WGSL global the host means to feed.
    pub name: &'static str,
    /// Whether the kernel writes it.
    pub writes: bool,
}

/// Checks an entry point against the host's binding table: every buffer the MSL
/// expects must be in `host` at the same index, with the same name and with matching
/// mutability, and every buffer the host marks as written must be in the MSL.
/// The first disagreement is [`Error::Device`] naming the kernel, index and names.
pub fn check_host_bindings(ep: &MslEntryPoint, host: &[HostSlot]) -> Result<()> {
    let bad = |msg: String| Err(Error::Device(format!("MSL entry point {}: {msg}", ep.name)));
    for (index, p) in ep.buffers() {
        let Some(h) = host.iter().find(|h| h.index == index) else {
            return bad(format!(
                "[[buffer({index})]] ({}) is not bound by the host",
                p.name
            ));
        };
        if p.base_name() != h.name {
            return bad(format!(
                "[[buffer({index})]] is {} in MSL but the host binds {} there",
                p.name, h.name
            ));
        }
        if h.writes == p.read_only {
            return bad(format!(
                "[[buffer({index})]] {}: MSL read_only = {}, host expects writes = {}",
                p.name, p.read_only, h.writes
            ));
        }
    }
    for h in host.iter().filter(|h| h.writes) {
        if ep.buffer(h.index).is_none() {
            return bad(format!(
                "output {} at [[buffer({})]] is missing from the MSL",
                h.name, h.index
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
struct P { uint n; };
kernel void unary_(
  metal::uint3 gid [[thread_position_in_grid]]
, constant P& p [[buffer(0)]]
, device metal::array<float, 1> const& a [[buffer(1)]]
, device type_3& out_ [[buffer(3)]]
, threadgroup metal::array<float, 256>& tile
) {
    out_[gid.x] = a[gid.x];
}
kernel void empty() {}
"#;

    #[test]
    fn reads_signatures() {
        let eps = parse_entry_points(SAMPLE).unwrap();
        assert_eq!(eps.len(), 2);
        let ep = &eps[0];
        assert_eq!(ep.name, "unary_");
        assert_eq!(ep.params.len(), 5);
        let b: Vec<_> = ep
            .buffers()
            .iter()
            .map(|(i, p)| (*i, p.base_name().to_string(), p.read_only))
            .collect();
        assert_eq!(
            b,
            vec![
                (0, "p".into(), true),
                (1, "a".into(), true),
                (3, "out".into(), false)
            ]
        );
        assert_eq!(
            ep.params[0].attribute.as_deref(),
            Some("thread_position_in_grid")
        );
        assert_eq!(ep.params[4].space, AddressSpace::Threadgroup);
        assert!(eps[1].params.is_empty());
    }

    #[test]
    fn host_table_mismatches_are_reported() {
        let ep = &parse_entry_points(SAMPLE).unwrap()[0];
        let good = [
            HostSlot {
                index: 0,
                name: "p",
                writes: false,
            },
            HostSlot {
                index: 1,
                name: "a",
                writes: false,
            },
            HostSlot {
                index: 3,
                name: "out",
                writes: true,
            },
        ];
        check_host_bindings(ep, &good).unwrap();
        let mut swapped = good;
        swapped[1].index = 2;
        let e = check_host_bindings(ep, &swapped).unwrap_err();
        assert!(e.to_string().contains("buffer(1)"), "{e}");
        let mut wrong_name = good;
        wrong_name[2].name = "b";
        assert!(check_host_bindings(ep, &wrong_name).is_err());
        let mut ro = good;
        ro[2].writes = false;
        assert!(check_host_bindings(ep, &ro).is_err());
        let mut extra_out = good.to_vec();
        extra_out.push(HostSlot {
            index: 5,
            name: "more",
            writes: true,
        });
        assert!(check_host_bindings(ep, &extra_out).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse_entry_points("kernel void f(").is_err());
        assert!(parse_entry_points("kernel void f(device float* a [[buffer(x)]]) {}").is_err());
        assert!(parse_entry_points("kernel void f(int) {}").is_err());
        assert!(parse_entry_points("no kernels here").unwrap().is_empty());
    }
}
