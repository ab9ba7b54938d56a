// The kernels of the CUDA decode step (src/model/cuda_decode.rs): everything of a decode pass
// except the matrix products (cuBLAS), for an element type T of float or bf16. No CUDA headers:
// bf16 is held as its 16 bits and widened / rounded (to nearest even, as __float2bfloat16) here.
// Every kernel reads its sizes from arguments and its per-row inputs (token ids, positions, KV
// slots, block tables) from device buffers, so one captured launch serves every step.
//
// Numerics follow the generic path's candle kernels: f32 accumulation, one rounding to T per
// stored value, and in bf16 the rounding of each RoPE product that bf16 arithmetic does.

typedef unsigned short bf16;
typedef unsigned int u32;

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(bf16 x) { return __uint_as_float(((u32)x) << 16); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16* p, float v) {
  u32 u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) { *p = (bf16)((u >> 16) | 0x40u); return; }
  u += 0x7fffu + ((u >> 16) & 1u);
  *p = (bf16)(u >> 16);
}
template <typename T> __device__ __forceinline__ float rnd(float v) { T t; st(&t, v); return ld(t); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum of `v` over the block (blockDim.x a multiple of 32, at most 1024), in every thread.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (lane == 0) part[w] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : 0.f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}

// out[r] = table[ids[r]]: grid (rows).
template <typename T> __device__ void embed(const T* table, const u32* ids, T* out, int h) {
  const T* src = table + (size_t)ids[blockIdx.x] * h;
  T* dst = out + (size_t)blockIdx.x * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = src[i];
}

// With `add`: x += add (rounded to T, written back); then out = RMSNorm(x) · w. Grid (rows).
template <typename T>
__device__ void add_rmsnorm(T* x, const T* add, const T* w, T* out, int n, float eps) {
  T* xr = x + (size_t)blockIdx.x * n;
  T* orow = out + (size_t)blockIdx.x * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = ld(xr[i]);
    if (add) {
      v = rnd<T>(v + ld(add[(size_t)blockIdx.x * n + i]));
      st(&xr[i], v);
    }
    ss += v * v;
  }
  const float scale = rsqrtf(block_sum(ss) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) st(&orow[i], scale * ld(xr[i]) * ld(w[i]));
}

// One block per (row, head) over the query heads, then the key heads, then the value heads
// (grid (rows, nh + 2·nkv), blockDim.x = hd rounded up to 32): bias, per-head RMSNorm (Qwen3),
// RoPE at the row's position. The projections are read at q, k, v with a row stride of `stride`
// elements (one fused product or three); queries go to `qout` ([rows, nh·hd]), keys and values
// into the layer's pool at the row's slot.
template <typename T>
__device__ void qkv_finish(const T* q, const T* k, const T* v, int stride, T* qout, const T* qb, const T* kb, const T* vb,
                           const T* qn, const T* kn, const T* cos, const T* sin, const u32* pos, const u32* slot,
                           T* kpool, T* vpool, int nh, int nkv, int hd, float eps, int interleaved) {
  __shared__ float buf[1024];
  const int row = blockIdx.x, head = blockIdx.y, i = threadIdx.x;
  const int kind = head < nh ? 0 : head < nh + nkv ? 1 : 2;
  const int h = kind == 0 ? head : kind == 1 ? head - nh : head - nh - nkv;
  const T* src = (kind == 0 ? q : kind == 1 ? k : v) + (size_t)row * stride + h * hd;
  const T* bias = kind == 0 ? qb : kind == 1 ? kb : vb;
  const T* norm = kind == 0 ? qn : kind == 1 ? kn : (const T*)0;
  float x = 0.f;
  if (i < hd) {
    x = ld(src[i]);
    if (bias) x = rnd<T>(x + ld(bias[h * hd + i]));
  }
  if (norm) {
    const float scale = rsqrtf(block_sum(x * x) / hd + eps);
    if (i < hd) x = rnd<T>(scale * x * ld(norm[i]));
  }
  const size_t at = (size_t)slot[row] * nkv * hd + h * hd;
  if (kind == 2) {
    if (i < hd) st(&vpool[at + i], x);
    return;
  }
  buf[i] = x;
  __syncthreads();
  if (i >= hd) return;
  const int half = hd / 2;
  const size_t p = (size_t)pos[row] * half;
  float y;
  if (interleaved) {
    const int j = i >> 1;
    const float c = ld(cos[p + j]), s = ld(sin[p + j]);
    const float a = buf[2 * j], b = buf[2 * j + 1];
    y = (i & 1) ? rnd<T>(a * s) + rnd<T>(b * c) : rnd<T>(a * c) - rnd<T>(b * s);
  } else {
    const int j = i < half ? i : i - half;
    const float c = ld(cos[p + j]), s = ld(sin[p + j]);
    const float a = buf[j], b = buf[j + half];
    y = i < half ? rnd<T>(a * c) - rnd<T>(b * s) : rnd<T>(a * s) + rnd<T>(b * c);
  }
  if (kind == 0) st(&qout[((size_t)row * nh + h) * hd + i], y);
  else st(&kpool[at + i], y);
}

