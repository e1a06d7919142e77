//! No import cycles between the modules of any crate in the workspace.
//!
//! Every `crate::…`, `super::…` and `self::…` path in each crate's `src/` (outside
//! comments and string literals, `use` trees included) is a reference from the module
//! it appears in to the module it names. A reference between two modules that are not
//! ancestor and descendant of each other is an edge between their two sibling
//! ancestors under the common parent (`crate::a::x` → `crate::b::y` is `a → b`), so a
//! cycle shows at the level where it happens. Any cycle fails the test, naming the
//! modules and one reference of each edge.
//!
//! Run: `cargo test -p ringkernel-core --test module_cycles`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside one crate (`[]` is the crate root).
type ModPath = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Punct(char),
}

/// Tokens of a Rust source with their line numbers: identifiers and punctuation only;
/// comments, string/char/byte literals, numbers and lifetimes are dropped.
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0usize, 1usize, Vec::new());
    let at = |j: usize| c.get(j).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            // Block comments nest in Rust.
            let mut depth = 0usize;
            loop {
                if i >= c.len() {
                    break;
                }
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' || ((ch == 'r' || ch == 'b') && raw_or_byte_string(&c, i)) {
            // Plain, byte and raw strings: skip to the matching end.
            let mut j = i;
            while c[j] != '"' && c[j] != '#' {
                j += 1; // the `b`/`r`/`br` prefix
            }
            let hashes = c[j..].iter().take_while(|&&x| x == '#').count();
            let raw = hashes > 0 || (j > i && c[j - 1] == 'r');
            j += hashes + 1; // past the opening quote
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '\n' {
                    line += 1;
                }
                if !raw && c[j] == '\\' {
                    j += 2;
                    continue;
                }
                if c[j] == '"' && c[j + 1..].iter().take(hashes).all(|&x| x == '#') {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime/label ('a).
            if at(i + 1) == '\\' {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[s..i].iter().collect()), line));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                i += 1;
            }
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Whether `c[i..]` starts a byte or raw string (`b"`, `r"`, `r#"`, `br"`, `br#"`).
fn raw_or_byte_string(c: &[char], i: usize) -> bool {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return false; // inside an identifier
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) == Some(&'r') {
        j += 1;
        while c.get(j) == Some(&'#') {
            j += 1;
        }
    }
    j > i && c.get(j) == Some(&'"')
}

/// A reference found in a file: from module, absolute target path, line.
#[derive(Debug, Clone)]
struct Ref {
    from: ModPath,
    to: ModPath,
    file: String,
    line: usize,
}

fn is_ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn is_punct(t: Option<&(Tok, usize)>, p: char) -> bool {
    matches!(t, Some((Tok::Punct(x), _)) if *x == p)
}

fn is_path_sep(toks: &[(Tok, usize)], i: usize) -> bool {
    is_punct(toks.get(i), ':') && is_punct(toks.get(i + 1), ':')
}

/// Parses a path (or `use` tree) whose first segment is at `i`; pushes every complete
/// path (segments as written) to `out`. Returns the index after it.
fn parse_tree(
    toks: &[(Tok, usize)],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match is_ident(toks.get(i)) {
            Some(s) => {
                path.push(s.to_string());
                i += 1;
            }
            None if is_punct(toks.get(i), '*') => {
                i += 1;
                break;
            }
            None if is_punct(toks.get(i), '{') => {
                i += 1;
                while i < toks.len() && !is_punct(toks.get(i), '}') {
                    i = parse_tree(toks, i, &path, out);
                    if is_punct(toks.get(i), ',') {
                        i += 1;
                    } else if !is_punct(toks.get(i), '}') {
                        i += 1; // `as` renames and anything unexpected
                    }
                }
                return i + 1;
            }
            None => break,
        }
        if is_path_sep(toks, i) {
            i += 2;
        } else {
            break;
        }
    }
    if !path.is_empty() {
        out.push(path);
    }
    i
}

