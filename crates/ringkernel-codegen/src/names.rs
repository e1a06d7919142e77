//! Identifiers: Rust names that are keywords or built-ins in CUDA C or WGSL get a trailing
//! `_`; the `rk_` prefix belongs to the translator.

use std::collections::HashSet;

/// Words that cannot be used as identifiers in CUDA C or WGSL (keywords, reserved words,
/// type names and the built-in functions the translator emits). The same renaming is used
/// for both targets.
const RESERVED: &[&str] = &[
    // C / C++ / CUDA
    "auto",
    "bool",
    "case",
    "char",
    "class",
    "const",
    "default",
    "delete",
    "do",
    "double",
    "enum",
    "extern",
    "float",
    "friend",
    "goto",
    "inline",
    "int",
    "long",
    "namespace",
    "new",
    "operator",
    "private",
    "protected",
    "public",
    "register",
    "restrict",
    "short",
    "signed",
    "sizeof",
    "static",
    "switch",
    "template",
    "this",
    "typedef",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "warpSize",
    "NULL",
    "main",
    "typename",
    "explicit",
    "export",
    "mutable",
    "throw",
    "try",
    "catch",
    "signed",
    "asm",
    "size_t",
    // WGSL
    "var",
    "let",
    "fn",
    "alias",
    "array",
    "atomic",
    "bitcast",
    "break",
    "continue",
    "continuing",
    "discard",
    "else",
    "enable",
    "false",
    "for",
    "function",
    "if",
    "loop",
    "override",
    "ptr",
    "requires",
    "return",
    "sampler",
    "storage",
    "struct",
    "true",
    "uniform",
    "while",
    "workgroup",
    "diagnostic",
    "const_assert",
    "f16",
    "f32",
    "i32",
    "u32",
    "vec2",
    "vec3",
    "vec4",
    "mat2x2",
    "mat3x3",
    "mat4x4",
    "texture_2d",
    "read",
    "write",
    "read_write",
    "private",
    "handle",
    "self",
    "super",
    "target",
    "meta",
    "module",
    "null",
    "package",
    "std",
    "unless",
    "yield",
    "with",
    "where",
    "type",
    "static_assert",
    "await",
    "async",
    "move",
    "impl",
    "mod",
    "use",
    "pub",
    "mut",
    "crate",
    // built-in functions emitted by the translator
    "abs",
    "acos",
    "asin",
    "atan",
    "atan2",
    "ceil",
    "clamp",
    "cos",
    "cosh",
    "exp",
    "exp2",
    "floor",
    "fma",
    "log",
    "log2",
    "max",
    "min",
    "pow",
    "select",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
    "sqrtf",
    "expf",
    "exp2f",
    "logf",
    "log2f",
    "sinf",
    "cosf",
    "tanf",
    "tanhf",
    "sinhf",
    "coshf",
    "asinf",
    "acosf",
    "atanf",
    "atan2f",
    "powf",
    "fabs",
    "fabsf",
    "fmin",
    "fminf",
    "fmax",
    "fmaxf",
    "fmaf",
    "floorf",
    "ceilf",
    "truncf",
    "fmod",
    "fmodf",
];

/// Allocates the emitted names of one kernel: unique across the whole function (so that
/// Rust shadowing, which C and WGSL forbid within a scope, becomes a new name).
#[derive(Debug, Default)]
pub(crate) struct Names {
    used: HashSet<String>,
}

impl Names {
    /// Reserves a translator-made name (no renaming).
    pub(crate) fn reserve(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }

    /// The emitted name for the Rust identifier `ident`, unique in this kernel.
    pub(crate) fn fresh(&mut self, ident: &syn::Ident) -> syn::Result<String> {
        use syn::ext::IdentExt;
        let raw = ident.unraw().to_string();
        if raw.starts_with("rk_") {
            return Err(syn::Error::new_spanned(
                ident,
                "names starting with `rk_` are reserved by the kernel translator; rename it",
            ));
        }
        let mut base = if raw.starts_with("__") {
            format!("v{raw}")
        } else {
            raw
        };
        if RESERVED.contains(&base.as_str()) {
            base.push('_');
        }
        let mut name = base.clone();
        let mut n = 1;
        while self.used.contains(&name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        self.used.insert(name.clone());
        Ok(name)
    }

    /// A fresh translator temporary `rk_<what><n>`.
    pub(crate) fn temp(&mut self, what: &str) -> String {
        let mut n = 0;
        loop {
            let name = format!("rk_{what}{n}");
            if self.used.insert(name.clone()) {
                return name;
            }
            n += 1;
        }
    }

    /// Whether `name` is a reserved word of either target.
    pub(crate) fn is_reserved(name: &str) -> bool {
        RESERVED.contains(&name)
    }
}