#define TILE 64
#define MAX_REP 8
#define MAX_DIMS 2 // head_dim <= MAX_DIMS · blockDim.x (128)
#define UNROLL 4   // positions whose keys a warp loads before it reduces their scores

// Paged attention of decode rows, split along the context (flash-decoding). Grid (rows, nkv,
// splits), 128 threads: block (r, g, s) attends the query heads g·rep .. g·rep+rep of row r to
// positions [s·split, min(L, (s+1)·split)) of its sequence (L = lens[r]), in tiles of TILE
// positions with an online softmax, and writes its running max, sum and unnormalised output
// to the workspace. The last of a (row, group)'s blocks to finish (a counter in `done`, which
// it sets back to 0) merges the splits into `out` ([rows, nh·hd]). Keys and values are read through the
// row's block table: tables[toff[r] + p / bs] is the block of position p. Loads are issued
// several positions at a time: at one row per step this kernel is bound by memory latency.
template <typename T>
__device__ void attn_split(const T* q, const T* kpool, const T* vpool, const u32* tables, const u32* toff,
                           const u32* lens, float* ws_ml, float* ws_acc, u32* done, T* out, int nh, int nkv, int hd,
                           int bs, int split, int max_splits, float scale) {
  __shared__ float qs[MAX_REP * 256];
  __shared__ float sc[MAX_REP * TILE];
  __shared__ float msh[MAX_REP];
  __shared__ u32 rows_at[TILE];
  const int r = blockIdx.x, g = blockIdx.y, sp = blockIdx.z;
  const int L = lens[r];
  const int start = sp * split;
  if (start >= L) return;
  const int end = min(L, start + split);
  const int rep = nh / nkv;
  const int stride = nkv * hd;
  const T* qrow = q + (size_t)r * nh * hd + (size_t)g * rep * hd;
  for (int i = threadIdx.x; i < rep * hd; i += blockDim.x) qs[i] = ld(qrow[i]);
  const u32* table = tables + toff[r];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  float m[MAX_REP], l[MAX_REP], acc[MAX_REP][MAX_DIMS];
#pragma unroll
  for (int h = 0; h < MAX_REP; h++) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int k = 0; k < MAX_DIMS; k++) acc[h][k] = 0.f;
  }
  for (int t0 = start; t0 < end; t0 += TILE) {
    const int nt = min(TILE, end - t0);
    for (int p = threadIdx.x; p < nt; p += blockDim.x) {
      const int at = t0 + p;
      rows_at[p] = table[at / bs] * (u32)bs + (u32)(at % bs);
    }
    __syncthreads();
    // Scores: UNROLL positions per warp at a time, lanes across the head's features.
    for (int p0 = warp; p0 < nt; p0 += nw * UNROLL) {
      float d[UNROLL][MAX_REP];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
#pragma unroll
        for (int h = 0; h < MAX_REP; h++) d[u][h] = 0.f;
      }
      for (int i = lane; i < hd; i += 32) {
        float kv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
          const int p = p0 + u * nw;
          kv[u] = p < nt ? ld(kpool[(size_t)rows_at[p] * stride + g * hd + i]) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
#pragma unroll
          for (int h = 0; h < MAX_REP; h++)
            if (h < rep) d[u][h] += qs[h * hd + i] * kv[u];
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; u++) {
        const int p = p0 + u * nw;
#pragma unroll
        for (int h = 0; h < MAX_REP; h++) {
          if (h < rep) {
            const float s = warp_sum(d[u][h]);
            if (lane == 0 && p < nt) sc[h * TILE + p] = s * scale;
          }
        }
      }
    }
    __syncthreads();
    // Online softmax: every thread tracks the running max and sum; the tile's weights are
    // computed once into `sc`.
    float mnew[MAX_REP];
