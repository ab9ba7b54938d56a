// Granite 3 (granite: Llama's network with embedding, residual and attention multipliers and a
// logit divisor) through the public API on __test__/fixtures/granite-tiny
// (scripts/gen_granite_fixtures.py). f32 greedy parity with HF is in generate.test.mjs with the
// other families, the GGUF and PEFT parity in tests/granite.rs; here: its GGUF and its experts
// through the binding, a second turn that reuses the cache, batched decoding equal to solo, and
// quantize-on-load.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { collect, fixture, fixtureJson, GREEDY, LOGPROB_TOL, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const NAME = 'granite-tiny'
const ref = reference(NAME)
const experts = fixtureJson(NAME, 'experts', 'reference.json').cases

function assertSteps(chunks, steps, what) {
  assert.deepEqual(chunks.map((c) => c.tokenId), steps.map((s) => s.token), `${what}: greedy tokens differ`)
  chunks.forEach((c, i) => assert.ok(Math.abs(c.logprob - steps[i].logprob) <= LOGPROB_TOL, `${what} step ${i}: ${c.logprob} vs ${steps[i].logprob}`))
}

describe('Granite 3: granite-tiny', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(fixture(NAME))
  })
  after(() => rt?.dispose())

  it('runs as the llama network; its family is granite; its GGUF answers as HF and as llama.cpp on the same file', async () => {
    assert.deepEqual([rt.info.architecture, rt.info.family], ['llama', 'granite'])
    const g = await Runtime.load(fixture(NAME, 'model-f32.gguf'))
    try {
      assert.deepEqual([g.info.architecture, g.info.family], ['llama', 'granite'])
      const { chunks } = await collect(g.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.f32.steps.length }))
      assertSteps(chunks, ref.f32.steps, 'GGUF')
      assert.deepEqual(chunks.map((c) => c.tokenId), ref.llamacpp.tokens)
    } finally {
      await g.dispose()
    }
  })

  it('LoRA, DoRA, IA³ and prompt tuning answer as PEFT', async () => {
    for (const name of ['lora', 'dora', 'ia3', 'prompt']) {
      await rt.loadExpert(fixture(NAME, 'experts', name), { name })
      const c = experts[name]
      const { chunks } = await collect(rt.createSession().generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: c.steps.length, experts: [name] }))
      assertSteps(chunks, c.steps, name)
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

  it('quantize-on-load (q8_0) runs with its multipliers and keeps its greedy tokens', async () => {
    const q = await Runtime.load(fixture(NAME), { quantize: 'q8_0' })
    try {
      assert.equal(q.info.quantization, 'q8_0')
      // Q8_0 weights (|Δlogprob| up to ~0.2 here, the embedding multiplier of 4 included) keep
      // HF's greedy tokens on this prompt.
      const { chunks } = await collect(q.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.f32.steps.length }))
      assert.deepEqual(chunks.map((c) => c.tokenId), ref.f32.steps.map((x) => x.token))
      chunks.forEach((c, i) => assert.ok(Math.abs(c.logprob - ref.f32.steps[i].logprob) < 0.3, `step ${i}: ${c.logprob} vs ${ref.f32.steps[i].logprob}`))
    } finally {
      await q.dispose()
    }
  })
})
