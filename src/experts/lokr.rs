//! LoKr: `ΔW = s · (w1 ⊗ w2)` with `w1 [p, q]`, `w2 [m, n]`, `ΔW [p·m, q·n]`; each factor is
//! stored full or as a product of two low-rank matrices (`decompose_both`), which is formed at
//! load (the factors are small). The Kronecker product itself is never built: with the input
//! row viewed as `X [q, n]`, `ΔW x = vec(w1 · X · w2ᵀ)`, two small matmuls instead of one
//! `[p·m, q·n]` weight.

use candle_core::Tensor;

use crate::error::Result;

pub struct Lokr {
    pub w1: Tensor,
    pub w2: Tensor,
    /// `α / r` (times the user's scale).
    pub scale: f64,
    /// Output rows reordered to the base's layout (GGUF Llama q/k), or `None`.
    pub out_perm: Option<Tensor>,
}

impl Lokr {
    /// `s · (w1 ⊗ w2) x` for `x [rows, q·n]`: `[rows, p·m]`.
    pub fn delta(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let (p, q) = self.w1.dims2()?;
        let (m, n) = self.w2.dims2()?;
        // 1. Z = X · w2ᵀ per row: [rows·q, n] → [rows, q, m].
        let z = x.contiguous()?.reshape((rows * q, n))?.matmul(&self.w2.t()?)?.reshape((rows, q, m))?;
        // 2. Y = w1 · Z per row: [rows, p, m], flattened row-major as the Kronecker index i·m + j.
        let y = self.w1.broadcast_left(rows)?.matmul(&z)?.reshape((rows, p * m))?;
        let y = (y * self.scale)?;
        Ok(match &self.out_perm {
            Some(perm) => y.index_select(perm, 1)?,
            None => y,
        })
    }

    pub fn bytes(&self) -> usize {
        (self.w1.elem_count() + self.w2.elem_count()) * self.w1.dtype().size_in_bytes()
    }
}