#pragma unroll
    for (int h = 0; h < MAX_REP; h++) {
      mnew[h] = m[h];
      if (h < rep)
        for (int p = 0; p < nt; p++) mnew[h] = fmaxf(mnew[h], sc[h * TILE + p]);
      if (threadIdx.x == 0) msh[h] = mnew[h];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < rep * TILE; idx += blockDim.x) {
      if (idx % TILE < nt) sc[idx] = __expf(sc[idx] - msh[idx / TILE]);
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < MAX_REP; h++) {
      if (h < rep) {
        const float corr = __expf(m[h] - mnew[h]);
        m[h] = mnew[h];
        float sum = 0.f;
        for (int p = 0; p < nt; p++) sum += sc[h * TILE + p];
        l[h] = l[h] * corr + sum;
#pragma unroll
        for (int k = 0; k < MAX_DIMS; k++) acc[h][k] *= corr;
      }
    }
    // Values: every thread owns features threadIdx.x + k·blockDim.x.
#pragma unroll 8
    for (int p = 0; p < nt; p++) {
      const T* vrow = vpool + (size_t)rows_at[p] * stride + g * hd;
      float vv[MAX_DIMS];
#pragma unroll
      for (int k = 0; k < MAX_DIMS; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        vv[k] = i < hd ? ld(vrow[i]) : 0.f;
      }
#pragma unroll
      for (int h = 0; h < MAX_REP; h++) {
        if (h < rep) {
          const float w = sc[h * TILE + p];
#pragma unroll
          for (int k = 0; k < MAX_DIMS; k++) acc[h][k] += w * vv[k];
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int h = 0; h < MAX_REP; h++) {
    if (h < rep) {
      const size_t idx = ((size_t)r * nh + g * rep + h) * max_splits + sp;
      if (threadIdx.x == 0) {
        ws_ml[2 * idx] = m[h];
        ws_ml[2 * idx + 1] = l[h];
      }
#pragma unroll
      for (int k = 0; k < MAX_DIMS; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < hd) ws_acc[idx * hd + i] = acc[h][k];
      }
    }
  }
  // The merge, by the last block of this (row, group): the others' partials are read from L2.
  __shared__ bool last;
  const int ns = (L + split - 1) / split;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&done[r * nkv + g], 1u) == (u32)(ns - 1);
  __syncthreads();
  if (!last) return;
  for (int h = 0; h < rep; h++) {
    const size_t base = ((size_t)r * nh + g * rep + h) * max_splits;
    float mx = -INFINITY;
    for (int s = 0; s < ns; s++) mx = fmaxf(mx, __ldcg(&ws_ml[2 * (base + s)]));
#pragma unroll
    for (int k = 0; k < MAX_DIMS; k++) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i >= hd) continue;
      float den = 0.f, num = 0.f;
#pragma unroll 4
      for (int s = 0; s < ns; s++) {
        const float w = __expf(__ldcg(&ws_ml[2 * (base + s)]) - mx);
        den += __ldcg(&ws_ml[2 * (base + s) + 1]) * w;
        num += __ldcg(&ws_acc[(base + s) * hd + i]) * w;
      }
      st(&out[((size_t)r * nh + g * rep + h) * hd + i], num / den);
    }
  }
  if (threadIdx.x == 0) done[r * nkv + g] = 0;
}

// Holds the device busy for `cycles` clock cycles: EXPERT_RUNTIME_CUDA_TIMING queues a pass
// behind it, so the events around each kernel time the kernel and not the host's launches.
extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// out[r, c] = silu(gate[r, c]) · up[r, c] ([rows, inter], gate and up read with a row stride of
// `stride`), each rounded to T as the generic path's two kernels do. Grid-stride over rows · inter.
template <typename T> __device__ void silu_mul(const T* gate, const T* up, int stride, T* out, int inter, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const size_t at = (size_t)(i / inter) * stride + i % inter;
    const float g = ld(gate[at]);
    st(&out[i], rnd<T>(g / (1.f + __expf(-g))) * ld(up[at]));
  }
}

