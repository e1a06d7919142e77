//! The register-resident CUDA kernels (`wave_resident_R` and `wave_resident_h2_R`, the
//! two-cell-halo one, in `src/cuda_wave.cu`) run on
//! the CPU: `cuda_emu/emu.cpp` compiles the kernel source as C++ (every CUDA thread an
//! OS thread, a barrier per block, the PTX volatile 64-bit loads and stores as relaxed
//! atomics) and checks two launches against a plain reference, bit for bit. This tests
//! the tiles' halo exchange (stamped words, parity slots, partial tiles, the stamps going
//! on across launches) without a GPU; the GPU runs it in `tests/cuda.rs`. Skipped (with
//! a message) where `g++` is missing.

use std::process::Command;

/// The kernel source with the CUDA-only constructs replaced for the emulator.
fn emulated_source() -> String {
    let src = include_str!("../src/cuda_wave.cu");
    let subs = [
        (
            "__shared__ float s[TH + 2][TW + 2];",
            "float (*s)[TW + 2] = (float (*)[TW + 2])shared_for_block(blockIdx.x);",
        ),
        // wave_resident_h2_R's three arrays, one after another in the block's memory.
        (
            "__shared__ float su[TH + 4][TW + 4];",
            "float (*su)[TW + 4] = (float (*)[TW + 4])shared_for_block(blockIdx.x);",
        ),
        (
            "__shared__ float sp[TH + 2][TW + 2];",
            "float (*sp)[TW + 2] = (float (*)[TW + 2])(shared_for_block(blockIdx.x) + (TH + 4) * (TW + 4));",
        ),
        (
            "__shared__ float sv[TH + 2][TW + 2];",
            "float (*sv)[TW + 2] = (float (*)[TW + 2])(shared_for_block(blockIdx.x) + (TH + 4) * (TW + 4) \
             + (TH + 2) * (TW + 2));",
        ),
        (
            r#"asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(slot), "l"(w) : "memory");"#,
            "__atomic_store_n(slot, w, __ATOMIC_RELAXED);",
        ),
        (
            r#"asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(slot) : "memory");"#,
            "w = __atomic_load_n(slot, __ATOMIC_RELAXED); std::this_thread::yield();",
        ),
    ];
    let mut out = src.to_string();
    for (from, to) in subs {
        assert_eq!(out.matches(from).count(), 1, "the kernel changed: {from}");
        out = out.replace(from, to);
    }
    out.replace("#pragma unroll", "")
        .replace("extern \"C\" ", "")
}

#[test]
fn resident_kernel_matches_the_reference_on_a_cpu_emulation() {
    if Command::new("g++").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no g++ to build the CUDA emulation");
        return;
    }
    let dir = std::env::temp_dir().join(format!("rk-wave-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kernel_emu.inc"), emulated_source()).unwrap();
    // Written out from the test binary, so that it runs wherever the binary goes.
    let emu_cpp = dir.join("emu.cpp");
    std::fs::write(&emu_cpp, include_str!("cuda_emu/emu.cpp")).unwrap();
    let exe = dir.join("emu");
    let out = Command::new("g++")
        .args(["-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-I"])
        .arg(&dir)
        .arg("-o")
        .arg(&exe)
        .arg(&emu_cpp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "g++: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (R, nx, ny, steps of the first launch, of the second): partial tiles, 2 x 2 and
    // 3 x 2 tile grids, odd and even step counts; R = 1, 4, 16 are the kernels of 256²,
    // 512² and 1024² on 132 SMs.
    // The last value: 1 for the two-cell-halo kernel (R <= 4), whose periods are two
    // steps (odd counts end a launch with a one-step period).
    for args in [
        [1, 40, 20, 7, 6, 0],
        [2, 50, 40, 5, 8, 0],
        [4, 70, 100, 9, 4, 0],
        [16, 40, 300, 3, 2, 0],
        [1, 40, 20, 7, 6, 1],
        [2, 50, 40, 5, 8, 1],
        [4, 70, 100, 9, 4, 1],
        [1, 100, 37, 1, 3, 1],
    ] {
        // A broken exchange can leave a tile waiting forever: 120 s at most.
        let mut child = Command::new(&exe)
            .args(args.map(|a| a.to_string()))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > std::time::Duration::from_secs(120) {
                child.kill().ok();
                panic!("{args:?}: the emulated kernel hangs (a tile waits for ever)");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(text.contains("max err 0 "), "{text}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
