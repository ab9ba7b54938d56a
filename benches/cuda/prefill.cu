// The prefill attention kernel (attn_prefill_bf16_h*, src/model/cuda_prefill.cuh) against a plain
// reference in f32 on fresh random data, then its device time on the Qwen3-0.6B shape. Built and
// run on a GPU machine by scripts/gpu-check.sh --kernels: nvcc -O3 -arch=sm_90 benches/cuda/prefill.cu.
//
// Checks: chunks from position 0 and continuing earlier context, partial tiles, several chunks in
// one pass, decode-like chunks of one row, GQA, sliding windows, head_dim 16 to 128, keys and
// values read through shuffled block tables. The output is poisoned (NaN) before each run, so an
// element left unwritten fails the check. Exit status 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <random>
#include <utility>
#include <vector>
#include <cuda_runtime.h>
#include "../../src/model/cuda_decode.cu"
#include "harness.cuh"

// out[r, h, :] = softmax(q·kᵀ · scale) v over the positions row r sees, in f32 from the bf16
// inputs. Grid (rows, nh), 128 threads, (longest context + 1) floats of dynamic shared memory.
__global__ void attn_ref(const bf16* q, int stride, const bf16* kp, const bf16* vp, const u32* rpos, const u32* rtoff,
                         const u32* tables, int nh, int nkv, int hd, int bs, int window, float scale, float* out) {
  extern __shared__ float sc[];
  const int r = blockIdx.x, h = blockIdx.y, g = h / (nh / nkv), P = (int)rpos[r];
  const int lo = window > 0 ? max(0, P - window + 1) : 0;
  const u32* table = tables + rtoff[r];
  const bf16* qr = q + (size_t)r * stride + h * hd;
  for (int key = lo + threadIdx.x; key <= P; key += blockDim.x) {
    const size_t at = ((size_t)table[key / bs] * bs + key % bs) * nkv * hd + g * hd;
    float d = 0.f;
    for (int f = 0; f < hd; f++) d += ld(qr[f]) * ld(kp[at + f]);
    sc[key - lo] = d * scale;
  }
  __syncthreads();
  __shared__ float mx, sum;
  if (threadIdx.x == 0) {
    float m = -INFINITY, s = 0.f;
    for (int i = 0; i <= P - lo; i++) m = fmaxf(m, sc[i]);
    for (int i = 0; i <= P - lo; i++) s += expf(sc[i] - m);
    mx = m;
    sum = s;
  }
  __syncthreads();
  for (int f = threadIdx.x; f < hd; f += blockDim.x) {
    float a = 0.f;
    for (int key = lo; key <= P; key++) {
      const size_t at = ((size_t)table[key / bs] * bs + key % bs) * nkv * hd + g * hd;
      a += expf(sc[key - lo] - mx) * ld(vp[at + f]);
    }
    out[((size_t)r * nh + h) * hd + f] = a / sum;
  }
}

struct Chunk {
  int pos, n;
};

using PrefillKernel = decltype(&attn_prefill_bf16_h128_k1);

// The kernel for head_dim `hd` whose blocks split their keys between `ks` warps per row group.
static PrefillKernel prefill_kernel(int hd, int ks) {
  switch (hd * 10 + ks) {
    case 1281: return attn_prefill_bf16_h128_k1;
    case 1282: return attn_prefill_bf16_h128_k2;
    case 641: return attn_prefill_bf16_h64_k1;
    case 642: return attn_prefill_bf16_h64_k2;
    case 321: return attn_prefill_bf16_h32_k1;
    case 322: return attn_prefill_bf16_h32_k2;
    case 161: return attn_prefill_bf16_h16_k1;
    default: return attn_prefill_bf16_h16_k2;
  }
}