// f32 logits from T ones. Grid-stride.
template <typename T> __device__ void widen(const T* src, float* dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = ld(src[i]);
}

// Per row of f32 logits [rows, vocab]: the max, the lowest id reaching it, and log Σ exp(x − max)
// (engine::readback's greedy reduction). Grid (rows, parts), 256 threads: each block reduces a
// slice of the row to a partial (max, id, Σ exp(x − its max)); the last block of the row (a
// counter in `done`, set back to 0) merges them. NaNs are skipped by the max and make the sum
// NaN, which sends the row to the host whole; −inf logits add nothing.
extern "C" __global__ void greedy_reduce(const float* logits, float* part, u32* done, float* out, int vocab) {
  __shared__ float sm[32];
  __shared__ int si[32];
  __shared__ bool last;
  const int r = blockIdx.x, b = blockIdx.y, nb = gridDim.y;
  const int chunk = (vocab + nb - 1) / nb, lo = min(vocab, b * chunk), hi = min(vocab, lo + chunk);
  const float* row = logits + (size_t)r * vocab;
  float m = -INFINITY;
  int id = vocab;
#pragma unroll 4
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float v = row[i];
    if (v > m) {
      m = v;
      id = i;
    }
  }
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int round = 0; round < 2; round++) {
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, id, o);
      if (m2 > m || (m2 == m && i2 < id)) {
        m = m2;
        id = i2;
      }
    }
    if (round == 1) break;
    if (lane == 0) {
      sm[w] = m;
      si[w] = id;
    }
    __syncthreads();
    m = lane < nw ? sm[lane] : -INFINITY;
    id = lane < nw ? si[lane] : vocab;
  }
  float sum = 0.f;
#pragma unroll 4
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float v = row[i];
    sum += v == -INFINITY ? 0.f : expf(v - m);
  }
  sum = block_sum(sum);
  float* p = part + ((size_t)r * nb + b) * 3;
  if (threadIdx.x == 0) {
    p[0] = m;
    p[1] = (float)id;
    p[2] = sum;
    __threadfence();
    last = atomicAdd(&done[r], 1u) == (u32)(nb - 1);
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  const float* q = part + (size_t)r * nb * 3;
  float mx = -INFINITY;
  int best = vocab;
  for (int j = 0; j < nb; j++) {
    const float mj = __ldcg(&q[3 * j]);
    const int ij = (int)__ldcg(&q[3 * j + 1]);
    if (mj > mx || (mj == mx && ij < best)) {
      mx = mj;
      best = ij;
    }
  }
  float total = 0.f;
  for (int j = 0; j < nb; j++) total += __ldcg(&q[3 * j + 2]) * expf(__ldcg(&q[3 * j]) - mx);
  out[3 * r] = mx;
  out[3 * r + 1] = (float)best;
  out[3 * r + 2] = logf(total);
  done[r] = 0;
}

#define GEMV_ROWS 4

