fn main() {
    #[cfg(feature = "node")]
    napi_build::setup();
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        cuda_ptx();
    }
}

/// The CUDA decode kernels (src/model/cuda_decode.cu) as PTX for `CUDA_COMPUTE_CAP` (default
/// 90), compiled with the toolkit's nvcc (`CUDA_ROOT/bin/nvcc`, else `nvcc` on the PATH: the
/// toolchain `npm run build:cuda` sets up).
fn cuda_ptx() {
    let src = "src/model/cuda_decode.cu";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed=src/model/cuda_prefill.cuh");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    let nvcc = std::env::var("CUDA_ROOT").map(|r| format!("{r}/bin/nvcc")).unwrap_or_else(|_| "nvcc".into());
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let out = std::path::Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("cuda_decode.ptx");
    let status = std::process::Command::new(&nvcc)
        .args(["-ptx", "-O3", &format!("--gpu-architecture=compute_{cap}"), "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("running {nvcc}: {e}"));
    assert!(status.success(), "{nvcc} failed on {src}");
}
