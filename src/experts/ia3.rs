//! IA³: learned rescaling vectors. On a feed-forward module (PEFT `feedforward_modules`) the
//! vector scales the layer's input features before the base weight (`W (x ⊙ l) + b`);
//! elsewhere it scales the output, bias included (`(W x + b) ⊙ l`).

use candle_core::Tensor;

pub struct Ia3 {
    /// `[in]` when `on_input`, else `[out]`.
    pub scale: Tensor,
    pub on_input: bool,
}

impl Ia3 {
    pub fn bytes(&self) -> usize {
        self.scale.elem_count() * self.scale.dtype().size_in_bytes()
    }
}
