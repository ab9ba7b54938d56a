// The CUDA prefill path (src/model/cuda_decode/prefill.rs: prompt chunks in bf16 as cuBLAS
// products and its own kernels, attention flash-style on the tensor cores from the paged pool)
// against the generic candle path, which EXPERT_RUNTIME_CUDA_PREFILL=0 selects for runtimes
// loaded while it is set. Skipped without a usable GPU; scripts/gpu-check.sh runs it there.
//
// Workloads: three sessions whose prompts (304, 256, 208 tokens) are read in one pass and cross
// the kernel's 64-row tiles; then three fresh sessions whose prompts are those prompts followed by
// 150, 110 and 70 more tokens: the prefix cache serves the first part, so their prompt chunks
// start at a position > 0 and attend to keys already in the pool (the same context on both
// paths, whatever either generated before; at least one of them must be served from the
// cache); and the same with two plain LoRAs and the base model
// mixed in one pass (qwen3-tiny's adapters).
// Both runs are bf16, rounding at different points (the attention's probabilities are rounded to
// bf16 before they weigh the values), and these tiny random models have near ties: at the first
// step of each session (the logits of the prompt chunk itself) the generic path's top 5 tokens
// must be within BF16_TOL in the prefill path's distribution; then tokens and logprobs are
// compared up to the first difference.
import { describe, it, after } from 'node:test'
import assert from 'node:assert/strict'
import path from 'node:path'
import { collect, fixture } from './helpers.mjs'
import { BF16_TOL, compareFirstSteps, compareRuns, probeCuda, withEnv } from './cuda-parity.mjs'

const MODELS = ['qwen3-tiny', 'qwen3-untied-mqa', 'qwen2-tiny', 'llama-tiny']
const probe = await probeCuda()
after(() => probe.rt?.dispose())

const prompt = (s, n) => Array.from({ length: n }, (_, i) => (i * 7919 + s * 31) % 300 + 3)

/** Three concurrent sessions, then three that continue their prompts through the prefix cache;
 *  per session, its chunks. */
async function twoTurns(rt, experts = () => []) {
  const first = (i) => prompt(10 + i, 304 - 48 * i)
  const run = (tokens, i) => collect(rt.createSession().generate({ tokens }, { maxTokens: 24, temperature: 0, topLogprobs: 20, experts: experts(i) }))
  const a = await Promise.all([0, 1, 2].map((i) => run(first(i), i)))
  const b = await Promise.all([0, 1, 2].map((i) => run([...first(i), ...prompt(20 + i, 150 - 40 * i)], i)))
  // A fresh session admitted right as another ends may miss that one's blocks (seen once on an
  // H200); its prompt then starts at 0, the same context on both paths all the same. The
  // continuation case needs one session served from the cache.
  const cached = await Promise.all(b.map(async (r) => (await r.result).usage.cachedTokens))
  cached.forEach((c, i) => assert.ok(c === 0 || c === first(i).length, `session ${i}: ${c} positions from the cache`))
  assert.ok(cached.some((c) => c > 0), 'no session was served from the cache')
  return [...a, ...b].map((r) => r.chunks)
}

function check(label, fast, generic) {
  const first = compareFirstSteps(label, fast, generic)
  assert.ok(first <= BF16_TOL, `${label}: first steps, max |Δlogprob| ${first}`)
  const worst = compareRuns(label, fast, generic, { exact: false, tol: BF16_TOL, firstMayDiffer: true })
  console.error(`${label} bf16: CUDA prefill path vs generic, first steps' top 5 max |Δlogprob| ${first.toExponential(2)}, ` +
    `along the same tokens ${worst.toExponential(2)}`)
}

describe('CUDA prefill path', { skip: !probe.rt && `no usable GPU (${probe.error?.message.slice(0, 160)})` }, () => {
  for (const name of MODELS) {
    it(`${name} bf16: prompt chunks give the generic path's tokens and logprobs (within ${BF16_TOL})`, async () => {
      const run = (env) => withEnv(env, name, { device: 'cuda', dtype: 'bf16' }, (rt) => twoTurns(rt))
      check(name, await run({}), await run({ EXPERT_RUNTIME_CUDA_PREFILL: '0' }))
    })
  }

  it(`qwen3-tiny bf16 with two LoRAs and the base mixed in one pass: the generic path's tokens and logprobs (within ${BF16_TOL})`, async () => {
    const experts = (i) => [[], ['lora'], ['lora2']][i]
    const run = (env) => withEnv(env, 'qwen3-tiny', { device: 'cuda', dtype: 'bf16' }, async (rt) => {
      for (const name of ['lora', 'lora2']) await rt.loadExpert(path.join(fixture('adapters'), name), { name })
      return twoTurns(rt, experts)
    })
    check('qwen3-tiny + LoRAs', await run({}), await run({ EXPERT_RUNTIME_CUDA_PREFILL: '0' }))
  })
})