/// The module a file defines, from its path under `src/` (`None` for `src/bin/…`).
fn file_module(rel: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().map(String::as_str) == Some("bin") {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if !(parts.is_empty() && (stem == "lib" || stem == "main")) && stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// Every reference in one file, and the inline modules (`mod x { … }`) it defines.
fn scan_file(
    file: &str,
    module: &ModPath,
    src: &str,
    refs: &mut Vec<Ref>,
    mods: &mut BTreeSet<ModPath>,
) {
    let toks = tokenize(src);
    // Inline modules open at a brace depth and close with it.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let Some(name) = is_ident(toks.get(i + 1)) {
                    if is_punct(toks.get(i + 2), '{') {
                        depth += 1;
                        inline.push((name.to_string(), depth));
                        let m = here(module, &inline);
                        mods.insert(m);
                        i += 3;
                        continue;
                    }
                }
            }
            Tok::Ident(first) if (first == "crate" || first == "super" || first == "self") => {
                let after_sep = i >= 2 && is_path_sep(&toks, i - 2);
                let macro_var = i >= 1 && is_punct(toks.get(i - 1), '$');
                if !after_sep && !macro_var && is_path_sep(&toks, i + 1) {
                    let line = toks[i].1;
                    let mut paths = Vec::new();
                    let next = parse_tree(&toks, i, &[], &mut paths);
                    let from = here(module, &inline);
                    for p in paths {
                        if let Some(to) = absolute(&from, &p) {
                            refs.push(Ref {
                                from: from.clone(),
                                to,
                                file: file.to_string(),
                                line,
                            });
                        }
                    }
                    i = next;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// The module at a point of a file: the file's module and the inline modules open there.
fn here(module: &ModPath, inline: &[(String, usize)]) -> ModPath {
    let mut m = module.clone();
    m.extend(inline.iter().map(|(n, _)| n.clone()));
    m
}

/// `crate::a::b`, `super::a`, `self::a` from module `from`, as a path from the root.
fn absolute(from: &ModPath, path: &[String]) -> Option<ModPath> {
    let mut segs = path.iter().peekable();
    let mut base = match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
            Vec::new()
        }
        _ => from.clone(),
    };
    while let Some(s) = segs.peek() {
        match s.as_str() {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        segs.next();
    }
    base.extend(segs.cloned());
    Some(base)
}

/// The longest prefix of `path` that is a known module.
fn owning_module(path: &ModPath, mods: &BTreeSet<ModPath>) -> ModPath {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| mods.contains(p))
        .unwrap_or_default()
}

/// A cycle: its modules, and one reference for each edge between them.
#[derive(Debug)]
struct Cycle {
    modules: Vec<String>,
    evidence: Vec<String>,
}

/// Finds the module cycles of one crate, given its `src/` files as (path under `src/`,
/// contents).
fn find_cycles(files: &[(PathBuf, String)]) -> Vec<Cycle> {
    let mut mods = BTreeSet::new();
    let mut refs = Vec::new();
    for (rel, src) in files {
        let Some(m) = file_module(rel) else { continue };
        mods.insert(m.clone());
        scan_file(&rel.to_string_lossy(), &m, src, &mut refs, &mut mods);
    }
    // Edges between sibling modules, with one reference each as evidence.
    let mut edges: BTreeMap<(ModPath, ModPath), String> = BTreeMap::new();
    for r in &refs {
        let to = owning_module(&r.to, &mods);
        let from = &r.from;
        let k = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if k == from.len() || k == to.len() {
            continue; // the same module, an ancestor or a descendant
        }
        edges
            .entry((from[..=k].to_vec(), to[..=k].to_vec()))
            .or_insert_with(|| {
                format!(
                    "{}:{}: {} -> {}",
                    r.file,
                    r.line,
                    from.join("::"),
                    r.to.join("::")
                )
            });
    }
    // Strongly connected components (Tarjan) of more than one module.
    let nodes: Vec<ModPath> = edges
        .keys()
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let index_of = |m: &ModPath| nodes.binary_search(m).unwrap();
    let mut adj = vec![Vec::new(); nodes.len()];
    for (a, b) in edges.keys() {
        adj[index_of(a)].push(index_of(b));
    }
    let sccs = tarjan(&adj);
    sccs.into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let set: BTreeSet<usize> = c.iter().copied().collect();
            let evidence = edges
                .iter()
                .filter(|((a, b), _)| set.contains(&index_of(a)) && set.contains(&index_of(b)))
                .map(|(_, e)| e.clone())
                .collect();
            let mut modules: Vec<String> = c
                .iter()
                .map(|&n| format!("crate::{}", nodes[n].join("::")))
                .collect();
            modules.sort();
            Cycle { modules, evidence }
        })
        .collect()
}