// A pass over `chunks` (each its own sequence with a shuffled block table) against the reference.
static bool check(int hd, int ks, int window, const std::vector<Chunk>& chunks, u32 seed) {
  const int nh = 16, nkv = 8, bs = 16, wide = (nh + 2 * nkv) * hd, nblk_seq = 8192 / bs;
  const float scale = 1.f / sqrtf((float)hd);
  int rows = 0, longest = 0;
  for (auto& c : chunks) {
    rows += c.n;
    longest = std::max(longest, c.pos + c.n);
  }
  const int seqs = (int)chunks.size(), blocks = seqs * nblk_seq;
  std::mt19937 rng(seed);
  std::vector<u32> perm(blocks);
  for (int i = 0; i < blocks; i++) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  // Tiles, row positions and table offsets, as src/model/cuda_decode/prefill.rs uploads them.
  std::vector<u32> tiles, rpos, rtoff;
  int row = 0;
  for (int c = 0; c < seqs; c++) {
    for (int first = 0; first < chunks[c].n; first += PTILE)
      tiles.insert(tiles.end(), {(u32)(row + first), (u32)std::min(PTILE, chunks[c].n - first), (u32)(chunks[c].pos + first),
                                 (u32)(c * nblk_seq)});
    for (int i = 0; i < chunks[c].n; i++) {
      rpos.push_back(chunks[c].pos + i);
      rtoff.push_back(c * nblk_seq);
    }
    row += chunks[c].n;
  }
  const int ntiles = (int)tiles.size() / 4;
  auto up = [](const std::vector<u32>& v) {
    u32* d;
    CK(cudaMalloc(&d, v.size() * 4));
    CK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  u32 *dt = up(tiles), *dp = up(rpos), *dto = up(rtoff), *dtab = up(perm);
  bf16* q = dalloc((size_t)rows * wide * 2 + seed * 2);
  bf16* kp = dalloc((size_t)blocks * bs * nkv * hd * 2 + seed * 4);
  bf16* vp = dalloc((size_t)blocks * bs * nkv * hd * 2 + seed * 6);
  bf16* out;
  float* ref;
  const size_t nout = (size_t)rows * nh * hd;
  CK(cudaMalloc(&out, nout * 2));
  CK(cudaMalloc(&ref, nout * 4));
  CK(cudaMemset(out, 0xff, nout * 2)); // NaN: an unwritten element fails
  prefill_kernel(hd, ks)<<<dim3(ntiles, nh), ks * 4 * 32>>>(q, wide, kp, vp, dt, dtab, nh, nkv, bs, window, scale, out);
  CK(cudaGetLastError());
  attn_ref<<<dim3(rows, nh), 128, (longest + 1) * 4>>>(q, wide, kp, vp, dp, dto, dtab, nh, nkv, hd, bs, window, scale, ref);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned short> o(nout);
  std::vector<float> rf(nout);
  CK(cudaMemcpy(o.data(), out, nout * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rf.data(), ref, nout * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  size_t bad = 0;
  for (size_t i = 0; i < nout; i++) {
    u32 bits = (u32)o[i] << 16;
    float v;
    memcpy(&v, &bits, 4);
    if (!std::isfinite(v)) bad++;
    num += (double)(v - rf[i]) * (v - rf[i]);
    den += (double)rf[i] * rf[i];
  }
  const double rel = sqrt(num / den);
  const bool ok = bad == 0 && rel < 1e-2;
  printf("| %d | %d | %d | %s | %d | %.2e | %zu | %s |\n", hd, ks, window, [&] {
    static char buf[128];
    buf[0] = 0;
    for (auto& c : chunks) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%d+%d ", c.pos, c.n);
    return buf;
  }(), rows, rel, bad, ok ? "ok" : "**FAIL**");
  for (void* p : {(void*)dt, (void*)dp, (void*)dto, (void*)dtab, (void*)q, (void*)kp, (void*)vp, (void*)out, (void*)ref})
    CK(cudaFree(p));
  return ok;
}

int main() {
  bool ok = true;
  printf("| head_dim | key split | window | chunks (pos+rows) | rows | ‖out − ref‖ / ‖ref‖ | non-finite | |\n"
         "|---:|---:|---:|---|---:|---:|---:|---|\n");
  u32 seed = 1;
  for (int hd : {128, 64, 32, 16}) {
    for (int ks : {1, 2}) {
      ok &= check(hd, ks, 0, {{0, 512}}, seed++);
      ok &= check(hd, ks, 0, {{0, 100}, {300, 200}, {37, 1}, {1000, 65}}, seed++);
      ok &= check(hd, ks, 0, {{2000, 48}, {0, 1}}, seed++);
      ok &= check(hd, ks, 64, {{0, 300}, {300, 200}}, seed++);
      ok &= check(hd, ks, 1000, {{1500, 130}}, seed++);
      ok &= check(hd, ks, 40, {{0, 33}, {90, 7}}, seed++);
    }
  }
  // Device time on the Qwen3-0.6B shape (16 query heads, 8 KV heads, head_dim 128), one chunk
  // from position 0, identity block tables.
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const int nh = 16, nkv = 8, hd = 128, bs = 16, wide = (nh + 2 * nkv) * hd, maxn = 8192;
  bf16* q = dalloc((size_t)maxn * wide * 2);
  bf16* kp = dalloc((size_t)maxn * nkv * hd * 2);
  bf16* vp = dalloc((size_t)maxn * nkv * hd * 2);
  bf16* out = dalloc((size_t)maxn * nh * hd * 2, false);
  std::vector<u32> tab(maxn / bs);
  for (int i = 0; i < maxn / bs; i++) tab[i] = i;
  u32* dtab;
  CK(cudaMalloc(&dtab, tab.size() * 4));
  CK(cudaMemcpy(dtab, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
  printf("\n| prompt rows | key split | attn_prefill (µs) | TFLOP/s (causal) | ×28 layers (ms) |\n|---:|---:|---:|---:|---:|\n");
  for (int n : {512, 1024, 2048, 8192})
  for (int ks : {1, 2}) {
    std::vector<u32> tiles;
    for (int first = 0; first < n; first += PTILE) tiles.insert(tiles.end(), {(u32)first, (u32)std::min(PTILE, n - first), (u32)first, 0u});
    u32* dt;
    CK(cudaMalloc(&dt, tiles.size() * 4));
    CK(cudaMemcpy(dt, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
    const int ntiles = (int)tiles.size() / 4;
    const float us = time_us(s, [&] {
      launch(true, prefill_kernel(hd, ks), dim3(ntiles, nh), ks * 4 * 32, 0, s, (const bf16*)q, wide, (const bf16*)kp,
             (const bf16*)vp, (const u32*)dt, (const u32*)dtab, nh, nkv, bs, 0, 1.f / sqrtf((float)hd), out);
    });
    const double flop = 4.0 * hd * nh * (double)n * (n + 1) / 2;
    printf("| %d | %d | %.1f | %.1f | %.2f |\n", n, ks, us, flop / us / 1e6, us * 28 / 1000);
    CK(cudaFree(dt));
  }
  printf("\nprefill attention check: %s\n", ok ? "all ok" : "FAILED");
  return ok ? 0 : 1;
}
