// The kernels of the CUDA prefill pass (src/model/cuda_decode/prefill.rs): prompt chunks of many
// rows, bf16. Included by cuda_decode.cu, whose helpers (ld, st, rnd, finish_vec, block_sum, the
// programmatic-dependent-launch calls) they use; the matrix products run on cuBLAS.
//
// A pass's rows are the chunks' tokens, one after another; each row has its own position and
// pool slot, and attends to every position of its sequence up to its own (causal), through the
// sequence's block table. The q/k/v finishing writes every row's key and value into the pool
// first (`qkv_rows`); the attention (`attn_prefill`) then reads the keys and values of all
// positions, this pass's and earlier ones', from the pool alone.

// A pair of bf16 values in one 32-bit register, the first in the low half, each rounded as `st`
// rounds it.
__device__ __forceinline__ u32 pack_bf16(float a, float b) {
  bf16 x, y;
  st(&x, a);
  st(&y, b);
  return (u32)x | ((u32)y << 16);
}

// d += a · b on the tensor cores (mma m16n8k16, bf16 in, f32 accumulation), with the PTX ISA's
// fragment layouts; g = lane / 4, t = lane % 4:
//   a (16 × 16, row-major): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   b (16 × 8):             b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   d (16 × 8):             d[0..1] = (g, 2t..2t+1), d[2..3] = (g+8, 2t..2t+1)
__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap(); // the host loads the prefill kernels on compute capability 8.0 and later only
#endif
}

// The q/k/v finishing of a pass's rows, as attn_decode's step 1 does it for a decode row (bias,
// q/k RMSNorm, RoPE at the row's position): the queries rounded to T and written back in place,
// the row's key and value written into the pool at its slot. Grid (rows, nkv), NWARP warps, a warp
// per vector (KV head g's rep queries, its key, its value).
template <typename T>
__device__ void qkv_rows(T* q, const T* k, const T* v, int stride, const T* qb, const T* kb, const T* vb, const T* qn,
                         const T* kn, const T* cos, const T* sin, const u32* pos, const u32* slot, T* kpool, T* vpool,
                         int nh, int nkv, int hd, float eps, int interleaved) {
  __shared__ float scratch[NWARP * MAX_HD];
  pdl_start();
  const int r = blockIdx.x, g = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rep = nh / nkv;
  const size_t rope_at = (size_t)pos[r] * (hd / 2);
  for (int vi = warp; vi < rep + 2; vi += NWARP) {
    float x[MAX_J];
    T* dst;
    if (vi < rep) {
      const int hq = g * rep + vi;
      T* src = q + (size_t)r * stride + hq * hd;
      finish_vec<T>(src, qb ? qb + hq * hd : qb, qn, true, cos, sin, rope_at, hd, eps, interleaved,
                    scratch + warp * MAX_HD, x);
      dst = src;
    } else {
      const int is_v = vi - rep;
      const T* bias = is_v ? vb : kb;
      finish_vec<T>((is_v ? v : k) + (size_t)r * stride + g * hd, bias ? bias + g * hd : bias, is_v ? (const T*)0 : kn,
                    !is_v, cos, sin, rope_at, hd, eps, interleaved, scratch + warp * MAX_HD, x);
      dst = (is_v ? vpool : kpool) + ((size_t)slot[r] * nkv + g) * hd;
    }
#pragma unroll
    for (int j = 0; j < MAX_J; j++) {
      const int i = lane + 32 * j;
      if (i < hd) st(&dst[i], x[j]);
    }
  }
}

// out[i] = RMSNorm(x[rows[i]] + add[rows[i]]) · w, the sum rounded to T as add_rmsnorm rounds it
// (x is not written): the final norm of the rows whose logits a prefill pass returns. Grid (those
// rows).
template <typename T>
__device__ void norm_rows(const T* x, const T* add, const T* w, T* out, const u32* rows, int n, float eps) {
  pdl_start();
  const size_t src = (size_t)rows[blockIdx.x] * n;
  T* orow = out + (size_t)blockIdx.x * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = rnd<T>(ld(x[src + i]) + ld(add[src + i]));
    ss += v * v;
  }
  const float scale = rsqrtf(block_sum(ss) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    st(&orow[i], scale * rnd<T>(ld(x[src + i]) + ld(add[src + i])) * ld(w[i]));
}

