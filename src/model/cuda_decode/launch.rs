//! Kernel launches on the CUDA decode path: each with programmatic dependent launch (unless
//! off) and, with timing on, between two events; and the matrix products, on the GEMV kernels
//! for a few aligned rows, else on cuBLAS.

use candle_core::cuda_backend::cudarc::cublas;
use candle_core::cuda_backend::cudarc::driver::{self, CudaFunction};
use candle_core::DType;

use super::{err, i32n, CudaDecode, GEMV_ROWS};
use crate::error::Result;

impl CudaDecode {
    /// Runs `f` (launches of one kind), between two timing events when timing is on.
    fn timed(&self, kind: &'static str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let Some(t) = &self.timing else { return f() };
        let flags = Some(driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(flags).map_err(err)?;
        f()?;
        let end = self.stream.record_event(flags).map_err(err)?;
        t.events.borrow_mut().push((kind, start, end));
        Ok(())
    }

    pub(super) fn launch(
        &self,
        kind: &'static str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &[&dyn Arg],
    ) -> Result<()> {
        self.launch_with(kind, f, grid, block, 0, args)
    }

    /// [`Self::launch`] with `smem` bytes of dynamic shared memory.
    pub(super) fn launch_with(
        &self,
        kind: &'static str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[&dyn Arg],
    ) -> Result<()> {
        self.timed(kind, || {
            // With programmatic dependent launch the kernel may start while the previous one
            // finishes; it waits for it (`pdl_wait` in cuda_decode.cu) before reading its output.
            // Without the attribute, this is a plain launch.
            use driver::sys;
            let mut params: Vec<*mut std::ffi::c_void> = args.iter().map(|a| a.param()).collect();
            // SAFETY: a plain C struct and union, all-zero valid; the fields used are set below.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: self.stream.cu_stream(),
                attrs: &mut attr,
                numAttrs: u32::from(self.use_pdl),
            };
            self.stream.context().bind_to_thread().map_err(err)?;
            // SAFETY: every kernel of the module is launched with the argument list of its
            // signature in cuda_decode.cu (pointers to buffers sized for MAX_ROWS rows, sizes that
            // match them), checked on the host before the launch. `params` points at the argument
            // values and `cfg` at `attr`, which outlive the call (the driver copies them).
            unsafe { sys::cuLaunchKernelEx(&cfg, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
                .map_err(err)
        })
    }

    /// Whether a product of `rows` rows over `inp` inputs, `x` rows `ldx` apart, runs on the GEMV
    /// kernels: few rows, and 16-byte aligned operands.
    pub(super) fn gemv_fits(&self, rows: usize, inp: usize, ldx: usize, ptrs: &[u64]) -> bool {
        let v = 16 / self.dtype.size_in_bytes();
        self.use_gemv
            && rows <= GEMV_ROWS
            && inp.is_multiple_of(v)
            && ldx.is_multiple_of(v)
            && ptrs.iter().all(|p| p.is_multiple_of(16))
    }

    /// How the GEMV kernels split a product over `inp` inputs and `out` outputs: warps per output
    /// (one while a lane has at most four 16-byte loads of a weight row, else four), and blocks of
    /// 8 warps. Measured on an H200 (`benches/cuda/kernels.cu`): k = 1024 runs best on one warp,
    /// k = 2048 and 3072 on four (1.2–1.4× faster at one row, 1.9–2.2× at four).
    pub(super) fn gemv_split(&self, inp: usize, out: usize) -> Result<(i32, u32)> {
        let loads = inp.div_ceil(32 * (16 / self.dtype.size_in_bytes()));
        let parts = if loads <= 4 { 1 } else { 4 };
        let blocks = u32::try_from(out.div_ceil(8 / parts)).map_err(|_| err("too many output rows"))?;
        Ok((parts as i32, blocks))
    }

    /// `y[rows, out] = x[rows, inp] · w[out, inp]ᵀ` in the model dtype, f32 accumulation; rows of
    /// `x` are `ldx` elements apart, rows of `y` `ldy`. Up to GEMV_ROWS rows with aligned
    /// operands run on the GEMV kernel, the rest on cuBLAS.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mat(
        &self,
        kind: &'static str,
        x: u64,
        ldx: usize,
        w: u64,
        y: u64,
        ldy: usize,
        rows: usize,
        out: usize,
        inp: usize,
    ) -> Result<()> {
        if self.gemv_fits(rows, inp, ldx, &[x, w]) {
            let (ldx, ldy, rows_i, out_i, inp_i) = (i32n(ldx)?, i32n(ldy)?, i32n(rows)?, i32n(out)?, i32n(inp)?);
            let (parts, blocks) = self.gemv_split(inp, out)?;
            return self.launch(
                kind,
                &self.k.gemv,
                (blocks, 1, 1),
                256,
                &[&x, &ldx, &w, &y, &ldy, &rows_i, &out_i, &inp_i, &parts],
            );
        }
        self.timed(kind, || self.gemm_now(x, ldx, w, y, rows, out, inp, ldy))
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm_now(&self, x: u64, ldx: usize, w: u64, y: u64, rows: usize, out: usize, inp: usize, ldy: usize) -> Result<()> {
        use cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
        let dt = if self.dtype == DType::F32 { cudaDataType::CUDA_R_32F } else { cudaDataType::CUDA_R_16BF };
        let (alpha, beta) = (1f32, 0f32);
        let i = i32n;
        // Column-major: yᵀ[out, rows] = w[inp, out]ᵀ · xᵀ[inp, rows].
        // SAFETY: the pointers address buffers of at least rows·inp, out·inp and rows·out
        // elements of the stated types on this handle's device.
        unsafe {
            cublas::result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                i(out)?,
                i(rows)?,
                i(inp)?,
                &alpha as *const f32 as *const _,
                w as *const _,
                dt,
                i(inp)?,
                x as *const _,
                dt,
                i(ldx)?,
                &beta as *const f32 as *const _,
                y as *mut _,
                dt,
                i(ldy)?,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(err)
    }
}

/// A kernel argument of one of the types the kernels take.
pub(super) trait Arg {
    /// The value's address, as `cuLaunchKernelEx` takes each argument.
    fn param(&self) -> *mut std::ffi::c_void;
}

macro_rules! arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn param(&self) -> *mut std::ffi::c_void {
                self as *const $t as *mut std::ffi::c_void
            }
        }
    )*};
}
arg!(u64, i32, i64, f32);
