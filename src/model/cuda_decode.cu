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

// Programmatic dependent launch (sm_90; the host launches each kernel with the attribute that
// allows it): `pdl_launch` lets the stream's next kernel start its blocks now, `pdl_wait` waits
// until the previous kernel has finished and its writes are visible. Every kernel calls both,
// and reads only inputs that no kernel of the pass writes (weights, block tables, the uploaded
// row inputs) before `pdl_wait`; it writes nothing before it. Without the attribute both are
// no-ops.
__device__ __forceinline__ void pdl_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_start() {
  pdl_launch();
  pdl_wait();
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
  pdl_start();
  const T* src = table + (size_t)ids[blockIdx.x] * h;
  T* dst = out + (size_t)blockIdx.x * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = src[i];
}

// With `add`: x += add (rounded to T, written back); then out = RMSNorm(x) · w. Grid (rows).
template <typename T>
__device__ void add_rmsnorm(T* x, const T* add, const T* w, T* out, int n, float eps) {
  pdl_start();
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

#define NWARP 4     // warps of an attention block
#define MAX_REP 8   // query heads per KV head
#define MAX_HD 256  // head_dim at most
#define MAX_J (MAX_HD / 32)          // features per lane of a warp
#define MAX_SPLITS 64
// Positions of an attention tile: 32 in bf16, 16 in f32 (a tile of keys and values, padded,
// stays within 48 KB of shared memory at head_dim 256).
#define ATILE(T) (64 / (int)sizeof(T))

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One head vector of a row's projections finished by a warp: bias, per-head RMSNorm (when `norm`),
// RoPE at the cos/sin offset `p` (when `rope`). Lane l returns features l + 32·j in x[j]: rounded to
// T, except the RoPE outputs, which the caller rounds as it stores them. `buf` (head_dim floats of
// shared memory, this warp's own) holds the pairs RoPE mixes. Every input is loaded before the
// first is used, so the loads are in flight together.
template <typename T>
__device__ void finish_vec(const T* src, const T* bias, const T* norm, bool rope, const T* cos, const T* sin, size_t p,
                           int hd, float eps, int interleaved, float* buf, float (&x)[MAX_J]) {
  const int lane = threadIdx.x & 31, half = hd / 2;
  float b[MAX_J], w[MAX_J], co[MAX_J], si[MAX_J];
#pragma unroll
  for (int j = 0; j < MAX_J; j++) {
    const int i = lane + 32 * j;
    x[j] = b[j] = co[j] = si[j] = 0.f;
    w[j] = 1.f;
    if (i < hd) {
      x[j] = ld(src[i]);
      if (bias) b[j] = ld(bias[i]);
      if (norm) w[j] = ld(norm[i]);
      if (rope) {
        const int c = interleaved ? i >> 1 : i < half ? i : i - half;
        co[j] = ld(cos[p + c]);
        si[j] = ld(sin[p + c]);
      }
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < MAX_J; j++) {
    if (bias) x[j] = rnd<T>(x[j] + b[j]);
    ss += x[j] * x[j];
  }
  if (norm) {
    const float scale = rsqrtf(warp_sum(ss) / hd + eps);
#pragma unroll
    for (int j = 0; j < MAX_J; j++) x[j] = rnd<T>(scale * x[j] * w[j]);
  }
  if (!rope) return;
#pragma unroll
  for (int j = 0; j < MAX_J; j++) {
    const int i = lane + 32 * j;
    if (i < hd) buf[i] = x[j];
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < MAX_J; j++) {
    const int i = lane + 32 * j;
    if (i >= hd) continue;
    if (interleaved) {
      const int c = i >> 1;
      const float a = buf[2 * c], bb = buf[2 * c + 1];
      x[j] = (i & 1) ? rnd<T>(a * si[j]) + rnd<T>(bb * co[j]) : rnd<T>(a * co[j]) - rnd<T>(bb * si[j]);
    } else {
      const int c = i < half ? i : i - half;
      const float a = buf[c], bb = buf[c + half];
      x[j] = i < half ? rnd<T>(a * co[j]) - rnd<T>(bb * si[j]) : rnd<T>(a * si[j]) + rnd<T>(bb * co[j]);
    }
  }
  __syncwarp();
}

// The attention of decode rows, with their q/k/v finishing, split along the context
// (flash-decoding). Grid (rows, nkv, splits), NWARP warps; dynamic shared memory for one tile of
// keys and values (`tile_bytes` in cuda_decode.rs). Block (r, g, s):
// 1. finishes the query heads g·rep .. g·rep+rep of row r (bias, q-norm, RoPE) from the
//    projections `q`, `k`, `v` (row stride `stride`), a warp per vector; the block whose split
//    holds the row's new position also finishes KV head g's key and value and writes them into
//    the pool at the row's slot (and keeps them for its own tile);
// 2. attends them to positions [s·split, min(L, (s+1)·split)) of the row (L = lens[r]) in tiles
//    of ATILE positions: the tile's keys and values are copied to shared memory in one round of
//    16-byte loads (the kernel is bound by memory latency at a few rows), then scores (ATILE / 128
//    threads per position), an online softmax (a warp per head, a lane per position) and the
//    weighted values (a thread per feature) run from there;
// 3. with one split, writes the output; otherwise writes its running max, sum and unnormalised
//    output to the workspace, and the last of the (row, group)'s blocks to finish (a counter in
//    `done`, set back to 0) merges the splits into `out` ([rows, nh·hd]).
// Keys and values are read through the row's block table: tables[toff[r] + p / bs] is the block
// of position p. head_dim must be a multiple of 16 bytes / sizeof(T) (the host checks).
//
// Two variants (benches/cuda/kernels.cu checks and times them): HDC, head_dim fixed at compile
// time (0: the argument `hd_arg`; the decode path runs HDC = 128 for bf16 models of that head_dim),
// and EARLY, the first tile's keys and values (all but the new position) loaded before `pdl_wait`,
// while the previous kernel finishes: earlier passes wrote them, and only this kernel writes the
// pool during a pass (measured slower on an H200, so not used).
template <typename T, int HDC = 0, bool EARLY = false>
__device__ void attn_decode(const T* q, const T* k, const T* v, int stride, const T* qb, const T* kb, const T* vb,
                            const T* qn, const T* kn, const T* cos, const T* sin, const u32* pos, const u32* slot,
                            T* kpool, T* vpool, const u32* tables, const u32* toff, const u32* lens, float* ws_ml,
                            float* ws_acc, u32* done, T* out, int nh, int nkv, int hd_arg, int bs, int split,
                            float scale, float eps, int interleaved) {
  constexpr int HDM = HDC ? HDC : MAX_HD, MF = HDM / (NWARP * 32);
  constexpr int TILE = ATILE(T), TPP = NWARP * 32 / TILE, V = 16 / sizeof(T), MAX_CH = TILE * (HDM / V) / (NWARP * 32);
  static_assert(HDC % (NWARP * 32) == 0 && HDC <= MAX_HD, "HDC: a multiple of the block's threads, at most MAX_HD");
  const int hd = HDC ? HDC : hd_arg;
  extern __shared__ __align__(16) unsigned char tile_mem[];
  __shared__ __align__(16) float qs[MAX_REP * MAX_HD]; // the queries
  __shared__ float scratch[NWARP * MAX_HD];            // RoPE pairs; then scores; then the merge's
  __shared__ __align__(16) T fresh[2][MAX_HD];         // the new key and value
  __shared__ u32 rows_at[TILE];
  __shared__ float ms[MAX_REP], ls[MAX_REP], cs[MAX_REP];
  __shared__ bool last;
  pdl_launch();
  const int r = blockIdx.x, g = blockIdx.y, sp = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int L = lens[r];
  const int start = sp * split;
  if (start >= L) return;
  const int end = min(L, start + split);
  const int rep = nh / nkv, kvs = nkv * hd, ldt = hd + V, chunks = hd / V;
  const bool owner = end == L;
  T* ktile = (T*)tile_mem;
  T* vtile = ktile + TILE * ldt;
  const u32* table = tables + toff[r];
  // The first tile's pool rows, looked up while the vectors are finished.
  u32 row = 0;
  if (threadIdx.x < min(TILE, end - start)) {
    const int at = start + threadIdx.x;
    row = table[at / bs] * (u32)bs + (u32)(at % bs);
  }
  uint4 kr0[MAX_CH], vr0[MAX_CH];
  if constexpr (EARLY) {
#pragma unroll
    for (int j = 0; j < MAX_CH; j++) {
      const int c = threadIdx.x + j * NWARP * 32;
      if (c < min(TILE, end - start) * chunks) {
        const int at = start + c / chunks;
        if (!owner || at != L - 1) {
          const size_t e = (size_t)(table[at / bs] * (u32)bs + (u32)(at % bs)) * kvs + g * hd + (c % chunks) * V;
          kr0[j] = *(const uint4*)(kpool + e);
          vr0[j] = *(const uint4*)(vpool + e);
        }
      }
    }
  }
  pdl_wait();

  // 1. The queries (and the new key and value), a warp per vector.
  const size_t rope_at = (size_t)pos[r] * (hd / 2);
  for (int vi = warp; vi < rep + (owner ? 2 : 0); vi += NWARP) {
    float x[MAX_J];
    if (vi < rep) {
      const int hq = g * rep + vi;
      finish_vec<T>(q + (size_t)r * stride + hq * hd, qb ? qb + hq * hd : qb, qn, true, cos, sin, rope_at, hd, eps,
                    interleaved, scratch + warp * MAX_HD, x);
#pragma unroll
      for (int j = 0; j < MAX_J; j++)
        if (lane + 32 * j < hd) qs[vi * hd + lane + 32 * j] = rnd<T>(x[j]);
    } else {
      const int is_v = vi - rep;
      const T* bias = is_v ? vb : kb;
      finish_vec<T>((is_v ? v : k) + (size_t)r * stride + g * hd, bias ? bias + g * hd : bias, is_v ? (const T*)0 : kn,
                    !is_v, cos, sin, rope_at, hd, eps, interleaved, scratch + warp * MAX_HD, x);
      T* dst = (is_v ? vpool : kpool) + (size_t)slot[r] * kvs + g * hd;
#pragma unroll
      for (int j = 0; j < MAX_J; j++) {
        const int i = lane + 32 * j;
        if (i < hd) {
          st(&dst[i], x[j]);
          st(&fresh[is_v][i], x[j]);
        }
      }
    }
  }
  if (threadIdx.x < MAX_REP) {
    ms[threadIdx.x] = -INFINITY;
    ls[threadIdx.x] = 0.f;
  }

  float acc[MAX_REP][MF];
#pragma unroll
  for (int h = 0; h < MAX_REP; h++) {
#pragma unroll
    for (int j = 0; j < MF; j++) acc[h][j] = 0.f;
  }
  float* sc = scratch;
  for (int t0 = start; t0 < end; t0 += TILE) {
    const int nt = min(TILE, end - t0);
    if (t0 != start && threadIdx.x < nt) {
      const int at = t0 + threadIdx.x;
      row = table[at / bs] * (u32)bs + (u32)(at % bs);
    }
    if (threadIdx.x < nt) rows_at[threadIdx.x] = row;
    __syncthreads(); // rows_at; the queries and the fresh key and value; the last tile's reads done
    // 2a. The tile into shared memory: all loads in flight, then the stores. The new position
    // comes from `fresh` (the pool's copy may not be visible yet).
    uint4 kr[MAX_CH], vr[MAX_CH];
#pragma unroll
    for (int j = 0; j < MAX_CH; j++) {
      const int c = threadIdx.x + j * NWARP * 32;
      if (c < nt * chunks) {
        const int p = c / chunks, off = (c % chunks) * V;
        if (owner && t0 + p == L - 1) {
          kr[j] = *(const uint4*)&fresh[0][off];
          vr[j] = *(const uint4*)&fresh[1][off];
        } else if (EARLY && t0 == start) {
          kr[j] = kr0[j];
          vr[j] = vr0[j];
        } else {
          const size_t at = (size_t)rows_at[p] * kvs + g * hd + off;
          kr[j] = *(const uint4*)(kpool + at);
          vr[j] = *(const uint4*)(vpool + at);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < MAX_CH; j++) {
      const int c = threadIdx.x + j * NWARP * 32;
      if (c < nt * chunks) {
        const int p = c / chunks, off = (c % chunks) * V;
        *(uint4*)(ktile + p * ldt + off) = kr[j];
        *(uint4*)(vtile + p * ldt + off) = vr[j];
      }
    }
    __syncthreads();
    // 2b. Scores: TPP adjacent threads per position, each over every TPP-th feature.
    {
      const int p = threadIdx.x / TPP, part = threadIdx.x % TPP;
      float d[MAX_REP];
#pragma unroll
      for (int h = 0; h < MAX_REP; h++) d[h] = 0.f;
      // A branch per head outside, none inside: the inner loop's loads pipeline.
      if (p < nt) {
        const T* kt = ktile + p * ldt;
#pragma unroll
        for (int h = 0; h < MAX_REP; h++) {
          if (h < rep) {
            const float* qh = qs + h * hd;
            float a = 0.f;
#pragma unroll 8
            for (int f = part; f < hd; f += TPP) a += qh[f] * ld(kt[f]);
            d[h] = a;
          }
        }
      }
#pragma unroll
      for (int h = 0; h < MAX_REP; h++) {
        if (h < rep) {
#pragma unroll
          for (int o = 1; o < TPP; o <<= 1) d[h] += __shfl_xor_sync(0xffffffffu, d[h], o);
          if (p < nt && part == 0) sc[h * TILE + p] = d[h] * scale;
        }
      }
    }
    __syncthreads();
    // 2c. The online softmax, a warp per head, a lane per position.
    for (int h = warp; h < rep; h += NWARP) {
      const float s = lane < nt ? sc[h * TILE + lane] : -INFINITY;
      const float mold = ms[h], mnew = fmaxf(mold, warp_max(s));
      const float e = lane < nt ? __expf(s - mnew) : 0.f;
      const float sum = warp_sum(e);
      if (lane < nt) sc[h * TILE + lane] = e;
      if (lane == 0) {
        const float c = __expf(mold - mnew);
        cs[h] = c;
        ls[h] = ls[h] * c + sum;
        ms[h] = mnew;
      }
    }
    __syncthreads();
    // 2d. Values: a thread per feature.
#pragma unroll
    for (int j = 0; j < MF; j++) {
      const int f = threadIdx.x + j * NWARP * 32;
      if (f >= hd) continue;
#pragma unroll
      for (int h = 0; h < MAX_REP; h++) {
        if (h < rep) {
          const float* w = sc + h * TILE;
          float a = acc[h][j] * cs[h];
#pragma unroll 8
          for (int p = 0; p < nt; p++) a += w[p] * ld(vtile[p * ldt + f]);
          acc[h][j] = a;
        }
      }
    }
  }
  // 3. The output, or this split's partial and the merge.
  const int ns = (L + split - 1) / split;
  const size_t head0 = (size_t)r * nh + g * rep;
  if (ns == 1) {
#pragma unroll
    for (int j = 0; j < MF; j++) {
      const int f = threadIdx.x + j * NWARP * 32;
#pragma unroll
      for (int h = 0; h < MAX_REP; h++)
        if (h < rep && f < hd) st(&out[(head0 + h) * hd + f], acc[h][j] / ls[h]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < MF; j++) {
    const int f = threadIdx.x + j * NWARP * 32;
#pragma unroll
    for (int h = 0; h < MAX_REP; h++)
      if (h < rep && f < hd) ws_acc[((head0 + h) * MAX_SPLITS + sp) * hd + f] = acc[h][j];
  }
  if (threadIdx.x < rep) {
    const size_t at = (head0 + threadIdx.x) * MAX_SPLITS + sp;
    ws_ml[2 * at] = ms[threadIdx.x];
    ws_ml[2 * at + 1] = ls[threadIdx.x];
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&done[r * nkv + g], 1u) == (u32)(ns - 1);
  __syncthreads();
  if (!last) return;
  // 4. The merge: each split's weight exp(m_s − max) per head, then every feature.
  float* mw = scratch;
  for (int i = threadIdx.x; i < rep * ns; i += blockDim.x) {
    const size_t at = (head0 + i / ns) * MAX_SPLITS + i % ns;
    mw[i] = __ldcg(&ws_ml[2 * at]);
    mw[rep * ns + i] = __ldcg(&ws_ml[2 * at + 1]);
  }
  __syncthreads();
  for (int h = warp; h < rep; h += NWARP) {
    float mx = -INFINITY;
    for (int s = lane; s < ns; s += 32) mx = fmaxf(mx, mw[h * ns + s]);
    mx = warp_max(mx);
    float den = 0.f;
    for (int s = lane; s < ns; s += 32) {
      const float w = __expf(mw[h * ns + s] - mx);
      mw[h * ns + s] = w;
      den += mw[rep * ns + h * ns + s] * w;
    }
    den = warp_sum(den);
    if (lane == 0) ls[h] = den;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rep * hd; i += blockDim.x) {
    const int h = i / hd;
    const float* a = ws_acc + (head0 + h) * MAX_SPLITS * hd + i % hd;
    float num = 0.f;
#pragma unroll 8
    for (int s = 0; s < ns; s++) num += __ldcg(&a[(size_t)s * hd]) * mw[h * ns + s];
    st(&out[head0 * hd + i], num / ls[h]);
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
  pdl_start();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const size_t at = (size_t)(i / inter) * stride + i % inter;
    const float g = ld(gate[at]);
    st(&out[i], rnd<T>(g / (1.f + __expf(-g))) * ld(up[at]));
  }
}

// f32 logits from T ones. Grid-stride.
template <typename T> __device__ void widen(const T* src, float* dst, int n) {
  pdl_start();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = ld(src[i]);
}

// Per row of f32 logits [rows, vocab]: the max, the lowest id reaching it, and log Σ exp(x − max)
// (engine::readback's greedy reduction). Grid (rows, parts), 256 threads: each block reduces a
// slice of the row to a partial (max, id, Σ exp(x − its max)); the last block of the row (a
// counter in `done`, set back to 0) merges them. NaNs are skipped by the max and make the sum
// NaN, which sends the row to the host whole; −inf logits add nothing.
extern "C" __global__ void greedy_reduce(const float* logits, float* part, u32* done, float* out, int vocab) {
  pdl_start();
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
#define GEMV_WARPS 8 // 256 threads

// This warp's share of Σ_k x[r, k] · w_m[k] for the NW weight rows w_m and the rows r < rows of x
// (`ldx` apart): the 16-byte chunks part, part + parts, … of k, lanes side by side, f32 partial
// sums in acc (k 0: zeros). The first PRE chunks of the weights are loaded before `pdl_wait`, so
// they stream in while the previous kernel finishes. k and ldx multiples of 16 bytes, the host
// checks.
template <typename T, int NW>
__device__ __forceinline__ void dot_chunk(const uint4 (&wraw)[NW], const T* x, int ldx, int rows, int i,
                                          float (&acc)[NW][GEMV_ROWS]) {
  constexpr int V = 16 / sizeof(T);
#pragma unroll
  for (int r = 0; r < GEMV_ROWS; r++) {
    if (r < rows) {
      const uint4 xraw = *(const uint4*)(x + (size_t)r * ldx + i);
      const T* xv = (const T*)&xraw;
#pragma unroll
      for (int j = 0; j < V; j++) {
        const float a = ld(xv[j]);
#pragma unroll
        for (int m = 0; m < NW; m++) acc[m][r] += a * ld(((const T*)&wraw[m])[j]);
      }
    }
  }
}

template <typename T, int NW>
__device__ void dot_part(const T* (&w)[NW], const T* x, int ldx, int rows, int k, int part, int parts,
                         float (&acc)[NW][GEMV_ROWS]) {
  constexpr int V = 16 / sizeof(T), PRE = 4;
  const int first = (part * 32 + (threadIdx.x & 31)) * V, step = parts * 32 * V;
  uint4 pre[PRE][NW];
#pragma unroll
  for (int u = 0; u < PRE; u++) {
    const int i = first + u * step;
#pragma unroll
    for (int m = 0; m < NW; m++)
      if (i < k) pre[u][m] = *(const uint4*)(w[m] + i);
  }
  pdl_wait();
#pragma unroll
  for (int m = 0; m < NW; m++) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) acc[m][r] = 0.f;
  }
#pragma unroll
  for (int u = 0; u < PRE; u++) {
    const int i = first + u * step;
    if (i < k) dot_chunk<T, NW>(pre[u], x, ldx, rows, i, acc);
  }
#pragma unroll 2
  for (int i = first + PRE * step; i < k; i += step) {
    uint4 wraw[NW];
#pragma unroll
    for (int m = 0; m < NW; m++) wraw[m] = *(const uint4*)(w[m] + i);
    dot_chunk<T, NW>(wraw, x, ldx, rows, i, acc);
  }
}

// Sums acc over each warp's lanes, then over the `parts` warps of an output (in warp order,
// through shared memory): true in the thread that holds the sums (lane 0 of the output's first
// warp). Every thread of the block must call it.
template <int NW> __device__ bool sum_parts(float (&acc)[NW][GEMV_ROWS], int rows, int parts) {
  __shared__ float red[GEMV_WARPS][NW][GEMV_ROWS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < NW; m++) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
      if (r < rows) acc[m][r] = warp_sum(acc[m][r]);
  }
  if (parts == 1) return lane == 0;
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < NW; m++) {
#pragma unroll
      for (int r = 0; r < GEMV_ROWS; r++) red[warp][m][r] = acc[m][r];
    }
  }
  __syncthreads();
  if (lane != 0 || warp % parts != 0) return false;
#pragma unroll
  for (int m = 0; m < NW; m++) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) {
      float s = 0.f;
      for (int p = 0; p < parts; p++) s += red[warp + p][m][r];
      acc[m][r] = s;
    }
  }
  return true;
}