// y[r, n] = Σ_k x[r, k] · w[n, k] for rows r < rows (at most GEMV_ROWS): the decode steps'
// matrix products, bound by reading w once. One warp per output n, 16-byte loads of w and x
// (k and the row strides multiples of 16 bytes, checked by the host), several in flight per lane;
// f32 accumulation, one rounding to T. Grid: one warp per output row, 256 threads.
template <typename T>
__device__ void gemv(const T* x, int ldx, const T* w, T* y, int ldy, int rows, int n, int k) {
  constexpr int V = 16 / sizeof(T);
  const int out = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
  if (out >= n) return;
  const T* wr = w + (size_t)out * k;
  float acc[GEMV_ROWS];
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; r++) acc[r] = 0.f;
#pragma unroll 4
  for (int i = lane * V; i < k; i += 32 * V) {
    const uint4 wraw = *(const uint4*)(wr + i);
    const T* wv = (const T*)&wraw;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) {
      if (r < rows) {
        const uint4 xraw = *(const uint4*)(x + (size_t)r * ldx + i);
        const T* xv = (const T*)&xraw;
#pragma unroll
        for (int j = 0; j < V; j++) acc[r] += ld(xv[j]) * ld(wv[j]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; r++) {
    if (r < rows) {
      const float v = warp_sum(acc[r]);
      if (lane == 0) st(&y[(size_t)r * ldy + out], v);
    }
  }
}

// act[r, n] = silu(g) · u with g = x[r]·gate[n], u = x[r]·up[n] (each rounded to T, then silu(g)
// and the product, as the generic path's kernels do): the MLP's gate and up products and its
// SiLU·mul in one pass over both weights. One warp per n < inter, rows r < rows (at most
// GEMV_ROWS); the same alignment rules as gemv. Grid: one warp per n, 256 threads.
template <typename T>
__device__ void gemv_gate_up(const T* x, int ldx, const T* gate, const T* up, T* act, int rows, int inter, int k) {
  constexpr int V = 16 / sizeof(T);
  const int n = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
  if (n >= inter) return;
  const T* gr = gate + (size_t)n * k;
  const T* ur = up + (size_t)n * k;
  float ag[GEMV_ROWS], au[GEMV_ROWS];
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; r++) ag[r] = au[r] = 0.f;
#pragma unroll 2
  for (int i = lane * V; i < k; i += 32 * V) {
    const uint4 graw = *(const uint4*)(gr + i);
    const uint4 uraw = *(const uint4*)(ur + i);
    const T* gv = (const T*)&graw;
    const T* uv = (const T*)&uraw;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) {
      if (r < rows) {
        const uint4 xraw = *(const uint4*)(x + (size_t)r * ldx + i);
        const T* xv = (const T*)&xraw;
#pragma unroll
        for (int j = 0; j < V; j++) {
          const float a = ld(xv[j]);
          ag[r] += a * ld(gv[j]);
          au[r] += a * ld(uv[j]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; r++) {
    if (r < rows) {
      const float g = rnd<T>(warp_sum(ag[r]));
      const float u = rnd<T>(warp_sum(au[r]));
      if (lane == 0) st(&act[(size_t)r * inter + n], rnd<T>(g / (1.f + __expf(-g))) * u);
    }
  }
}

#define LORA_MAX 4   // adapters per row and module
#define LORA_RANK 64 // rank at most

// One adapter of a module in a set's LoRA table (src/model/cuda_decode.rs writes them): per module
// slot (layer · 7 + projection), LORA_MAX entries, unused ones of rank 0.
struct LoraEntry {
  unsigned long long a, b; // A [rank, in], B [out, rank], in the model dtype
  int rank;
  float scale;
};

// t[r, e, j] = Σ_k x[r, k] · A_e[j, k] (rounded to T) for the adapters e of module `slot` in row
// r's set (its table at sets[r]; 0: the base model). Grid (rows, LORA_MAX, LORA_RANK / 8), 256
// threads: a warp per (row, adapter, j).
template <typename T>
__device__ void lora_shrink(const unsigned long long* sets, int slot, const T* x, int ldx, int k, float* t) {
  const int r = blockIdx.x, e = blockIdx.y, j = blockIdx.z * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  const unsigned long long set = sets[r];
  if (!set) return;
  const LoraEntry en = ((const LoraEntry*)set)[slot * LORA_MAX + e];
  if (j >= en.rank) return;
  const T* a = (const T*)en.a + (size_t)j * k;
  const T* xr = x + (size_t)r * ldx;
  float acc = 0.f;
#pragma unroll 8
  for (int i = lane; i < k; i += 32) acc += ld(xr[i]) * ld(a[i]);
  acc = warp_sum(acc);
  if (lane == 0) t[((size_t)r * LORA_MAX + e) * LORA_RANK + j] = rnd<T>(acc);
}

// y[r, n] += s_e · B_e[n] · t[r, e] for n < out and each adapter of the row's set in order (rows
// of y `ldy` apart), each product, scaling and sum rounded to T as the generic path's ops do.
// Grid (rows, out / 256 rounded up), 256 threads.
template <typename T>
__device__ void lora_expand(const unsigned long long* sets, int slot, const float* t, T* y, int ldy, int out) {
  const int r = blockIdx.x, n = blockIdx.y * blockDim.x + threadIdx.x;
  const unsigned long long set = sets[r];
  if (!set || n >= out) return;
  const LoraEntry* ens = (const LoraEntry*)set + slot * LORA_MAX;
  float yv = ld(y[(size_t)r * ldy + n]);
  for (int e = 0; e < LORA_MAX; e++) {
    const LoraEntry en = ens[e];
    if (en.rank == 0) break;
    const T* b = (const T*)en.b + (size_t)n * en.rank;
    const float* tr = t + ((size_t)r * LORA_MAX + e) * LORA_RANK;
    float u = 0.f;
    for (int j = 0; j < en.rank; j++) u += ld(b[j]) * tr[j];
    yv = rnd<T>(yv + rnd<T>(rnd<T>(u) * en.scale));
  }
  st(&y[(size_t)r * ldy + n], yv);
}

#define KERNELS(T, S)                                                                                             \
  extern "C" __global__ void embed_##S(const T* table, const u32* ids, T* out, int h) { embed<T>(table, ids, out, h); } \
  extern "C" __global__ void add_rmsnorm_##S(T* x, const T* add, const T* w, T* out, int n, float eps) {            \
    add_rmsnorm<T>(x, add, w, out, n, eps);                                                                       \
  }                                                                                                               \
  extern "C" __global__ void qkv_finish_##S(const T* q, const T* k, const T* v, int stride, T* qout, const T* qb,     \
                                            const T* kb, const T* vb, const T* qn, const T* kn, const T* cos,      \
                                            const T* sin, const u32* pos, const u32* slot, T* kpool, T* vpool,     \
                                            int nh, int nkv, int hd, float eps, int interleaved) {                \
    qkv_finish<T>(q, k, v, stride, qout, qb, kb, vb, qn, kn, cos, sin, pos, slot, kpool, vpool, nh, nkv, hd, eps,     \
                  interleaved);                                                                                   \
  }                                                                                                               \
  extern "C" __global__ void attn_split_##S(const T* q, const T* kpool, const T* vpool, const u32* tables,          \
                                            const u32* toff, const u32* lens, float* ws_ml, float* ws_acc,         \
                                            u32* done, T* out, int nh, int nkv, int hd, int bs, int split,         \
                                            int max_splits, float scale) {                                        \
    attn_split<T>(q, kpool, vpool, tables, toff, lens, ws_ml, ws_acc, done, out, nh, nkv, hd, bs, split,          \
                  max_splits, scale);                                                                             \
  }                                                                                                               \
  extern "C" __global__ void silu_mul_##S(const T* gate, const T* up, int stride, T* out, int inter, int n) {          \
    silu_mul<T>(gate, up, stride, out, inter, n);                                                                     \
  }                                                                                                               \
  extern "C" __global__ void widen_##S(const T* src, float* dst, int n) { widen<T>(src, dst, n); }                 \
  extern "C" __global__ void gemv_##S(const T* x, int ldx, const T* w, T* y, int ldy, int rows, int n, int k) {   \
    gemv<T>(x, ldx, w, y, ldy, rows, n, k);                                                                       \
  }                                                                                                               \
  extern "C" __global__ void gemv_gate_up_##S(const T* x, int ldx, const T* gate, const T* up, T* act, int rows,  \
                                              int inter, int k) {                                                 \
    gemv_gate_up<T>(x, ldx, gate, up, act, rows, inter, k);                                                       \
  }                                                                                                               \
  extern "C" __global__ void lora_shrink_##S(const unsigned long long* sets, int slot, const T* x, int ldx, int k,  \
                                             float* t) {                                                          \
    lora_shrink<T>(sets, slot, x, ldx, k, t);                                                                     \
  }                                                                                                               \
  extern "C" __global__ void lora_expand_##S(const unsigned long long* sets, int slot, const float* t, T* y, int ldy, \
                                             int out) {                                                           \
    lora_expand<T>(sets, slot, t, y, ldy, out);                                                                   \
  }

KERNELS(float, f32)
KERNELS(bf16, bf16)
