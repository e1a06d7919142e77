//! The README's code generation example, as a user would type it.

use ringkernel_cuda_codegen::{dsl::*, transpile_global_kernel};
use syn::parse_quote;

fn seed_example() -> Result<String, Box<dyn std::error::Error>> {
    // Write kernel logic in Rust DSL
    let kernel: syn::ItemFn = parse_quote! {
        fn my_kernel(data: &mut [f32], n: i32) {
            let idx = block_idx_x() * block_dim_x() + thread_idx_x();
            if idx >= n { return; }
            data[idx as usize] = data[idx as usize] * 2.0;
        }
    };

    // Transpile to CUDA C
    let cuda_code = transpile_global_kernel(&kernel)?;
    Ok(cuda_code)
}

#[test]
fn seed_example_transpiles() {
    let cuda = seed_example().unwrap();
    assert!(
        cuda.starts_with("extern \"C\" __global__ void my_kernel(float* data, int n) {"),
        "{cuda}"
    );
    assert!(cuda.contains("blockIdx.x"));
    assert!(cuda.contains("blockDim.x"));
    assert!(cuda.contains("threadIdx.x"));
    assert!(cuda.contains("return;"));
    assert!(cuda.contains("* 2.0f)"));
    assert!(cuda.trim_end().ends_with('}'));
}

/// The same body as plain Rust on the CPU, through `dsl::launch`.
#[test]
fn seed_kernel_runs_on_the_cpu() {
    // Kept as the README writes it.
    #[allow(clippy::assign_op_pattern)]
    fn my_kernel(data: &mut [f32], n: i32) {
        let idx = block_idx_x() * block_dim_x() + thread_idx_x();
        if idx >= n {
            return;
        }
        data[idx as usize] = data[idx as usize] * 2.0;
    }
    let mut data: Vec<f32> = (0..100).map(|i| i as f32).collect();
    launch([2, 1, 1], [64, 1, 1], || my_kernel(&mut data, 90));
    for (i, v) in data.iter().enumerate() {
        let want = if i < 90 { 2.0 * i as f32 } else { i as f32 };
        assert_eq!(*v, want, "element {i}");
    }
}
