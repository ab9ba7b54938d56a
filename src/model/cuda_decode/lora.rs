//! The plain LoRAs of an expert set on the CUDA decode path: the set's table of adapter
//! addresses, ranks and scales on the device (built once per set), and the per-row low-rank
//! products `s · B (A x)` added to a module's output (Punica / BGMV style).

use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::Device;

use super::{err, i32n, ptr, CudaDecode, LORA_ENTRY, LORA_MAX, LORA_RANK};
use crate::error::Result;
use crate::model::adapt::{Adapters, Proj, Slot};

impl CudaDecode {
    /// The LoRA table of an expert set (see `LoraEntry` in the kernels), or `None` when some module
    /// of the set holds other adapters, more than LORA_MAX of them, a rank beyond LORA_RANK, or
    /// factors that are not contiguous tensors of the model dtype on this device.
    pub(super) fn lora_table(&self, experts: &dyn Adapters) -> Result<Option<CudaSlice<u8>>> {
        let s = self.stream.as_ref();
        let (hid, nq, nk, inter) = (self.h, self.nh * self.hd, self.nkv * self.hd, self.inter);
        let mut table = vec![0u8; self.layers.len() * Proj::ALL.len() * LORA_MAX * LORA_ENTRY];
        for layer in 0..self.layers.len() {
            for proj in Proj::ALL {
                let slot = Slot::new(layer, proj);
                let Some(list) = experts.low_ranks(slot) else { return Ok(None) };
                if list.len() > LORA_MAX {
                    return Ok(None);
                }
                let (inp, out) = match proj {
                    Proj::Q => (hid, nq),
                    Proj::K | Proj::V => (hid, nk),
                    Proj::O => (nq, hid),
                    Proj::Gate | Proj::Up => (hid, inter),
                    Proj::Down => (inter, hid),
                    // A Gated DeltaNet's modules: a plan with them never decodes here.
                    Proj::LinQkv | Proj::LinZ | Proj::LinOut if list.is_empty() => continue,
                    Proj::LinQkv | Proj::LinZ | Proj::LinOut => return Ok(None),
                };
                for (e, (a, b, scale)) in list.into_iter().enumerate() {
                    let Ok((rank, a_in)) = a.dims2() else { return Ok(None) };
                    let fits = rank > 0
                        && rank <= LORA_RANK
                        && a_in == inp
                        && b.dims2().ok() == Some((out, rank))
                        && a.dtype() == self.dtype
                        && b.dtype() == self.dtype
                        && a.is_contiguous()
                        && b.is_contiguous()
                        && a.device().same_device(&Device::Cuda(self.dev.clone()))
                        && b.device().same_device(&Device::Cuda(self.dev.clone()));
                    if !fits {
                        return Ok(None);
                    }
                    let at = (slot.index() * LORA_MAX + e) * LORA_ENTRY;
                    let entry = &mut table[at..at + LORA_ENTRY];
                    entry[0..8].copy_from_slice(&ptr(a, s)?.to_le_bytes());
                    entry[8..16].copy_from_slice(&ptr(b, s)?.to_le_bytes());
                    entry[16..20].copy_from_slice(&(rank as i32).to_le_bytes());
                    entry[20..24].copy_from_slice(&(scale as f32).to_le_bytes());
                }
            }
        }
        Ok(Some(self.stream.clone_htod(&table).map_err(err)?))
    }

    /// The LoRA deltas of module `slot` for the rows that run LoRAs: `y` (rows `ldy` apart,
    /// `out` columns) += each adapter's `s · B (A x)`, `x` rows `ldx` apart with `inp` columns.
    /// `sets` holds each row's set address (a `u64` per row), `t` is the workspace
    /// (`[rows, LORA_MAX, LORA_RANK]` f32): [`LoraPtrs`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lora(
        &self,
        (sets, t): (u64, u64),
        rows: usize,
        slot: Slot,
        x: u64,
        ldx: usize,
        inp: usize,
        y: u64,
        ldy: usize,
        out: usize,
    ) -> Result<()> {
        let (slot_i, ldx, inp, ldy, out_i) = (i32n(slot.index())?, i32n(ldx)?, i32n(inp)?, i32n(ldy)?, i32n(out)?);
        let r = rows as u32;
        self.launch(
            "lora_shrink",
            &self.k.lora_shrink,
            (r, LORA_MAX as u32, (LORA_RANK / 8) as u32),
            256,
            &[&sets, &slot_i, &x, &ldx, &inp, &t],
        )?;
        let blocks = u32::try_from(out.div_ceil(256)).map_err(|_| err("too many outputs"))?;
        self.launch("lora_expand", &self.k.lora_expand, (r, blocks, 1), 256, &[&sets, &slot_i, &t, &y, &ldy, &out_i])
    }
}

/// A pass's LoRA inputs, where some row runs LoRAs: the rows' set addresses and the workspace.
pub(super) type LoraPtrs = Option<(u64, u64)>;