#define PTILE 64 // query rows of a prefill attention block (16 a warp), and key positions a step

// Causal attention of a pass's rows, flash-attention style, bf16 on the tensor cores. Grid
// (tiles, nh), 4 · KS warps. A tile is up to PTILE consecutive rows of one chunk: `tiles` holds
// per tile its first row in the pass, its row count, the position of its first row and the offset
// of its sequence's block table in `tables`. Block (t, h) attends query head h of the tile's rows
// (queries finished by qkv_rows, `stride` apart) to KV head h / (nh / nkv). Warp w holds rows
// 16 · (w % 4) .. + 16 and takes the keys of split w / 4:
// 1. each warp keeps its 16 queries as mma fragments in registers;
// 2. per step of PTILE key positions, from the first one the tile's first row sees (with a
//    sliding window of `window` > 0 positions, a row at p sees p + 1 − window ..= p) to its last
//    row's position: the step's keys (row-major) and values (transposed) are copied from the pool
//    into shared memory, KS tiles of PTILE / KS positions; each warp whose rows see any of its
//    split's tile computes its scores (S = Q Kᵀ), masks them, runs the online softmax in
//    registers (each row's max and sum kept by the four lanes that hold it, in the log2 domain),
//    and adds P V to its output fragments, P rounded to bf16;
// 3. with KS = 2 the two warps of each row group merge their maxima, sums and outputs through
//    shared memory; the output, divided by each row's sum, rounded to bf16, goes to out
//    ([rows, nh · HD]).
// Splitting the keys between warps halves the longest chain of dependent steps (the tile of a
// short prompt's last rows, which sees every key), where a block has little else to overlap.
template <int HD, int KS>
__device__ void attn_prefill(const bf16* q, int stride, const bf16* kpool, const bf16* vpool, const u32* tiles,
                             const u32* tables, int nh, int nkv, int bs, int window, float scale, bf16* out) {
  constexpr int KT = PTILE / KS; // key positions of a warp's tile
  constexpr int KB = HD / 16, NB = KT / 8, VB = HD / 8, CH = HD / 8;
  constexpr int LDK = HD + 8, LDV = KT + 8; // padded rows: the fragment loads hit 32 banks
  constexpr int TILE_BYTES = KS * (KT * LDK + HD * LDV) * 2;
  constexpr int MERGE = 4 * VB + 4;                             // floats a lane hands its partner
  constexpr int MERGE_BYTES = KS > 1 ? 4 * MERGE * 32 * 4 : 0; // four row groups' lanes
  __shared__ __align__(16) unsigned char smem[TILE_BYTES > MERGE_BYTES ? TILE_BYTES : MERGE_BYTES];
  bf16* const ks = (bf16*)smem;         // [KS][KT][LDK]
  bf16* const vt = ks + KS * KT * LDK;  // [KS][HD][LDV]
  pdl_launch();
  const u32* tile = tiles + 4 * blockIdx.x;
  const int h = blockIdx.y, g = h / (nh / nkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t4 = lane & 3;
  const int split = warp >> 2;
  const int row0 = (int)tile[0], n = (int)tile[1], pos0 = (int)tile[2];
  const u32* table = tables + tile[3];
  pdl_wait();
  const int wrow = (warp & 3) * 16, r0 = wrow + gr, r1 = r0 + 8;
  const bool active = wrow < n;
  const int qp0 = pos0 + r0, qp1 = pos0 + r1, last = pos0 + n - 1;
  const int wfirst = pos0 + wrow, wlast = pos0 + min(wrow + 15, n - 1);
  const int lo = window > 0 ? max(0, pos0 - window + 1) : 0;
  // 1. The queries.
  u32 qa[KB][4];
  {
    const bf16* q0 = q + (size_t)(row0 + min(r0, n - 1)) * stride + h * HD;
    const bf16* q1 = q + (size_t)(row0 + min(r1, n - 1)) * stride + h * HD;
#pragma unroll
    for (int kb = 0; kb < KB; kb++) {
      const int c = kb * 16 + 2 * t4;
      qa[kb][0] = r0 < n ? *(const u32*)(q0 + c) : 0u;
      qa[kb][1] = r1 < n ? *(const u32*)(q1 + c) : 0u;
      qa[kb][2] = r0 < n ? *(const u32*)(q0 + c + 8) : 0u;
      qa[kb][3] = r1 < n ? *(const u32*)(q1 + c + 8) : 0u;
    }
  }
  float o[VB][4];
#pragma unroll
  for (int vb = 0; vb < VB; vb++) o[vb][0] = o[vb][1] = o[vb][2] = o[vb][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float sl2 = scale * 1.4426950408889634f; // scores in the log2 domain
  for (int step = lo / PTILE * PTILE; step <= last; step += PTILE) {
    // 2a. The step's keys: positions before `lo` or after `last` as zeros (never read from the pool).
    __syncthreads(); // the previous step's reads are done
    for (int c = threadIdx.x; c < PTILE * CH; c += KS * 4 * 32) {
      const int p = c / CH, f = (c % CH) * 8, key = step + p;
      uint4 kk = make_uint4(0u, 0u, 0u, 0u), vv = kk;
      if (key >= lo && key <= last) {
        const size_t at = ((size_t)table[key / bs] * (size_t)bs + (size_t)(key % bs)) * (size_t)(nkv * HD) + g * HD + f;
        kk = *(const uint4*)(kpool + at);
        vv = *(const uint4*)(vpool + at);
      }
      const int tk = p / KT, pk = p % KT;
      *(uint4*)(ks + (tk * KT + pk) * LDK + f) = kk;
      const bf16* ve = (const bf16*)&vv;
      bf16* vdst = vt + tk * HD * LDV + pk;
#pragma unroll
      for (int i = 0; i < 8; i++) vdst[(f + i) * LDV] = ve[i];
    }
    __syncthreads();
    const int k0 = step + split * KT; // this warp's tile
    // A warp whose rows see none of its tile skips it (warp-uniform).
    if (!active || k0 > wlast || (window > 0 && k0 + KT <= wfirst + 1 - window)) continue;
    const bf16* kst = ks + split * KT * LDK;
    const bf16* vtt = vt + split * HD * LDV;
    // 2b. Scores.
    float s[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
      s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
      const bf16* kr = kst + (nb * 8 + gr) * LDK + 2 * t4;
#pragma unroll
      for (int kb = 0; kb < KB; kb++) mma_bf16(s[nb], qa[kb], *(const u32*)(kr + kb * 16), *(const u32*)(kr + kb * 16 + 8));
    }
    // 2c. The mask and the online softmax.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + nb * 8 + 2 * t4 + (e & 1), half = e >> 1;
        const int qp = half ? qp1 : qp0, rr = half ? r1 : r0;
        const bool seen = rr < n && key <= qp && (window <= 0 || key > qp - window);
        s[nb][e] = seen ? s[nb][e] * sl2 : -INFINITY;
        mx[half] = fmaxf(mx[half], s[nb][e]);
      }
    }
    float base[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float mnew = fmaxf(m[i], mx[i]);
      // A row that has seen nothing yet keeps max −inf, sum 0 and its (zero) output.
      const float corr = mnew == -INFINITY ? 1.f : exp2f(m[i] - mnew);
      base[i] = mnew == -INFINITY ? 0.f : mnew;
      m[i] = mnew;
      l[i] *= corr;
#pragma unroll
      for (int vb = 0; vb < VB; vb++) {
        o[vb][2 * i] *= corr;
        o[vb][2 * i + 1] *= corr;
      }
    }
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float p = exp2f(s[nb][e] - base[e >> 1]);
        l[e >> 1] += p;
        s[nb][e] = p;
      }
    }
    // 2d. o += P · V: the score fragments of key blocks 2j and 2j + 1 are P's a fragment of k block j.
