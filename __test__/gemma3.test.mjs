// Gemma 3 (gemma3_text) through the public API on __test__/fixtures/gemma3-tiny (a tiny random
// Gemma3ForCausalLM whose sliding window is 8 positions; scripts/gen_gemma3_fixtures.py): the
// chat template (no system role: transformers folds it into the first user turn), HF parity in
// bf16 and f16, sessions that continue and share a prefix past the window, and batched decoding
// equal to solo. Greedy parity in f32 is in generate.test.mjs with the other families.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { collect, fixture, fixtureJson, GREEDY, LOGPROB_TOL, reference } from './helpers.mjs'
import { itRunsSessionsPastTheWindow } from './window-sessions.mjs'

const require = createRequire(import.meta.url)
const { Runtime, inspect } = require('../dist/index.js')

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
    assert.equal(rt.info.family, 'gemma3_text')
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

  itRunsSessionsPastTheWindow(() => rt, ref, fixture(NAME))
})

// The text model of a multimodal checkpoint (model_type gemma3 with a text_config, the layout of
// google/gemma-3-4b-it; scripts/gen_gemma3_multimodal_fixture.py): gemma3-tiny's text weights
// beside a vision tower, and LoRA experts PEFT trained on the whole model.
describe('Gemma 3: the text model of a multimodal checkpoint (gemma3-mm-tiny)', () => {
  const MM = 'gemma3-mm-tiny'
  const cases = fixtureJson(MM, 'reference.json').cases
  let rt
  before(async () => {
    rt = await Runtime.load(fixture(MM))
  })
  after(() => rt?.dispose())

  const assertSteps = (chunks, steps, what) => {
    assert.deepEqual(chunks.map((c) => c.tokenId), steps.map((s) => s.token), `${what}: greedy tokens differ`)
    chunks.forEach((c, i) => assert.ok(Math.abs(c.logprob - steps[i].logprob) <= LOGPROB_TOL, `${what} step ${i}`))
  }

  it('loads as gemma3, inspect says what it read, and answers as HF', async () => {
    assert.equal(rt.info.architecture, 'gemma3')
    assert.equal(rt.info.family, 'gemma3')
    const m = await inspect(fixture(MM))
    assert.equal(m.family, 'gemma3')
    assert.match(m.plan[0], /text model of a multimodal checkpoint/)
    const c = cases.base
    const { chunks } = await collect(rt.createSession().generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: c.steps.length }))
    assertSteps(chunks, c.steps, 'base')
  })

  it("an expert trained on the whole model answers as PEFT; its vision-tower tensors are counted, not loaded", async () => {
    for (const [name, vision] of [['lora', 6], ['lora_regex', 0]]) {
      const e = await rt.loadExpert(fixture(MM, name), { name })
      assert.equal(e.skippedVisionTensors, vision)
      assert.equal(e.toJSON().skippedVisionTensors, vision)
      const c = cases[name]
      const { chunks } = await collect(rt.createSession().generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: c.steps.length, experts: [name] }))
      assertSteps(chunks, c.steps, name)
    }
  })

  itRunsSessionsPastTheWindow(() => rt, { prompt_ids: cases.base.prompt_ids, f32: { steps: cases.base.steps } }, fixture(MM))
})