fn tarjan(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for w in s.adj[v].clone() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let n = adj.len();
    let mut s = State {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

fn rust_files(dir: &Path, base: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, base, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let src = std::fs::read_to_string(&p).unwrap();
            out.push((p.strip_prefix(base).unwrap().to_path_buf(), src));
        }
    }
}

fn files(list: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    list.iter()
        .map(|(p, s)| (PathBuf::from(p), s.to_string()))
        .collect()
}

#[test]
fn workspace_has_no_module_cycles() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let mut report = String::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&crates)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let mut fs = Vec::new();
        rust_files(&src, &src, &mut fs);
        checked += 1;
        for c in find_cycles(&fs) {
            report += &format!(
                "\n{}: import cycle between {}\n  {}",
                dir.file_name().unwrap().to_string_lossy(),
                c.modules.join(", "),
                c.evidence.join("\n  ")
            );
        }
    }
    assert!(
        checked >= 2,
        "found only {checked} crates under {}",
        crates.display()
    );
    assert!(report.is_empty(), "module import cycles:{report}");
}

#[test]
fn a_planted_cycle_is_found() {
    // a -> b (grouped use), b -> c (super path in an inline module), c -> a (path
    // in an expression): one cycle of three.
    let fs = files(&[
        ("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;"),
        ("a.rs", "use crate::{b::{Thing as T}, d};\npub struct A;"),
        (
            "b/mod.rs",
            "pub mod inner;\npub struct Thing;\n#[cfg(test)]\nmod tests { use super::*; }",
        ),
        (
            "b/inner.rs",
            "mod x { fn f() { let _ = super::super::super::c::g(); } }",
        ),
        ("c.rs", "pub fn g() -> crate::a::A { crate::a::A }"),
        ("d.rs", "pub fn h() {}"),
    ]);
    let cycles = find_cycles(&fs);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert_eq!(cycles[0].modules, ["crate::a", "crate::b", "crate::c"]);
    assert_eq!(cycles[0].evidence.len(), 3, "{cycles:?}");
}

#[test]
fn a_two_module_cycle_in_a_nested_module_is_found() {
    let fs = files(&[
        ("lib.rs", "mod q;"),
        ("q/mod.rs", "mod x; mod y;"),
        ("q/x.rs", "use super::y::Y; pub struct X;"),
        ("q/y.rs", "pub struct Y(pub crate::q::x::X);"),
    ]);
    let cycles = find_cycles(&fs);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert_eq!(cycles[0].modules, ["crate::q::x", "crate::q::y"]);
}

#[test]
fn comments_strings_parents_and_macros_are_not_references() {
    let fs = files(&[
        ("lib.rs", "pub mod a; pub mod b;\npub use a::A;"),
        (
            "a.rs",
            "pub struct A;\nuse crate::b::B;\nmod child { use super::A; use crate::a::A as Z; }",
        ),
        (
            "b.rs",
            concat!(
                "//! See [`A`](crate::a::A).\n",
                "/* crate::a::A /* nested crate::a */ */\n",
                "pub struct B;\n",
                "const S: &str = \"crate::a::A\";\n",
                "const R: &str = r#\"crate::a::A \"quoted\" \"#;\n",
                "const C: char = '\\'';\n",
                "fn f<'x>(_: &'x u8) {}\n",
                "macro_rules! m { () => { $crate::a::A } }\n",
                "pub(crate) fn g() {}\n",
                "use ::std::vec::Vec as V;\n",
            ),
        ),
    ]);
    let cycles = find_cycles(&fs);
    assert!(cycles.is_empty(), "{cycles:?}");
    // The same files with a real reference back from b to a: now a cycle.
    let mut fs = fs;
    fs[2]
        .1
        .push_str("fn back() -> crate::a::A { crate::a::A }\n");
    assert_eq!(find_cycles(&fs).len(), 1);
}
