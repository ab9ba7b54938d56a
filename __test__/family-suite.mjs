// One family's checks through the public API, on a fixture with a GGUF and experts/
// (granite-tiny, smollm3-tiny): its info, its GGUF (as HF, and as llama.cpp when the fixture
// recorded llama.cpp's decode), LoRA / DoRA / IA³ / prompt tuning as PEFT, a second turn from the
// cache, batched decoding under mixed experts equal to solo, and quantize-on-load. f32 greedy
// parity from safetensors is in generate.test.mjs with the other families.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { collect, fixture, fixtureJson, GREEDY, LOGPROB_TOL, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

function assertSteps(chunks, steps, what) {
  assert.deepEqual(chunks.map((c) => c.tokenId), steps.map((s) => s.token), `${what}: greedy tokens differ`)
  chunks.forEach((c, i) => assert.ok(Math.abs(c.logprob - steps[i].logprob) <= LOGPROB_TOL, `${what} step ${i}: ${c.logprob} vs ${steps[i].logprob}`))
}

/**
 * A lossy runtime's greedy run on `q` (quantize-on-load, a half-precision KV cache) against HF's
 * f32 reference `ref`: Q8_0 weights move logprobs by up to ~0.2 on these tiny random models, so
 * the run follows HF's until a step where HF's own top two are that close, and stays near HF's
 * logprobs on the way.
 */
export async function assertQ8FollowsHf(q, ref) {
  const { chunks } = await collect(q.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.f32.steps.length }))
  for (const [i, c] of chunks.entries()) {
    const step = ref.f32.steps[i]
    if (c.tokenId !== step.token) {
      const margin = step.top5[0][1] - step.top5[1][1]
      assert.ok(margin < 0.3 && i > 0, `step ${i}: ${c.tokenId} vs HF's ${step.token}, whose margin is ${margin}`)
      break
    }
    assert.ok(Math.abs(c.logprob - step.logprob) < 0.3, `step ${i}: ${c.logprob} vs ${step.logprob}`)
  }
}

/**
 * The suite for fixture `name`, whose info says `[architecture, family]`. `gguf: false` where
 * the fixture's GGUF is not read yet, `ggufFamily` the GGUF's own name for the family (its
 * `general.architecture`); `experts`: the experts/ it has; `quantized`: what
 * quantize-on-load (q8_0) makes of its linear weights; `q8Reference`: the reference.json run
 * that emulates q8_0's arithmetic (a routed model's picks are too sensitive to compare it with
 * the f32 run).
 */
export function describeFamily(name, architecture, family, { gguf = true, ggufFamily = family, experts: kinds = ['lora', 'dora', 'ia3', 'prompt'], quantized = 'q8_0', q8Reference } = {}) {
  const ref = reference(name)
  const experts = fixtureJson(name, 'experts', 'reference.json').cases

  describe(`${family}: ${name}`, () => {
    let rt
    before(async () => {
      rt = await Runtime.load(fixture(name))
    })
    after(() => rt?.dispose())

    it(`runs as the ${architecture} network, family ${family}; its ${gguf ? 'GGUF' : 'safetensors'} answer${gguf ? 's' : ''} as HF${gguf && ref.llamacpp && !ref.llamacpp.reference ? ' and as llama.cpp' : ''}`, async () => {
      assert.deepEqual([rt.info.architecture, rt.info.family], [architecture, family])
      if (!gguf) {
        // (On a runtime of its own: what it caches must not serve the later tests' prompts.)
        const st = await Runtime.load(fixture(name))
        try {
          const { chunks } = await collect(st.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.f32.steps.length }))
          assertSteps(chunks, ref.f32.steps, 'safetensors')
        } finally {
          await st.dispose()
        }
        return
      }
      const g = await Runtime.load(fixture(name, 'model-f32.gguf'))
      try {
        assert.deepEqual([g.info.architecture, g.info.family], [architecture, ggufFamily])
        const { chunks } = await collect(g.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.f32.steps.length }))
        assertSteps(chunks, ref.f32.steps, 'GGUF')
        // (A `reference` names the HF run llama.cpp's decode matches instead, when llama.cpp
        // leaves out something the family has: Phi-3's window.)
        if (ref.llamacpp && !ref.llamacpp.reference) assert.deepEqual(chunks.map((c) => c.tokenId), ref.llamacpp.tokens)
      } finally {
        await g.dispose()
      }
    })

    it(`${kinds.join(', ')} answer as PEFT`, async () => {
      for (const e of kinds) {
        await rt.loadExpert(fixture(name, 'experts', e), { name: e })
        const c = experts[e]
        const { chunks } = await collect(rt.createSession().generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: c.steps.length, experts: [e] }))
        assertSteps(chunks, c.steps, e)
      }
    })

    it('a second turn reuses the cache and answers as a fresh session recomputing it all', async () => {
      const s = rt.createSession()
      const a = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 6 })
      const b = await s.complete({ tokens: [50, 60] }, { ...GREEDY, maxTokens: 6 })
      assert.equal(b.usage.cachedTokens, ref.prompt_ids.length + 6 - 1)
      const fresh = await rt.createSession().complete({ tokens: [...ref.prompt_ids, ...a.tokens, 50, 60] }, { ...GREEDY, maxTokens: 6 })
      assert.deepEqual(b.tokens, fresh.tokens)
    })

    it('8 concurrent sessions, some under experts, decode in one batch exactly as each alone', async () => {
      const runs = Array.from({ length: 8 }, (_, i) => ({ tokens: ref.prompt_ids.slice(0, 3 + 2 * i), experts: i % 3 === 0 ? [] : [['lora', 'ia3'][i % 2]] }))
      const solo = []
      for (const r of runs) solo.push((await rt.createSession().complete({ tokens: r.tokens }, { ...GREEDY, maxTokens: 10, experts: r.experts })).tokens)
      const together = await Promise.all(runs.map((r) => rt.createSession().complete({ tokens: r.tokens }, { ...GREEDY, maxTokens: 10, experts: r.experts })))
      assert.deepEqual(together.map((r) => r.tokens), solo)
    })

    it(`quantize-on-load (q8_0) follows HF${q8Reference ? ` with q8_0's arithmetic (reference.json ${q8Reference})` : ''} until a near-tie`, async () => {
      const q = await Runtime.load(fixture(name), { quantize: 'q8_0' })
      try {
        assert.equal(q.info.quantization, quantized)
        if (q8Reference) {
          // HF on the same Q8_0 weights and Q8_0-rounded activations: the same arithmetic up to
          // f32 summation order and a rare rounding tie.
          const steps = ref[q8Reference].steps
          const { chunks } = await collect(q.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: steps.length }))
          for (const [i, c] of chunks.entries()) {
            const step = steps[i]
            if (c.tokenId !== step.token) {
              const margin = step.top5[0][1] - step.top5[1][1]
              assert.ok(margin < 0.1, `step ${i}: ${c.tokenId} vs ${step.token}, whose margin is ${margin}`)
              break
            }
            assert.ok(Math.abs(c.logprob - step.logprob) < 0.05, `step ${i}: ${c.logprob} vs ${step.logprob}`)
          }
          return
        }
        await assertQ8FollowsHf(q, ref)
      } finally {
        await q.dispose()
      }
    })
  })
}