// y[r, n] = Σ_k x[r, k] · w[n, k] for rows r < rows (at most GEMV_ROWS): the decode steps'
// matrix products, bound by reading w once. `parts` warps per output n (1, 2, 4 or 8: k split
// between them so that each has few 16-byte loads per lane, all in flight at once), GEMV_WARPS /
// parts outputs per block; f32 accumulation, one rounding to T.
template <typename T>
__device__ void gemv(const T* x, int ldx, const T* w, T* y, int ldy, int rows, int n, int k, int parts) {
  pdl_launch();
  const int warp = threadIdx.x >> 5;
  const int out = blockIdx.x * (GEMV_WARPS / parts) + warp / parts;
  const T* wr[1] = {w + (size_t)min(out, n - 1) * k};
  float acc[1][GEMV_ROWS];
  dot_part<T, 1>(wr, x, ldx, rows, out < n ? k : 0, warp % parts, parts, acc);
  if (sum_parts<1>(acc, rows, parts) && out < n) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
      if (r < rows) st(&y[(size_t)r * ldy + out], acc[0][r]);
  }
}

// act[r, n] = silu(g) · u with g = x[r]·gate[n], u = x[r]·up[n] (each rounded to T, then silu(g)
// and the product, as the generic path's kernels do): the MLP's gate and up products and its
// SiLU·mul in one pass over both weights, laid out as gemv's.
template <typename T>
__device__ void gemv_gate_up(const T* x, int ldx, const T* gate, const T* up, T* act, int rows, int inter, int k,
                             int parts) {
  pdl_launch();
  const int warp = threadIdx.x >> 5;
  const int n = blockIdx.x * (GEMV_WARPS / parts) + warp / parts;
  const size_t at = (size_t)min(n, inter - 1) * k;
  const T* wr[2] = {gate + at, up + at};
  float acc[2][GEMV_ROWS];
  dot_part<T, 2>(wr, x, ldx, rows, n < inter ? k : 0, warp % parts, parts, acc);
  if (sum_parts<2>(acc, rows, parts) && n < inter) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) {
      if (r < rows) {
        const float g = rnd<T>(acc[0][r]), u = rnd<T>(acc[1][r]);
        st(&act[(size_t)r * inter + n], rnd<T>(g / (1.f + __expf(-g))) * u);
      }
    }
  }
}

