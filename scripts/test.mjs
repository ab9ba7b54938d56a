// `npm test`: Rust unit and parity tests, then the build, then the Node suites.
import { ensureSmolLM2 } from './assets.mjs'
import { ensureBuilt, ensureInstalled, run, rustHost } from './setup.mjs'

ensureInstalled()
// Rust tests build the engine without the napi layer (its symbols exist only inside Node).
// `napi build` passes an explicit --target; passing the same one here lets both builds share
// the compiled dependencies (candle, tokenizers) instead of building them twice.
const host = rustHost()
// The SmolLM2 GGUF is needed by a Rust parity test as well as by the Node suites.
process.env.EXPERT_RUNTIME_SMOLLM2 ||= ensureSmolLM2()
run('cargo', ['test', '--release', '--no-default-features', '--target', host])
ensureBuilt()
run(process.execPath, ['--test', '--test-concurrency=1', '__test__/'])
// Again through the device-generic code path that CUDA runs (src/backend.rs), on the CPU,
// against the same HF references: keeps the GPU path correct on machines without a GPU.
run(process.execPath, ['--test', '--test-concurrency=1', '__test__/generate.test.mjs', '__test__/gemma3.test.mjs', '__test__/gemma4.test.mjs', '__test__/granite.test.mjs', '__test__/smollm3.test.mjs', '__test__/phi3.test.mjs', '__test__/qwen3moe.test.mjs', '__test__/mistral.test.mjs', '__test__/experts.test.mjs', '__test__/batching.test.mjs', '__test__/quantize.test.mjs'],
  { env: { ...process.env, EXPERT_RUNTIME_GENERIC_KERNELS: '1' } })
// Again on the portable kernels (no AVX2/FMA), against the same HF references: the Rust kernel
// tests cover each SIMD path at the kernel level, this covers the portable path end to end.
run(process.execPath, ['--test', '--test-concurrency=1', '__test__/generate.test.mjs', '__test__/quantize.test.mjs'],
  { env: { ...process.env, EXPERT_RUNTIME_SIMD: 'portable' } })
// The Python binding over the same engine: the same HF/PEFT fixtures, streaming, cancel,
// threads and asyncio (python/tests, pytest).
run(process.execPath, ['scripts/python.mjs', 'test'])
