//! Engine errors. Every variant carries a stable, machine-readable `code` that the binding
//! layer puts on the JS `Error` (`err.code`); messages are for humans and may change.

#[derive(thiserror::Error, Debug, Clone)]
pub enum EngineError {
    #[error("model not found: {0}")]
    ModelNotFound(String),
    #[error("invalid model: {0}")]
    InvalidModel(String),
    #[error("unsupported architecture: {0}")]
    UnsupportedArchitecture(String),
    #[error("context overflow: {0}")]
    ContextOverflow(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("session busy: {0}")]
    SessionBusy(String),
    #[error("disposed: {0}")]
    Disposed(String),
    #[error("no CUDA device: {0}")]
    NoCudaDevice(String),
    #[error("expert not found: {0}")]
    ExpertNotFound(String),
    #[error("unsupported adapter: {0}")]
    UnsupportedAdapter(String),
    #[error("invalid adapter: {0}")]
    InvalidAdapter(String),
    #[error("KV cache exhausted: {0}")]
    KvCacheExhausted(String),
    /// A device allocation failed. The request that needed it fails; the runtime stays usable.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// A file the caller named could not be written or read for a reason of the file system
    /// (a full disk, a read-only directory, permissions); nothing half-written is left.
    #[error("I/O error: {0}")]
    Io(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    /// What went wrong, without the kind (`code` says that): what the bindings show after the
    /// code.
    pub fn message(&self) -> &str {
        match self {
            Self::ModelNotFound(m)
            | Self::InvalidModel(m)
            | Self::UnsupportedArchitecture(m)
            | Self::ContextOverflow(m)
            | Self::InvalidArgument(m)
            | Self::SessionBusy(m)
            | Self::Disposed(m)
            | Self::NoCudaDevice(m)
            | Self::ExpertNotFound(m)
            | Self::UnsupportedAdapter(m)
            | Self::InvalidAdapter(m)
            | Self::KvCacheExhausted(m)
            | Self::OutOfMemory(m)
            | Self::Io(m)
            | Self::Internal(m) => m,
        }
    }

    /// The stable code exposed to JavaScript as `err.code`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::ModelNotFound(_) => "MODEL_NOT_FOUND",
            Self::InvalidModel(_) => "INVALID_MODEL",
            Self::UnsupportedArchitecture(_) => "UNSUPPORTED_ARCHITECTURE",
            Self::ContextOverflow(_) => "CONTEXT_OVERFLOW",
            Self::InvalidArgument(_) => "INVALID_ARGUMENT",
            Self::SessionBusy(_) => "SESSION_BUSY",
            Self::Disposed(_) => "DISPOSED",
            Self::NoCudaDevice(_) => "NO_CUDA_DEVICE",
            Self::ExpertNotFound(_) => "EXPERT_NOT_FOUND",
            Self::UnsupportedAdapter(_) => "UNSUPPORTED_ADAPTER",
            Self::InvalidAdapter(_) => "INVALID_ADAPTER",
            Self::KvCacheExhausted(_) => "KV_CACHE_EXHAUSTED",
            Self::OutOfMemory(_) => "OUT_OF_MEMORY",
            Self::Io(_) => "IO_ERROR",
            Self::Internal(_) => "INTERNAL",
        }
    }

    /// Wraps an error raised while reading an adapter's files.
    pub fn invalid_adapter(ctx: impl std::fmt::Display, e: impl std::fmt::Display) -> Self {
        Self::InvalidAdapter(format!("{ctx}: {}", without_backtrace(&e.to_string())))
    }

    /// Wraps a candle error raised while reading weights: the file is at fault, not us.
    pub fn invalid_model(ctx: impl std::fmt::Display, e: impl std::fmt::Display) -> Self {
        let msg = without_backtrace(&e.to_string());
        if is_out_of_memory(&msg) {
            return Self::OutOfMemory(format!("{ctx}: {msg}"));
        }
        Self::InvalidModel(format!("{ctx}: {msg}"))
    }
}

/// candle appends a Rust backtrace to its messages when `RUST_BACKTRACE` is set; users get the
/// message only.
pub(crate) fn without_backtrace(s: &str) -> String {
    let end = s.find("\nstack backtrace:").or_else(|| s.find("\n   0: ")).unwrap_or(s.len());
    s[..end].trim_end().to_string()
}

/// Errors from tensor ops during a forward pass are internal (the inputs were validated
/// before), except a failed device allocation, which is the machine's limit, not a bug.
impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        let msg = without_backtrace(&e.to_string());
        if is_out_of_memory(&msg) {
            Self::OutOfMemory(msg)
        } else {
            Self::Internal(msg)
        }
    }
}

/// The CUDA driver's and runtime's out-of-memory results, as candle formats them
/// (`DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")`, cuBLAS `CUBLAS_STATUS_ALLOC_FAILED`).
pub fn is_out_of_memory(msg: &str) -> bool {
    msg.contains("CUDA_ERROR_OUT_OF_MEMORY") || msg.contains("ALLOC_FAILED") || msg.contains("cudaErrorMemoryAllocation")
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// The message a panic carried (`panic!("…")` payloads are a `String` or a `&str`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_allocation_failures_are_out_of_memory() {
        let oom = candle_core::Error::Msg("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into());
        assert_eq!(EngineError::from(oom).code(), "OUT_OF_MEMORY");
        let cublas = candle_core::Error::Msg("cublas error CUBLAS_STATUS_ALLOC_FAILED".into());
        assert_eq!(EngineError::from(cublas).code(), "OUT_OF_MEMORY");
        let oom_at_load = EngineError::invalid_model("model.layers.3.mlp.up_proj.weight", "CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(oom_at_load.code(), "OUT_OF_MEMORY");
        assert!(oom_at_load.to_string().contains("up_proj"));
        assert_eq!(EngineError::from(candle_core::Error::Msg("shape mismatch".into())).code(), "INTERNAL");
    }
}
