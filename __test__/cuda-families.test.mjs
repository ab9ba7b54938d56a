// Every model family on the GPU against HF transformers, through whichever path runs it there
// (the fused decode and prefill paths where the plan fits them, the generic candle path
// elsewhere): f32 greedy tokens identical to the CPU path and to HF with logprobs within 1e-4,
// and bf16 teacher-forced within BF16_TOL of HF's bf16 run (cuda-parity.mjs). Skipped without a
// usable GPU; scripts/gpu-check.sh runs it there.
import { describe, it, after } from 'node:test'
import { BF16_TOL, bf16Parity, f32Parity, probeCuda } from './cuda-parity.mjs'

const FAMILIES = [
  'gemma3-tiny', 'gemma4-tiny', 'gemma4-moe-tiny', 'granite-tiny', 'mistral-tiny', 'ministral-tiny', 'phi3-tiny',
  'phi4-mini-tiny', 'smollm3-tiny', 'qwen3moe-tiny', 'qwen3moe-mixed-tiny', 'qwen35-tiny', 'lfm2-tiny',
]
const probe = await probeCuda()
after(() => probe.rt?.dispose())

describe('model families on CUDA', { skip: !probe.rt && `no usable GPU (${probe.error?.message.slice(0, 160)})` }, () => {
  for (const name of FAMILIES) {
    it(`${name}: f32 greedy tokens identical to the CPU path and to HF, logprobs within 1e-4`, () => f32Parity(name))
    it(`${name}: bf16 within ${BF16_TOL} of HF's bf16 run (teacher-forced top-5)`, () => bf16Parity(name))
  }
})
