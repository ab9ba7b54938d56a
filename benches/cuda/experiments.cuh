// Decode kernels the decode path (src/model/cuda_decode.rs) does not launch yet. kernels.cu checks
// each against the kernels it would replace (the same bits) and times both; one that wins moves
// into src/model/cuda_decode.cu. Included by kernels.cu after cuda_decode.cu, whose helpers it uses.

// The matrix product of `gemv` (y = x · wᵀ, `rows` ≤ GEMV_ROWS rows, n outputs), then, in the last
// block to finish (a counter in `done`, set back to 0), what `add_rmsnorm` does next in a decode
// step: res += y (rounded to T, written back) and out = RMSNorm(res) · nw, over rows of n
// elements. One launch instead of two at the o and down projections (56 fewer a pass of the
// Qwen3-0.6B shape), at the cost of a serial tail in one block.
//
// The tail reproduces add_rmsnorm's arithmetic exactly when that runs with `vthreads` threads
// (the decode path's min(1024, n rounded up to 32)): each of this block's GEMV_WARPS · 32
// threads stands in for the virtual threads t, t + 256, …, each summing its own squares in the
// same order, and the warp and block sums run over the same groups of 32 in the same order.
template <typename T>
__device__ void gemv_add_rmsnorm(const T* xin, int ldx, const T* w, T* y, int ldy, int rows, int n, int k, int parts,
                                 T* res, const T* nw, T* out, float eps, int vthreads, u32* done) {
  constexpr int B = GEMV_WARPS * 32, PER = 1024 / B;
  __shared__ float part[32];
  __shared__ bool last;
  gemv<T>(xin, ldx, w, y, ldy, rows, n, k, parts);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int r = 0; r < rows; r++) {
    T* xr = res + (size_t)r * n;
    const T* add = y + (size_t)r * ldy;
    T* orow = out + (size_t)r * n;
    float ss[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
      ss[j] = 0.f;
      const int vt = threadIdx.x + j * B;
      if (vt >= vthreads) continue;
      for (int i = vt; i < n; i += vthreads) {
        float v = ld(xr[i]);
        v = rnd<T>(v + ld(__ldcg(&add[i])));
        st(&xr[i], v);
        ss[j] += v * v;
      }
    }
#pragma unroll
    for (int j = 0; j < PER; j++) {
      if (threadIdx.x + j * B < vthreads) { // whole warps: vthreads and B are multiples of 32
        const float s = warp_sum(ss[j]);
        if (lane == 0) part[warp + j * GEMV_WARPS] = s;
      }
    }
    __syncthreads();
    const float total = warp_sum(lane < vthreads / 32 ? part[lane] : 0.f);
    const float scale = rsqrtf(total / n + eps);
    for (int i = threadIdx.x; i < n; i += B) st(&orow[i], scale * ld(xr[i]) * ld(nw[i]));
    __syncthreads(); // `part` and this row's writes, before the next row
  }
  if (threadIdx.x == 0) *done = 0;
}

extern "C" __global__ void gemv_add_rmsnorm_bf16(const bf16* xin, int ldx, const bf16* w, bf16* y, int ldy, int rows,
                                                 int n, int k, int parts, bf16* res, const bf16* nw, bf16* out,
                                                 float eps, int vthreads, u32* done) {
  gemv_add_rmsnorm<bf16>(xin, ldx, w, y, ldy, rows, n, k, parts, res, nw, out, eps, vthreads, done);
}

// attn_decode's variants (cuda_decode.cu): the first tile loaded before pdl_wait, with head_dim an
// argument and fixed at 128 (fixed at 128 alone, attn_decode_hd128_bf16, is in cuda_decode.cu).
ATTN_KERNEL(attn_decode_early_bf16, bf16, 0, true)
ATTN_KERNEL(attn_decode_hd128_early_bf16, bf16, 128, true)
