//! Which code path a tensor takes: this crate's CPU kernels (fused attention, fused LoRA, the
//! packed Q8_0 matmul, parallel GEMV), or the device-generic path of candle tensor ops that
//! CUDA runs.
//!
//! `EXPERT_RUNTIME_GENERIC_KERNELS=1` sends the CPU down the generic path as well, so that the
//! code a GPU executes is tested, against the same references, on machines without one.

use std::sync::OnceLock;

use candle_core::Device;

/// Whether the CPU kernels apply to tensors on `device`.
pub fn cpu_kernels(device: &Device) -> bool {
    device.is_cpu() && !generic_forced()
}

fn generic_forced() -> bool {
    static FORCED: OnceLock<bool> = OnceLock::new();
    *FORCED.get_or_init(|| std::env::var("EXPERT_RUNTIME_GENERIC_KERNELS").is_ok_and(|v| !v.is_empty() && v != "0"))
}
