//! The GGUF reader on synthetic files (good, truncated, corrupted) and the block formats
//! against their definitions on random data of awkward sizes.

use half::{bf16, f16};
use ringkernel::compute::{Device, Tensor, WeightFormat};
use ringkernel_llm::gguf::{GgufFile, GgufWriter, Value};
use ringkernel_llm::quant::{
    dequantize, quantize_q4_1, quantize_q8_0, to_bf16_bytes, to_f16_bytes, GgmlType, QMatrix,
};
use ringkernel_llm::sample::Rng;
use ringkernel_llm::weights::HostMatrix;
use ringkernel_llm::LlmError;

fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.symmetric() * scale).collect()
}

fn sample_file() -> (GgufWriter, Vec<f32>) {
    let w = random(3 * 64, 1, 2.0);
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(2))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv(
            "list",
            Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
        )
        .tensor("w.q8", &[64, 3], 8, quantize_q8_0(&w))
        .tensor(
            "w.f32",
            &[5],
            0,
            [1f32, 2., 3., 4., 5.]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        );
    (g, w)
}

#[test]
fn reads_metadata_and_tensors() {
    let (g, w) = sample_file();
    let f = GgufFile::from_bytes(g.to_bytes()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_str_array("list").unwrap(), vec!["a", "bc"]);
    let t = f.tensor("w.q8").unwrap();
    assert_eq!((t.dtype, t.rows(), t.row_len()), (GgmlType::Q8_0, 3, 64));
    assert_eq!(t.offset % 32, 0);
    let m = QMatrix::new(t.dtype, t.rows(), t.row_len(), f.tensor_bytes(t)).unwrap();
    let back = m.to_f32();
    for (a, b) in w.iter().zip(&back) {
        assert!((a - b).abs() <= 2.0 / 127.0 * 0.5 + 1e-3, "{a} {b}");
    }
    let t = f.tensor("w.f32").unwrap();
    let mut out = [0f32; 5];
    dequantize(t.dtype, f.tensor_bytes(t), &mut out).unwrap();
    assert_eq!(out, [1., 2., 3., 4., 5.]);
    // The same through a memory map.
    let dir = std::env::temp_dir().join(format!("rk-llm-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("x.gguf");
    std::fs::write(&p, g.to_bytes()).unwrap();
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.tensors().len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn typed_errors_name_the_problem() {
    let (g, _) = sample_file();
    let good = g.to_bytes();
    // Every truncation is an error, never a panic.
    for cut in [0, 3, 7, 20, 40, 100, good.len() / 2, good.len() - 1] {
        let e = GgufFile::from_bytes(good[..cut].to_vec()).unwrap_err();
        assert!(matches!(e, LlmError::Truncated { .. }), "cut {cut}: {e}");
    }
    let e = GgufFile::from_bytes(good[..good.len() - 1].to_vec()).unwrap_err();
    assert!(e.to_string().contains("w.f32"), "{e}");
    let mut bad = good.clone();
    bad[0] = b'X';
    let e = GgufFile::from_bytes(bad).unwrap_err();
    assert!(
        matches!(e, LlmError::Corrupted(ref m) if m.contains("magic")),
        "{e}"
    );
    let mut bad = good.clone();
    bad[4] = 9;
    assert!(
        matches!(GgufFile::from_bytes(bad).unwrap_err(), LlmError::Corrupted(ref m) if m.contains("version"))
    );
    // A huge metadata count.
    let mut bad = good.clone();
    bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(bad).unwrap_err(),
        LlmError::Corrupted(_)
    ));
    // Unknown tensor type.
    let mut g2 = GgufWriter::new();
    g2.tensor("odd", &[32], 23, vec![0; 64]);
    let e = GgufFile::from_bytes(g2.to_bytes()).unwrap_err();
    assert!(
        matches!(e, LlmError::UnknownTensorType { ref tensor, type_id: 23 } if tensor == "odd"),
        "{e}"
    );
    // Row length not a multiple of the block.
    let mut g3 = GgufWriter::new();
    g3.tensor("short", &[20], 8, vec![0; 34]);
    assert!(
        matches!(GgufFile::from_bytes(g3.to_bytes()).unwrap_err(), LlmError::Corrupted(ref m) if m.contains("short"))
    );
    // Missing and mistyped keys.
    let f = GgufFile::from_bytes(good).unwrap();
    assert!(
        matches!(f.get_u32("llama.nope").unwrap_err(), LlmError::MissingKey(ref k) if k == "llama.nope")
    );
    assert!(matches!(
        f.get_u32("general.architecture").unwrap_err(),
        LlmError::WrongType { .. }
    ));
    assert!(matches!(
        f.tensor("nope").unwrap_err(),
        LlmError::MissingTensor(_)
    ));
    // Converts into the core error type.
    let core: ringkernel_core::Error = LlmError::MissingKey("k".into()).into();
    assert!(core.to_string().contains("`k`"));
}

/// Q4_1 and Q8_0 blocks decoded by the formula of the format, written out here in f64.
fn reference_dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f64> {
    let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f64();
    let mut out = Vec::with_capacity(n);
    match ty {
        GgmlType::Q4_1 => {
            for b in bytes.chunks_exact(20) {
                let (d, m) = (h(b, 0), h(b, 2));
                let q: Vec<u8> = (0..32)
                    .map(|j| {
                        if j < 16 {
                            b[4 + j] & 15
                        } else {
                            b[4 + j - 16] >> 4
                        }
                    })
                    .collect();
                out.extend(q.iter().map(|&q| q as f64 * d + m));
            }
        }
        GgmlType::Q8_0 => {
            for b in bytes.chunks_exact(34) {
                let d = h(b, 0);
                out.extend((0..32).map(|j| b[2 + j] as i8 as f64 * d));
            }
        }
        _ => unreachable!(),
    }
    out
}

#[test]
fn dequantization_follows_the_format_definitions() {
    for (seed, blocks) in [(1u64, 1usize), (2, 7), (3, 33)] {
        let n = blocks * 32;
        // Random raw blocks (any bytes are a valid block; keep the scales finite).
        let mut r = Rng::new(seed);
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let mut bytes: Vec<u8> = (0..ty.bytes_for(n)).map(|_| r.next_u64() as u8).collect();
            for b in bytes.chunks_exact_mut(ty.block_bytes()) {
                b[0..2].copy_from_slice(&f16::from_f32(r.symmetric()).to_le_bytes());
                if ty == GgmlType::Q4_1 {
                    b[2..4].copy_from_slice(&f16::from_f32(r.symmetric()).to_le_bytes());
                }
            }
            let want = reference_dequant(ty, &bytes, n);
            let mut got = vec![0f32; n];
            dequantize(ty, &bytes, &mut got).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{ty:?}: {g} vs {w}"
                );
            }
        }
        // Quantizing then dequantizing stays within half a step of the input.
        let x = random(n, seed + 10, 3.0);
        let mut y = vec![0f32; n];
        dequantize(GgmlType::Q4_1, &quantize_q4_1(&x), &mut y).unwrap();
        for (blk, yb) in x.chunks(32).zip(y.chunks(32)) {
            let (lo, hi) = blk
                .iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            let step = (hi - lo) / 15.0;
            for (a, b) in blk.iter().zip(yb) {
                assert!(
                    (a - b).abs() <= step * 0.5 + 2e-3 * hi.abs().max(lo.abs()),
                    "{a} {b}"
                );
            }
        }
        dequantize(GgmlType::Q8_0, &quantize_q8_0(&x), &mut y).unwrap();
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 3.0 / 127.0 * 0.5 + 3e-3, "{a} {b}");
        }
    }
    assert!(matches!(
        dequantize(GgmlType::Q8_0, &[0; 33], &mut [0.0; 32]),
        Err(LlmError::Shape(_))
    ));
}

