//! Writes into a head-major CPU pool ([`super::store::KvStore`]): one KV head's rows of every
//! slot side by side, so attention streams a head's positions from consecutive memory.
//!
//! A pass's keys and values arrive position-major (`[rows, kv_heads · width]`); each run of
//! consecutive slots is copied head by head into the pool's buffer, in place, as a candle
//! in-place op (one call per layer and tensor, whatever the number of runs).

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, InplaceOp1, InplaceOp2, Layout};

use super::store::SlotRun;

/// Copies a pass's rows (`[rows, heads · width]`, position-major) into a head-major pool
/// (`[heads · slots, width]`) at the runs' slots.
pub(super) struct WriteRuns<'a> {
    pub runs: &'a [SlotRun],
    pub heads: usize,
    pub width: usize,
    pub slots: usize,
}

impl WriteRuns<'_> {
    fn copy<T: Copy>(&self, dst: &mut [T], src: &[T]) -> candle_core::Result<()> {
        let (heads, width, slots) = (self.heads, self.width, self.slots);
        let row = heads * width;
        if dst.len() != heads * slots * width {
            bail!("KV pool holds {} values, not {heads} heads × {slots} slots × {width}", dst.len())
        }
        for r in self.runs {
            if r.slot + r.len > slots || (r.row + r.len) * row > src.len() {
                bail!("KV write of {} rows from row {} to slot {} is out of bounds", r.len, r.row, r.slot)
            }
            for head in 0..heads {
                let out = &mut dst[(head * slots + r.slot) * width..][..r.len * width];
                for (i, o) in out.chunks_exact_mut(width).enumerate() {
                    o.copy_from_slice(&src[(r.row + i) * row + head * width..][..width]);
                }
            }
        }
        Ok(())
    }
}

impl InplaceOp2 for WriteRuns<'_> {
    fn name(&self) -> &'static str {
        "kv-write-head-major"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, dl: &Layout, src: &CpuStorage, sl: &Layout) -> candle_core::Result<()> {
        let (Some((d0, d1)), Some((s0, s1))) = (dl.contiguous_offsets(), sl.contiguous_offsets()) else {
            bail!("KV write needs contiguous tensors")
        };
        match (dst, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => self.copy(&mut d[d0..d1], &s[s0..s1]),
            (CpuStorage::F16(d), CpuStorage::F16(s)) => self.copy(&mut d[d0..d1], &s[s0..s1]),
            (CpuStorage::BF16(d), CpuStorage::BF16(s)) => self.copy(&mut d[d0..d1], &s[s0..s1]),
            (CpuStorage::U8(d), CpuStorage::U8(s)) => self.copy(&mut d[d0..d1], &s[s0..s1]),
            (d, s) => bail!("KV write of {:?} rows into a {:?} pool", s.dtype(), d.dtype()),
        }
    }
}

/// Copies `n` slots from `src` to `dst` (slot indices) for every head of a head-major pool
/// (`[heads · slots, width]`).
pub(super) struct CopySlots {
    pub src: usize,
    pub dst: usize,
    pub n: usize,
    pub heads: usize,
    pub width: usize,
    pub slots: usize,
}

impl CopySlots {
    fn copy<T: Copy>(&self, data: &mut [T]) -> candle_core::Result<()> {
        let (heads, width, slots) = (self.heads, self.width, self.slots);
        if data.len() != heads * slots * width || self.src.max(self.dst) + self.n > slots {
            bail!("KV copy of {} slots from {} to {} is out of bounds", self.n, self.src, self.dst)
        }
        for head in 0..heads {
            let base = head * slots * width;
            data.copy_within(base + self.src * width..base + (self.src + self.n) * width, base + self.dst * width);
        }
        Ok(())
    }
}

impl InplaceOp1 for CopySlots {
    fn name(&self) -> &'static str {
        "kv-copy-head-major"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((a, b)) = layout.contiguous_offsets() else { bail!("KV copy needs a contiguous pool") };
        match storage {
            CpuStorage::F32(d) => self.copy(&mut d[a..b]),
            CpuStorage::F16(d) => self.copy(&mut d[a..b]),
            CpuStorage::BF16(d) => self.copy(&mut d[a..b]),
            CpuStorage::U8(d) => self.copy(&mut d[a..b]),
            s => bail!("KV copy in a {:?} pool", s.dtype()),
        }
    }
}

/// Returns the memory behind ranges of slots (`[start, end)`, ascending) of a head-major pool to
/// the OS: every whole page they cover, for every head. The pages read back as zeros (a valid
/// value of every pool dtype); only blocks no table lists are released, and they are written
/// before they are read again. Elsewhere than Linux the memory stays committed.
pub(super) struct ReleaseSlots<'a> {
    pub ranges: &'a [(usize, usize)],
    pub heads: usize,
    pub slots: usize,
}

impl ReleaseSlots<'_> {
    fn release<T>(&self, data: &mut [T], width: usize) -> candle_core::Result<()> {
        let (heads, slots) = (self.heads, self.slots);
        if data.len() != heads * slots * width || self.ranges.iter().any(|&(a, b)| a > b || b > slots) {
            bail!("KV release of slot ranges outside a pool of {heads} heads × {slots} slots")
        }
        let row = width * std::mem::size_of::<T>();
        let base = data.as_mut_ptr() as usize;
        for head in 0..heads {
            for &(a, b) in self.ranges {
                let start = base + (head * slots + a) * row;
                let end = base + (head * slots + b) * row;
                // SAFETY: [start, end) lies inside `data`, which this op holds exclusively.
                unsafe { dont_need(start, end) };
            }
        }
        Ok(())
    }
}

/// Gives the whole pages inside `[start, end)` back to the OS (they read back as zeros).
///
/// # Safety
/// The range must lie inside memory the caller holds exclusively, and zero bytes must be a valid
/// value of what it holds.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn dont_need(start: usize, end: usize) {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    let page = *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1));
    let (first, last) = (start.div_ceil(page) * page, end / page * page);
    if first < last {
        // SAFETY: whole pages inside the caller's exclusive range; MADV_DONTNEED on private
        // anonymous memory replaces them with zero pages on the next touch. A failure leaves
        // the memory as it was.
        unsafe { libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_DONTNEED) };
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
unsafe fn dont_need(_start: usize, _end: usize) {}

impl InplaceOp1 for ReleaseSlots<'_> {
    fn name(&self) -> &'static str {
        "kv-release-head-major"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((a, b)) = layout.contiguous_offsets() else { bail!("KV release needs a contiguous pool") };
        let width = layout.dims().get(1).copied().unwrap_or(1);
        match storage {
            CpuStorage::F32(d) => self.release(&mut d[a..b], width),
            CpuStorage::F16(d) => self.release(&mut d[a..b], width),
            CpuStorage::BF16(d) => self.release(&mut d[a..b], width),
            CpuStorage::U8(d) => self.release(&mut d[a..b], width),
            s => bail!("KV release in a {:?} pool", s.dtype()),
        }
    }
}
