// Device time of the decode kernels (src/model/cuda_decode.cu) alone, on the Qwen3-0.6B shape in
// bf16, each replayed as a CUDA graph of 20 launches: the figures behind the decode path's
// choices (attention splits, GEMV warps per output). Built and run on a GPU machine by
// scripts/gpu-check.sh --kernels: nvcc -O3 -arch=sm_90 benches/cuda/kernels.cu.
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>
#include <cuda_runtime.h>
#include "../../src/model/cuda_decode.cu"
#include "experiments.cuh"
#include "harness.cuh"

int main() {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const int h = 1024, nh = 16, nkv = 8, hd = 128, inter = 3072, vocab = 151936, bs = 16;
  const int wide = (nh + 2 * nkv) * hd, maxpos = 8192, rows_max = 64;
  const float eps = 1e-6f, scale = 1.f / sqrtf((float)hd);
  bf16* x = dalloc((size_t)rows_max * inter * 2);
  bf16* y = dalloc((size_t)rows_max * vocab * 2, false);
  bf16* w = dalloc((size_t)vocab * h * 2);
  bf16* w2 = dalloc((size_t)inter * h * 2);
  bf16* qkv = dalloc((size_t)rows_max * wide * 2);
  bf16* norm = dalloc(h * 2); // hidden-size norms and head_dim ones (h ≥ hd)
  bf16* cosv = dalloc((size_t)maxpos * hd);
  bf16* sinv = dalloc((size_t)maxpos * hd);
  const size_t slots = (size_t)rows_max * maxpos;
  bf16* kp = dalloc(slots * nkv * hd * 2);
  bf16* vp = dalloc(slots * nkv * hd * 2);
  bf16* out = dalloc((size_t)rows_max * nh * hd * 2, false);
  float *ws_ml, *ws_acc;
  u32* done;
  CK(cudaMalloc(&ws_ml, (size_t)rows_max * nh * MAX_SPLITS * 2 * 4));
  CK(cudaMalloc(&ws_acc, (size_t)rows_max * nh * MAX_SPLITS * hd * 4));
  CK(cudaMalloc(&done, rows_max * nkv * 4));
  CK(cudaMemset(done, 0, rows_max * nkv * 4));
  // The decode path's uploaded row inputs for `rows` rows at context L: ids, pos, slot, lens,
  // toff (rows_max each), then each row's block table (identity blocks, row-major). Freed by the
  // caller.
  const int nb = maxpos / bs, tile_bytes = 2 * ATILE(bf16) * (hd + 8) * 2;
  auto row_inputs = [&](int rows, int L) {
    std::vector<u32> in(5 * rows_max + rows_max * nb);
    for (int r = 0; r < rows; r++) {
      in[rows_max + r] = L - 1;
      in[2 * rows_max + r] = r * maxpos + L - 1;
      in[3 * rows_max + r] = L;
      in[4 * rows_max + r] = r * nb;
      for (int b = 0; b < nb; b++) in[5 * rows_max + r * nb + b] = r * nb + b;
    }
    u32* din;
    CK(cudaMalloc(&din, in.size() * 4));
    CK(cudaMemcpy(din, in.data(), in.size() * 4, cudaMemcpyHostToDevice));
    return din;
  };
  using AttnKernel = decltype(&attn_decode_bf16);
  // An attention kernel over `qkv` and the pool, for the row inputs `din`, into `o`.
  auto attention = [&](bool pdl, AttnKernel kernel, int rows, int split, int splits, const u32* din, bf16* o) {
    launch(pdl, kernel, dim3(rows, nkv, splits), NWARP * 32, tile_bytes, s, (const bf16*)qkv,
           (const bf16*)qkv + nh * hd, (const bf16*)qkv + (nh + nkv) * hd, wide, (const bf16*)nullptr,
           (const bf16*)nullptr, (const bf16*)nullptr, (const bf16*)norm, (const bf16*)norm, (const bf16*)cosv,
           (const bf16*)sinv, din + rows_max, din + 2 * rows_max, kp, vp, din + 5 * rows_max, din + 4 * rows_max,
           din + 3 * rows_max, ws_ml, ws_acc, done, o, nh, nkv, hd, bs, split, scale, eps, 0);
  };

  printf("| product (n × k) | rows | parts 1 | parts 2 | parts 4 | parts 8 | µs at 4.3 TB/s |\n|---|---:|---:|---:|---:|---:|---:|\n");
  const int shapes[][2] = {{wide, h}, {h, nh * hd}, {h, inter}, {vocab, h}};
  for (auto& sh : shapes) {
    for (int rows : {1, 4}) {
      printf("| %d × %d | %d |", sh[0], sh[1], rows);
      for (int parts = 1; parts <= 8; parts *= 2) {
        const int blocks = (sh[0] + 8 / parts - 1) / (8 / parts);
        printf(" %.2f |", time_us(s, [&] { gemv_bf16<<<blocks, 256, 0, s>>>(x, sh[1], w, y, sh[0], rows, sh[0], sh[1], parts); }));
      }
      printf(" %.2f |\n", (double)sh[0] * sh[1] * 2 / 4.3e6);
    }
  }
  for (int rows : {1, 4}) {
    printf("| gate·up %d × %d | %d |", inter, h, rows);
    for (int parts = 1; parts <= 8; parts *= 2) {
      const int blocks = (inter + 8 / parts - 1) / (8 / parts);
      printf(" %.2f |", time_us(s, [&] { gemv_gate_up_bf16<<<blocks, 256, 0, s>>>(x, h, w, w2, y, rows, inter, h, parts); }));
    }
    printf(" %.2f |\n", 2.0 * inter * h * 2 / 4.3e6);
  }
  printf("\nadd_rmsnorm (1 row, 1024 threads): %.2f µs\n",
         time_us(s, [&] { add_rmsnorm_bf16<<<1, 1024, 0, s>>>(x, y, norm, qkv, h, eps); }));

  // The o and down projections followed by the norm: two kernels as the decode path launches
  // them, or gemv_add_rmsnorm (experiments.cuh), which must give the same bits.
  {
    printf("\n| product + add + RMSNorm (n × k) | rows | same bits | two kernels (µs) | gemv_add_rmsnorm (µs) |\n"
           "|---|---:|---|---:|---:|\n");
    u32* fdone;
    CK(cudaMalloc(&fdone, 4));
    CK(cudaMemset(fdone, 0, 4));
    const size_t cells = (size_t)GEMV_ROWS * h;
    bf16 *res0 = dalloc(cells * 2), *res[2], *hn[2], *d[2];
    for (int v = 0; v < 2; v++) {
      res[v] = dalloc(cells * 2, false);
      hn[v] = dalloc(cells * 2, false);
      d[v] = dalloc(cells * 2, false);
    }
    for (int k : {nh * hd, inter}) {
      for (int rows : {1, 4}) {
        const int parts = 4, blocks = h / (8 / parts);
        auto two = [&](int v) {
          launch(true, gemv_bf16, blocks, 256, 0, s, x, k, w, d[v], h, rows, h, k, parts);
          launch(true, add_rmsnorm_bf16, rows, 1024, 0, s, res[v], (const bf16*)d[v], (const bf16*)norm, hn[v], h, eps);
        };
        auto fused = [&](int v) {
          launch(true, gemv_add_rmsnorm_bf16, blocks, 256, 0, s, (const bf16*)x, k, (const bf16*)w, d[v], h, rows, h, k,
                 parts, res[v], (const bf16*)norm, hn[v], eps, 1024, fdone);
        };
        for (int v = 0; v < 2; v++) CK(cudaMemcpy(res[v], res0, cells * 2, cudaMemcpyDeviceToDevice));
        two(0);
        fused(1);
        CK(cudaDeviceSynchronize());
        bool same = true;
        for (bf16** b : {d, res, hn}) {
          std::vector<bf16> a(cells), c(cells);
          CK(cudaMemcpy(a.data(), b[0], cells * 2, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(c.data(), b[1], cells * 2, cudaMemcpyDeviceToHost));
          same = same && memcmp(a.data(), c.data(), (size_t)rows * h * 2) == 0;
        }
        printf("| %d × %d | %d | %s | %.2f | %.2f |\n", h, k, rows, same ? "yes" : "**no**",
               time_us(s, [&] { two(0); }), time_us(s, [&] { fused(1); }));
      }
    }
  }

  printf("\n| attention: rows | context | split | splits | µs |\n|---:|---:|---:|---:|---:|\n");
  for (int rows : {1, 8, 64}) {
    for (int L : {64, 128, 512, 2048, 8192}) {
      u32* din = row_inputs(rows, L);
      for (int split : {32, 64, 128}) {
        int bucket = 1;
        while (bucket < L) bucket *= 2;
        const int splits = (bucket + split - 1) / split;
        if (splits > MAX_SPLITS || (splits < 2 && split > 32)) continue;
        const float us = time_us(s, [&] { attention(false, attn_decode_bf16, rows, split, splits, din, out); });
        printf("| %d | %d | %d | %d | %.2f |\n", rows, L, split, splits, us);
      }
      CK(cudaFree(din));
    }
  }
  // attn_decode's variants (experiments.cuh) against the decode path's kernel: the same bits,
  // and µs, at the split the decode path picks (cuda_decode.rs: about 256 blocks, 32 to 128
  // positions each, at most MAX_SPLITS splits).
  {
    printf("\n| attention variant: rows | context | same bits | as shipped | head_dim 128 | first tile early | both |\n"
           "|---:|---:|---|---:|---:|---:|---:|\n");
    AttnKernel kernels[] = {attn_decode_bf16, attn_decode_hd128_bf16, attn_decode_early_bf16,
                            attn_decode_hd128_early_bf16};
    const size_t cells = (size_t)rows_max * nh * hd;
    bf16* outs = dalloc(4 * cells * 2, false);
    for (int rows : {1, 8, 64}) {
      for (int L : {128, 512, 2048}) {
        u32* din = row_inputs(rows, L);
        int bucket = 32;
        while (bucket < L) bucket *= 2;
        const int want = (256 + rows * nkv - 1) / (rows * nkv);
        int split = std::min(std::max(bucket / want, 32), 128);
        split = std::max(split, bucket / MAX_SPLITS);
        const int splits = (bucket + split - 1) / split;
        auto run = [&](int kv) { attention(true, kernels[kv], rows, split, splits, din, outs + kv * cells); };
        std::vector<bf16> ref(cells), got(cells);
        bool same = true;
        for (int kv = 0; kv < 4; kv++) run(kv);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ref.data(), outs, cells * 2, cudaMemcpyDeviceToHost));
        for (int kv = 1; kv < 4; kv++) {
          CK(cudaMemcpy(got.data(), outs + kv * cells, cells * 2, cudaMemcpyDeviceToHost));
          same = same && memcmp(ref.data(), got.data(), (size_t)rows * nh * hd * 2) == 0;
        }
        printf("| %d | %d | %s |", rows, L, same ? "yes" : "**no**");
        for (int kv = 0; kv < 4; kv++) printf(" %.2f |", time_us(s, [&] { run(kv); }));
        printf("\n");
        CK(cudaFree(din));
      }
    }
  }
  // A whole batch-1 decode pass of the 28-layer model (its own weights per layer, context 128),
  // as the decode path issues it, without and with programmatic dependent launch; then with the
  // norms after the o and down projections in those products' kernels (gemv_add_rmsnorm), after
  // checking that such a pass gives the same logits.
  {
    const int layers = 28, L = 128;
    const size_t per_layer = (size_t)wide * h + (size_t)h * nh * hd + 2 * (size_t)inter * h + (size_t)h * inter;
    bf16* wl = dalloc(per_layer * layers * 2);
    u32 *din = row_inputs(1, L), *fdone;
    CK(cudaMalloc(&fdone, 4));
    CK(cudaMemset(fdone, 0, 4));
    bf16 *xs = dalloc(h * 2), *hn = dalloc(h * 2), *delta = dalloc(h * 2), *act = dalloc(inter * 2);
    bf16 *xs0 = dalloc(h * 2), *delta0 = dalloc(h * 2);
    bf16* attn = dalloc(nh * hd * 2);
    const int split = 32, splits = 4;
    auto pass = [&](bool pdl, bool fused, AttnKernel attn_kernel) {
      for (int l = 0; l < layers; l++) {
        bf16* wq = wl + per_layer * l;
        bf16* wo = wq + (size_t)wide * h;
        bf16* wg = wo + (size_t)h * nh * hd;
        bf16* wu = wg + (size_t)inter * h;
        bf16* wd = wu + (size_t)inter * h;
        if (!fused || l == 0) launch(pdl, add_rmsnorm_bf16, 1, 1024, 0, s, xs, delta, norm, hn, h, eps);
        launch(pdl, gemv_bf16, wide / 8, 256, 0, s, hn, h, wq, qkv, wide, 1, wide, h, 1);
        attention(pdl, attn_kernel, 1, split, splits, din, attn);
        if (fused) {
          launch(pdl, gemv_add_rmsnorm_bf16, h / 2, 256, 0, s, (const bf16*)attn, nh * hd, (const bf16*)wo, delta, h, 1,
                 h, nh * hd, 4, xs, (const bf16*)norm, hn, eps, 1024, fdone);
        } else {
          launch(pdl, gemv_bf16, h / 2, 256, 0, s, attn, nh * hd, wo, delta, h, 1, h, nh * hd, 4);
          launch(pdl, add_rmsnorm_bf16, 1, 1024, 0, s, xs, delta, norm, hn, h, eps);
        }
        launch(pdl, gemv_gate_up_bf16, inter / 8, 256, 0, s, hn, h, wg, wu, act, 1, inter, h, 1);
        if (fused) {
          launch(pdl, gemv_add_rmsnorm_bf16, h / 2, 256, 0, s, (const bf16*)act, inter, (const bf16*)wd, delta, h, 1, h,
                 inter, 4, xs, (const bf16*)norm, hn, eps, 1024, fdone);
        } else {
          launch(pdl, gemv_bf16, h / 2, 256, 0, s, act, inter, wd, delta, h, 1, h, inter, 4);
        }
      }
      if (!fused) launch(pdl, add_rmsnorm_bf16, 1, 1024, 0, s, xs, delta, norm, hn, h, eps);
      launch(pdl, gemv_bf16, vocab / 8, 256, 0, s, hn, h, w, y, vocab, 1, vocab, h, 1);
    };
    // The variants: PDL, fused norms, the attention with head_dim fixed and its first tile early.
    struct Variant {
      const char* name;
      bool pdl, fused;
      AttnKernel attn;
    };
    const Variant variants[] = {
        {"plain graph", false, false, attn_decode_bf16},
        {"with programmatic dependent launch (as shipped)", true, false, attn_decode_bf16},
        {"same, norms in the o and down products", true, true, attn_decode_bf16},
        {"same, and attention with head_dim 128, first tile early", true, true, attn_decode_hd128_early_bf16},
    };
    // One pass of each from the same residual stream: the same logits, bit for bit, as the first.
    CK(cudaMemcpy(xs0, xs, h * 2, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(delta0, delta, h * 2, cudaMemcpyDeviceToDevice));
    std::vector<bf16> first(vocab), logits(vocab);
    printf("\n| batch-1 pass, 28 layers, context %d | same logits | µs | tok/s |\n|---|---|---:|---:|\n", L);
    for (int i = 0; i < 4; i++) {
      const Variant& v = variants[i];
      CK(cudaMemcpy(xs, xs0, h * 2, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(delta, delta0, h * 2, cudaMemcpyDeviceToDevice));
      pass(v.pdl, v.fused, v.attn);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy((i ? logits : first).data(), y, (size_t)vocab * 2, cudaMemcpyDeviceToHost));
      const bool same = i == 0 || memcmp(first.data(), logits.data(), (size_t)vocab * 2) == 0;
      const float us = time_us(s, [&] { pass(v.pdl, v.fused, v.attn); });
      printf("| %s | %s | %.1f | %.0f |\n", v.name, same ? "yes" : "**no**", us, 1e6 / us);
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
