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

/// Makes `device`'s CUDA context current on the calling thread (a no-op on CPU).
///
/// Every thread other than the one that created the device must call this before device work,
/// and before dropping device memory: cudarc frees a buffer (and waits on its events) without
/// binding the context, so a buffer dropped on an unbound thread fails with
/// `CUDA_ERROR_INVALID_CONTEXT` (the memory stays allocated, and cudarc reports the error on
/// the context's next checked call, whatever it is). Owners of device tensors that may be
/// dropped on any thread (a model, an expert) call this from their `Drop`.
pub fn bind_thread(device: &Device) -> crate::error::Result<()> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => d
            .cuda_stream()
            .context()
            .bind_to_thread()
            .map_err(|e| crate::error::EngineError::Internal(format!("cannot bind the CUDA context to this thread: {e}"))),
        _ => Ok(()),
    }
}
