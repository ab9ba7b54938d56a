// The helpers of the GPU harnesses (kernels.cu, prefill.cu): error checks, random device
// buffers, launches with or without programmatic dependent launch, and timing as graph replays.
// Included after src/model/cuda_decode.cu (it uses its bf16 type and `st`).
#pragma once

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e = (x);                                                                   \
    if (e != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));           \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

__global__ void fill(bf16* p, size_t n, u32 seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    u32 v = (u32)i * 2654435761u ^ seed;
    v ^= v >> 15;
    v *= 2246822519u;
    v ^= v >> 13;
    st(&p[i], seed ? (v & 0xffff) / 65536.f - 0.5f : 0.f); // about [-0.5, 0.5), or zeros
  }
}

static bf16* dalloc(size_t bytes, bool random = true) {
  bf16* p;
  CK(cudaMalloc(&p, bytes));
  fill<<<1024, 256>>>(p, bytes / 2, random ? 0x9e3779b9u + (u32)bytes : 0u);
  CK(cudaDeviceSynchronize());
  return p;
}

// Launches kernel `k`, with the programmatic-dependent-launch attribute when `pdl`.
template <typename... P, typename... A>
static void launch(bool pdl, void (*k)(P...), dim3 grid, int block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...));
}

// Microseconds per launch of `launch`, replayed as a graph of 20 launches.
template <typename F> static float time_us(cudaStream_t s, F launch) {
  launch();
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; i++) launch();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(ge, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return ms * 1000.f / 400.f;
}

