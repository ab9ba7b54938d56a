//! Device selection and what the engine reports about the device: its name and its memory.
//!
//! A binary built without the `cuda` feature still understands `cuda` and answers
//! `NO_CUDA_DEVICE`; the JS loader uses that to fall back or to explain. With the feature,
//! a missing GPU (or a driver that fails to initialise) is an error value, never a panic.

use candle_core::Device;

use crate::error::{EngineError, Result};

/// Free and total bytes of a GPU's memory, as the driver reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    pub free: u64,
    pub total: u64,
}

/// `auto` (CUDA device 0 when there is one, else CPU) | `cpu` | `cuda` | `cuda:N`.
pub fn select_device(name: Option<&str>) -> Result<Device> {
    match name.unwrap_or("auto") {
        "auto" => Ok(cuda(0).unwrap_or(Device::Cpu)),
        "cpu" => Ok(Device::Cpu),
        s if s == "cuda" || s.starts_with("cuda:") => {
            let idx: usize = s
                .strip_prefix("cuda:")
                .map(|n| n.parse())
                .transpose()
                .map_err(|_| EngineError::InvalidArgument(format!("device '{s}': expected cuda:<index>")))?
                .unwrap_or(0);
            cuda(idx).map_err(|e| EngineError::NoCudaDevice(format!("{s}: {e}")))
        }
        other => Err(EngineError::InvalidArgument(format!("unknown device '{other}' (auto, cpu, cuda, cuda:N)"))),
    }
}

#[cfg(feature = "cuda")]
fn cuda(idx: usize) -> std::result::Result<Device, String> {
    // A driver that is present but cannot initialise, or an index past the last GPU.
    let device = std::panic::catch_unwind(|| Device::new_cuda(idx))
        .map_err(|_| "the CUDA driver panicked during initialisation".to_string())?
        .map_err(|e| crate::error::without_backtrace(&e.to_string()))?;
    if let Device::Cuda(d) = &device {
        hold_primary_context(d);
    }
    Ok(device)
}

/// Keeps the GPU's primary context alive for the rest of the process, as PyTorch does.
///
/// Each runtime retains the device's primary context and releases it when disposed. Were the
/// last release to destroy it, every thread that had it current (the JS thread after a
/// `stats()`, a thread that dropped an expert) would keep a stale binding, and the next
/// runtime's first driver call on such a thread would fail with `CUDA_ERROR_INVALID_CONTEXT`
/// (cudarc records such an error and returns it from the context's next checked call). Holding one reference per
/// GPU means the context, once created, stays valid (its memory, not the runtimes', stays
/// allocated: the context itself and the libraries' handles).
#[cfg(feature = "cuda")]
fn hold_primary_context(d: &candle_core::CudaDevice) {
    use candle_core::cuda::cudarc::driver::CudaContext;
    use std::sync::{Arc, Mutex};
    static HELD: Mutex<Vec<Arc<CudaContext>>> = Mutex::new(Vec::new());
    let ctx = d.cuda_stream().context().clone();
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if !held.iter().any(|c| c.ordinal() == ctx.ordinal()) {
        held.push(ctx);
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda(_idx: usize) -> std::result::Result<Device, String> {
    Err("this binary was built without CUDA support (install expert-runtime-linux-x64-gnu-cuda)".into())
}

/// `"cpu"`, or the GPU's name as the driver reports it.
pub fn device_name(device: &Device) -> String {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => d.cuda_stream().context().name().unwrap_or_else(|_| "cuda".into()),
        _ => "cpu".into(),
    }
}

/// The GPU's free and total memory; `None` on CPU.
pub fn device_memory(device: &Device) -> Option<DeviceMemory> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let (free, total) = d.cuda_stream().context().mem_get_info().ok()?;
            Some(DeviceMemory { free: free as u64, total: total as u64 })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_errors() {
        assert!(select_device(Some("cpu")).unwrap().is_cpu());
        assert_eq!(select_device(Some("tpu")).unwrap_err().code(), "INVALID_ARGUMENT");
        assert_eq!(select_device(Some("cuda:x")).unwrap_err().code(), "INVALID_ARGUMENT");
        assert_eq!(device_name(&Device::Cpu), "cpu");
        assert_eq!(device_memory(&Device::Cpu), None);
    }

    /// Without a GPU (CI, and any build without the feature) `cuda` is a coded error and
    /// `auto` is the CPU; with one, both give the GPU.
    #[test]
    fn cuda_without_a_gpu_is_an_error_not_a_crash() {
        match select_device(Some("cuda:7")) {
            Err(e) => assert_eq!(e.code(), "NO_CUDA_DEVICE"),
            Ok(d) => assert!(d.is_cuda()),
        }
        let auto = select_device(None).unwrap();
        assert_eq!(auto.is_cpu(), select_device(Some("cuda")).is_err());
    }
}
