// Gemma 3 (gemma3_text) through the public API on __test__/fixtures/gemma3-tiny (a tiny random
// Gemma3ForCausalLM whose sliding window is 8 positions; scripts/gen_gemma3_fixtures.py): the
// chat template (no system role: transformers folds it into the first user turn), HF parity in
// bf16 and f16, sessions that continue and share a prefix past the window, and batched decoding
// equal to solo. Greedy parity in f32 is in generate.test.mjs with the other families.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { collect, fixture, GREEDY, reference } from './helpers.mjs'
import { itRunsSessionsPastTheWindow } from './window-sessions.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const NAME = 'gemma3-tiny'
const ref = reference(NAME)
const n = ref.f32.steps.length

describe('Gemma 3: gemma3-tiny', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(fixture(NAME))
  })
  after(() => rt?.dispose())

  it('loads as gemma3 with its layer plan: sliding and full layers, two rotary bases', () => {
    assert.equal(rt.info.architecture, 'gemma3')
    assert.equal(rt.info.numLayers, 4)
    assert.deepEqual(rt.info.eosTokenIds.slice().sort(), [395, 402])
  })

  it("chat messages render as transformers' template does, a system message folded into the first turn", async () => {
    assert.equal(ref.chat.length, 2)
    assert.equal(ref.chat[1].messages[0].role, 'system')
    for (const c of ref.chat) {
      const viaChat = await rt.createSession().complete(c.messages, { ...GREEDY, maxTokens: 6 })
      const viaIds = await rt.createSession().complete({ tokens: c.ids }, { ...GREEDY, maxTokens: 6 })
      assert.equal(viaChat.usage.promptTokens, c.ids.length, JSON.stringify(c.text))
      assert.deepEqual(viaChat.tokens, viaIds.tokens, JSON.stringify(c.text))
    }
    // A session's own system prompt goes the same way.
    const [sys, ...rest] = ref.chat[1].messages
    const s = rt.createSession({ system: sys.content })
    const viaSession = await s.complete(rest, { ...GREEDY, maxTokens: 6 })
    assert.equal(viaSession.usage.promptTokens, ref.chat[1].ids.length)
  })

  for (const [dtype, tol] of [['bf16', 0.15], ['f16', 0.02]]) {
    it(`${dtype} (the generic attention path, windows included) follows the HF ${dtype} reference within ${tol}`, async () => {
      const low = await Runtime.load(fixture(NAME), { dtype })
      try {
        const { chunks } = await collect(low.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: n }))
        const steps = ref[dtype].steps
        chunks.forEach((c, i) => {
          const margin = steps[i].top5[0][1] - steps[i].top5[1][1]
          if (margin > 2 * tol) assert.equal(c.tokenId, steps[i].token, `step ${i}`)
          if (c.tokenId === steps[i].token) assert.ok(Math.abs(c.logprob - steps[i].logprob) <= tol, `step ${i}: ${c.logprob} vs ${steps[i].logprob}`)
        })
      } finally {
        await low.dispose()
      }
    })
  }

  itRunsSessionsPastTheWindow(() => rt, ref)
})