#[test]
fn half_precision_conversions_round_trip() {
    let x = random(1000, 5, 100.0);
    let mut y = vec![0f32; 1000];
    dequantize(GgmlType::F16, &to_f16_bytes(&x), &mut y).unwrap();
    for (a, b) in x.iter().zip(&y) {
        assert_eq!(*b, f16::from_f32(*a).to_f32());
        assert!((a - b).abs() <= a.abs() * 1e-3 + 1e-4);
    }
    dequantize(GgmlType::Bf16, &to_bf16_bytes(&x), &mut y).unwrap();
    for (a, b) in x.iter().zip(&y) {
        assert_eq!(*b, bf16::from_f32(*a).to_f32());
        assert!((a - b).abs() <= a.abs() * 8e-3);
    }
}

/// Every ggml type the decoder reads, as the device weights it becomes
/// (`weights::HostMatrix`), multiplied on the CPU device's blocks: within 1e-5 of the
/// product with the dequantized f32 matrix, row by row. Q4_0 becomes Q4_1 exactly.
#[test]
fn device_products_match_the_dequantized_f32_product() {
    let dev = Device::cpu();
    for (rows, cols, seed) in [(1, 32, 1u64), (37, 96, 2), (130, 576, 3), (17, 1536, 4)] {
        let w = random(rows * cols, seed, 1.0);
        let x = random(3 * cols, seed + 100, 1.0);
        let mut g = GgufWriter::new();
        let dims = [cols as u64, rows as u64];
        for (ty, bytes) in [
            (GgmlType::Q4_1, quantize_q4_1(&w)),
            (GgmlType::Q8_0, quantize_q8_0(&w)),
            (GgmlType::Q4_0, quantize_q4_0(&w)),
            (GgmlType::F16, to_f16_bytes(&w)),
            (GgmlType::Bf16, to_bf16_bytes(&w)),
            (
                GgmlType::F32,
                w.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        ] {
            g.tensor(ty.name(), &dims, ty.id(), bytes);
        }
        let f = GgufFile::from_bytes(g.to_bytes()).unwrap();
        let xt = Tensor::from_slice(&dev, &x, &[3, cols]).unwrap();
        for t in f.tensors() {
            let m = QMatrix::new(t.dtype, rows, cols, f.tensor_bytes(t)).unwrap();
            let wf = m.to_f32();
            let host = HostMatrix::read(&f, t, rows, cols, None).unwrap();
            let want_format = match t.dtype {
                GgmlType::Q4_1 | GgmlType::Q4_0 => WeightFormat::Q4_1,
                GgmlType::Q8_0 => WeightFormat::Q8_0,
                _ => WeightFormat::F32,
            };
            assert_eq!(host.format, want_format, "{:?}", t.dtype);
            let y = host
                .upload(&dev)
                .unwrap()
                .matmul(&xt)
                .unwrap()
                .to_vec()
                .unwrap();
            for tk in 0..3 {
                for r in 0..rows {
                    let prods =
                        (0..cols).map(|c| wf[r * cols + c] as f64 * x[tk * cols + c] as f64);
                    let want: f64 = prods.clone().sum();
                    let norm: f64 = prods.map(f64::abs).sum();
                    let got = y[tk * rows + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * norm.max(1.0),
                        "{:?} {rows}x{cols} token {tk} row {r}: {got} vs {want}",
                        t.dtype
                    );
                }
            }
        }
        let bad = Tensor::zeros(&dev, &[cols + 1]).unwrap();
        let t = f.tensor("Q4_1").unwrap();
        let q = HostMatrix::read(&f, t, rows, cols, None)
            .unwrap()
            .upload(&dev)
            .unwrap();
        assert!(q.matmul(&bad).is_err());
        assert!(matches!(
            HostMatrix::read(&f, t, rows + 1, cols, None),
            Err(LlmError::Shape(_))
        ));
    }
}

/// Q4_0 the way ggml quantizes it: `d = max / −8` with `max` the value of largest
/// magnitude, codes `round(x / d) + 8` clamped to 0..15.
fn quantize_q4_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for blk in x.chunks_exact(32) {
        let max = blk
            .iter()
            .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5) as u8).min(15);
        out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
    }
    out
}
