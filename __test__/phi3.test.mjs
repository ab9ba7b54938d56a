// Phi-3 and Phi-4-mini (phi3: Llama's network with fused qkv_proj / gate_up_proj, a sliding
// window, partial rotary embeddings and LongRoPE) through the public API:
// - __test__/fixtures/phi3-tiny (window 6, experts on the fused modules): the family suite
//   (family-suite.mjs);
// - __test__/fixtures/phi4-mini-tiny (rotary 12 of 16, LongRoPE from 16 to 64 positions): its
//   runs within and across the original length as HF, and what a second turn past it reuses.
// Both from scripts/gen_phi3_fixtures.py.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { collect, fixture, GREEDY, LOGPROB_TOL, reference } from './helpers.mjs'
import { describeFamily } from './family-suite.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

describeFamily('phi3-tiny', 'llama', 'phi3')

describe('phi3: phi4-mini-tiny (partial rotary, LongRoPE)', () => {
  const ref = reference('phi4-mini-tiny')
  let rt
  before(async () => {
    rt = await Runtime.load(fixture('phi4-mini-tiny'))
  })
  after(() => rt?.dispose())

  it('reports its rotary dimension and LongRoPE, and decodes within and across the original length as HF', async () => {
    assert.deepEqual([rt.info.architecture, rt.info.family, rt.info.contextLength], ['llama', 'phi3', 64])
    assert.equal(rt.info.ropeScaling.type, 'longrope')
    assert.equal(rt.info.ropeScaling.originalMaxPositionEmbeddings, 16)
    for (const run of ['short', 'crossing']) {
      const { prompt_ids, steps } = ref.runs[run]
      const { chunks } = await collect(rt.createSession().generate({ tokens: prompt_ids }, { ...GREEDY, maxTokens: steps.length }))
      assert.deepEqual(chunks.map((c) => c.tokenId), steps.map((s) => s.token), run)
      chunks.forEach((c, i) => assert.ok(Math.abs(c.logprob - steps[i].logprob) <= LOGPROB_TOL, `${run} step ${i}`))
    }
  })

  it('a second turn within the original length reuses the cache; past it, every position turns anew', async () => {
    const s = rt.createSession()
    const a = await s.complete({ tokens: ref.prompt_ids.slice(0, 6) }, { ...GREEDY, maxTokens: 4 })
    const b = await s.complete({ tokens: [50, 60] }, { ...GREEDY, maxTokens: 3 })
    assert.equal(b.usage.cachedTokens, 6 + 4 - 1)
    // 15 + 8 positions: past the original 16, so the long factors turn all of them.
    const c = await s.complete({ tokens: ref.prompt_ids.slice(6, 14) }, { ...GREEDY, maxTokens: 4 })
    assert.equal(c.usage.cachedTokens, 0)
    const fresh = await rt.createSession().complete(
      { tokens: [...ref.prompt_ids.slice(0, 6), ...a.tokens, 50, 60, ...b.tokens, ...ref.prompt_ids.slice(6, 14)] },
      { ...GREEDY, maxTokens: 4 },
    )
    assert.deepEqual(c.tokens, fresh.tokens)
  })
})