#pragma unroll
    for (int j = 0; j < KT / 16; j++) {
      const u32 pa[4] = {pack_bf16(s[2 * j][0], s[2 * j][1]), pack_bf16(s[2 * j][2], s[2 * j][3]),
                         pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]), pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3])};
      const bf16* vr = vtt + gr * LDV + j * 16 + 2 * t4;
#pragma unroll
      for (int vb = 0; vb < VB; vb++)
        mma_bf16(o[vb], pa, *(const u32*)(vr + vb * 8 * LDV), *(const u32*)(vr + vb * 8 * LDV + 8));
    }
  }
  // 3. Each row's sum over its four lanes, the merge of the splits, the output.
  if (active) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
  }
  if constexpr (KS > 1) {
    // Split 1 hands its lanes' values to split 0's same lanes (element-major: no bank conflicts).
    float* mg = (float*)smem + (warp & 3) * MERGE * 32 + lane;
    __syncthreads(); // the last step's tiles are read
    if (active && split == 1) {
#pragma unroll
      for (int vb = 0; vb < VB; vb++) {
#pragma unroll
        for (int e = 0; e < 4; e++) mg[(4 * vb + e) * 32] = o[vb][e];
      }
      mg[(4 * VB) * 32] = m[0];
      mg[(4 * VB + 1) * 32] = m[1];
      mg[(4 * VB + 2) * 32] = l[0];
      mg[(4 * VB + 3) * 32] = l[1];
    }
    __syncthreads();
    if (split != 0 || !active) return;
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const float m2 = mg[(4 * VB + i) * 32], l2 = mg[(4 * VB + 2 + i) * 32];
      const float mm = fmaxf(m[i], m2);
      const float a = m[i] == -INFINITY ? 0.f : exp2f(m[i] - mm), b = m2 == -INFINITY ? 0.f : exp2f(m2 - mm);
      l[i] = l[i] * a + l2 * b;
#pragma unroll
      for (int vb = 0; vb < VB; vb++) {
        o[vb][2 * i] = o[vb][2 * i] * a + mg[(4 * vb + 2 * i) * 32] * b;
        o[vb][2 * i + 1] = o[vb][2 * i + 1] * a + mg[(4 * vb + 2 * i + 1) * 32] * b;
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int vb = 0; vb < VB; vb++) {
    const int f = h * HD + vb * 8 + 2 * t4;
    if (r0 < n) *(u32*)(out + (size_t)(row0 + r0) * nh * HD + f) = pack_bf16(o[vb][0] / l[0], o[vb][1] / l[0]);
    if (r1 < n) *(u32*)(out + (size_t)(row0 + r1) * nh * HD + f) = pack_bf16(o[vb][2] / l[1], o[vb][3] / l[1]);
  }
}