#define LORA_MAX 4   // adapters per row and module
#define LORA_RANK 64 // rank at most

// One adapter of a module in a set's LoRA table (src/model/cuda_decode.rs writes them): per module
// slot (layer · Proj::ALL.len() + projection), LORA_MAX entries, unused ones of rank 0.
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
  pdl_start();
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
  pdl_start();
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

// The attention kernel NAME: attn_decode<T, HDC, EARLY> (the decode path's is <T, 0, false>;
// benches/cuda/experiments.cuh declares the variants).
#define ATTN_KERNEL(NAME, T, HDC, EARLY)                                                                          \
  extern "C" __global__ void NAME(                                                                                \
      const T* q, const T* k, const T* v, int stride, const T* qb, const T* kb, const T* vb, const T* qn,           \
      const T* kn, const T* cos, const T* sin, const u32* pos, const u32* slot, T* kpool, T* vpool,                \
      const u32* tables, const u32* toff, const u32* lens, float* ws_ml, float* ws_acc, u32* done, T* out, int nh, \
      int nkv, int hd, int bs, int split, float scale, float eps, int interleaved) {                                \
    attn_decode<T, HDC, EARLY>(q, k, v, stride, qb, kb, vb, qn, kn, cos, sin, pos, slot, kpool, vpool, tables,     \
                               toff, lens, ws_ml, ws_acc, done, out, nh, nkv, hd, bs, split, scale, eps,           \
                               interleaved);                                                                       \
  }

