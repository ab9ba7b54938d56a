// Helpers of the CUDA suites (cuda.test.mjs, cuda-families.test.mjs, cuda-prefill.test.mjs): the
// probe for a usable GPU, the HF-parity checks of a fixture model on it, and runs of one workload
// with environment switches set while a runtime loads. Holds no tests.
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { collect, fixture, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

/** Why 0.3 for bf16: see cuda.test.mjs. */
export const BF16_TOL = 0.3

/** A runtime on the GPU, or the NO_CUDA_DEVICE error that says why there is none. */
export async function probeCuda() {
  try {
    return { rt: await Runtime.load(fixture('qwen3-tiny'), { device: 'cuda', dtype: 'f32' }) }
  } catch (e) {
    if (e.code !== 'NO_CUDA_DEVICE') throw e
    return { error: e }
  }
}

/** f32 on the GPU: greedy tokens identical to the CPU path and to HF, logprobs within 1e-4. */
export async function f32Parity(name) {
  const ref = reference(name)
  const n = ref.f32.steps.length
  const run = async (device) => {
    const rt = await Runtime.load(fixture(name), { device, dtype: 'f32' })
    try {
      assert.equal(rt.info.device, device)
      return (await collect(rt.createSession().generate({ tokens: ref.prompt_ids }, { maxTokens: n, temperature: 0 }))).chunks
    } finally {
      await rt.dispose()
    }
  }
  const [cuda, cpu] = [await run('cuda'), await run('cpu')]
  assert.deepEqual(cuda.map((c) => c.tokenId), cpu.map((c) => c.tokenId), 'CUDA vs CPU')
  assert.deepEqual(cuda.map((c) => c.tokenId), ref.f32.steps.map((s) => s.token), 'CUDA vs HF')
  cuda.forEach((c, i) => assert.ok(Math.abs(c.logprob - ref.f32.steps[i].logprob) <= 1e-4, `step ${i}: ${c.logprob} vs ${ref.f32.steps[i].logprob}`))
}

/** bf16 on the GPU, teacher-forced against HF's bf16 run: every HF top-5 logprob within `tol`,
 *  the greedy pick equal wherever HF's top-1/top-2 margin exceeds 2·tol. */
export async function bf16Parity(name, tol = BF16_TOL) {
  const ref = reference(name)
  const rt = await Runtime.load(fixture(name), { device: 'cuda', dtype: 'bf16' })
  try {
    assert.equal(rt.info.dtype, 'bf16')
    let worst = 0
    for (const [i, step] of ref.bf16.steps.entries()) {
      // `{ tokens }` on a used session would continue its conversation: a fresh one per step
      // (the prefix cache still shares the prompt's blocks).
      const forced = [...ref.prompt_ids, ...ref.bf16.steps.slice(0, i).map((x) => x.token)]
      const { chunks: [c] } = await collect(rt.createSession().generate({ tokens: forced }, { maxTokens: 1, temperature: 0, topLogprobs: 20 }))
      const margin = step.top5[0][1] - step.top5[1][1]
      if (margin > 2 * tol) assert.equal(c.tokenId, step.token, `step ${i} (margin ${margin})`)
      for (const [id, lp] of step.top5) {
        const ours = c.topLogprobs.find((t) => t.tokenId === id)
        assert.ok(ours, `step ${i}: HF top-5 token ${id} is not in our top 20`)
        worst = Math.max(worst, Math.abs(ours.logprob - lp))
      }
    }
    assert.ok(worst <= tol, `max |Δlogprob| ${worst}`)
    console.error(`${name} bf16 on CUDA: max |Δlogprob| vs HF = ${worst.toFixed(4)}`)
  } finally {
    await rt.dispose()
  }
}

/** `fn(rt)` on a runtime of fixture `name`, with the variables `env` set until it is disposed
 *  (the engine reads some of them at its first pass, not at the load). */
export async function withEnv(env, name, options, fn) {
  const saved = { ...process.env }
  Object.assign(process.env, env)
  try {
    const rt = await Runtime.load(fixture(name), options)
    try {
      return await fn(rt)
    } finally {
      await rt.dispose()
    }
  } finally {
    for (const k of Object.keys(env)) {
      if (saved[k] === undefined) delete process.env[k]
      else process.env[k] = saved[k]
    }
  }
}

/** The worst |Δlogprob| between two runs' sessions (chunk lists), up to each session's first
 *  differing token; asserts that tokens agree where `exact`, else that no session differs at its
 *  first step (unless `firstMayDiffer`: the caller compared the first steps' distributions), and
 *  that the worst stays within `tol`. */
export function compareRuns(label, fast, base, { exact, tol, firstMayDiffer = false }) {
  let worst = 0
  for (const [s, chunks] of fast.entries()) {
    // bf16 may take the other side of a near tie (and then end elsewhere): compare up to the
    // first difference.
    const n = Math.min(chunks.length, base[s].length)
    const first = chunks.slice(0, n).findIndex((c, i) => c.tokenId !== base[s][i].tokenId)
    if (first === -1) assert.equal(chunks.length, base[s].length, `${label} session ${s}: lengths`)
    else assert.ok(!exact && (first > 0 || firstMayDiffer), `${label} session ${s} step ${first}: ${chunks[first].tokenId} vs ${base[s][first].tokenId}`)
    for (let i = 0; i < (first === -1 ? n : first); i++) worst = Math.max(worst, Math.abs(chunks[i].logprob - base[s][i].logprob))
  }
  assert.ok(worst <= tol, `${label}: max |Δlogprob| ${worst}`)
  return worst
}

/** The worst |Δlogprob|, over each session's first step, of the base run's top 5 tokens in the
 *  other run's top 20 (asserting that each is there): two bf16 runs may order a near tie apart,
 *  so their first tokens may differ while their distributions agree. */
export function compareFirstSteps(label, fast, base) {
  let worst = 0
  for (const [s, chunks] of fast.entries()) {
    for (const t of base[s][0].topLogprobs.slice(0, 5)) {
      const ours = chunks[0].topLogprobs.find((x) => x.tokenId === t.tokenId)
      assert.ok(ours, `${label} session ${s}: token ${t.tokenId} of the base run's top 5 is not in the top 20`)
      worst = Math.max(worst, Math.abs(ours.logprob - t.logprob))
    }
  }
  return worst
}