extern "C" __global__ void qkv_rows_bf16(bf16* q, const bf16* k, const bf16* v, int stride, const bf16* qb,
                                         const bf16* kb, const bf16* vb, const bf16* qn, const bf16* kn,
                                         const bf16* cos, const bf16* sin, const u32* pos, const u32* slot,
                                         bf16* kpool, bf16* vpool, int nh, int nkv, int hd, float eps,
                                         int interleaved) {
  qkv_rows<bf16>(q, k, v, stride, qb, kb, vb, qn, kn, cos, sin, pos, slot, kpool, vpool, nh, nkv, hd, eps,
                 interleaved);
}

extern "C" __global__ void norm_rows_bf16(const bf16* x, const bf16* add, const bf16* w, bf16* out, const u32* rows,
                                          int n, float eps) {
  norm_rows<bf16>(x, add, w, out, rows, n, eps);
}

// attn_prefill_bf16_h{HD}_k{KS}: KS = 1 (4 warps, every warp over every key) and KS = 2 (8 warps,
// the keys split between two); the host launches 32 · 4 · KS threads.
#define PREFILL_KERNEL(HD, KS)                                                                                    \
  extern "C" __global__ void __launch_bounds__(KS * 4 * 32)                                                      \
      attn_prefill_bf16_h##HD##_k##KS(const bf16* q, int stride, const bf16* kpool, const bf16* vpool,           \
                                      const u32* tiles, const u32* tables, int nh, int nkv, int bs, int window,   \
                                      float scale, bf16* out) {                                                   \
    attn_prefill<HD, KS>(q, stride, kpool, vpool, tiles, tables, nh, nkv, bs, window, scale, out);               \
  }
#define PREFILL_KERNELS(HD) PREFILL_KERNEL(HD, 1) PREFILL_KERNEL(HD, 2)
PREFILL_KERNELS(16)
PREFILL_KERNELS(32)
PREFILL_KERNELS(64)
PREFILL_KERNELS(128)