#define KERNELS(T, S)                                                                                             \
  extern "C" __global__ void embed_##S(const T* table, const u32* ids, T* out, int h) { embed<T>(table, ids, out, h); } \
  extern "C" __global__ void add_rmsnorm_##S(T* x, const T* add, const T* w, T* out, int n, float eps) {            \
    add_rmsnorm<T>(x, add, w, out, n, eps);                                                                       \
  }                                                                                                               \
  ATTN_KERNEL(attn_decode_##S, T, 0, false)                                                                      \
  extern "C" __global__ void silu_mul_##S(const T* gate, const T* up, int stride, T* out, int inter, int n) {          \
    silu_mul<T>(gate, up, stride, out, inter, n);                                                                     \
  }                                                                                                               \
  extern "C" __global__ void widen_##S(const T* src, float* dst, int n) { widen<T>(src, dst, n); }                 \
  extern "C" __global__ void gemv_##S(const T* x, int ldx, const T* w, T* y, int ldy, int rows, int n, int k,     \
                                      int parts) {                                                                \
    gemv<T>(x, ldx, w, y, ldy, rows, n, k, parts);                                                                \
  }                                                                                                               \
  extern "C" __global__ void gemv_gate_up_##S(const T* x, int ldx, const T* gate, const T* up, T* act, int rows,  \
                                              int inter, int k, int parts) {                                      \
    gemv_gate_up<T>(x, ldx, gate, up, act, rows, inter, k, parts);                                                \
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
// head_dim 128 known at compile time (the loops over features unroll fully: 8.1 µs against 11.8 at
// one row, 75 against 148 at 64 rows of 512 positions on an H200, the same bits;
// benches/cuda/kernels.cu). The decode path takes it for bf16 models of that head_dim.
ATTN_KERNEL(attn_decode_hd128_bf16, bf16, 128, false)

#include "cuda_prefill.cuh"
