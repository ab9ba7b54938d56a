// Mistral and Ministral through the public API on __test__/fixtures/mistral-tiny (every layer
// sliding, window 6) and ministral-tiny (sliding and full layers by layer_types, window 5), tiny
// random models from scripts/gen_mistral_fixtures.py. Both run as Llama's network with a
// window. Greedy f32 parity is in generate.test.mjs with the other families; here: a second turn
// continues past the window from the session's cache, prefixes are shared, and a batch of
// sessions of different lengths decodes exactly as each alone.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { fixture, GREEDY, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

for (const name of ['mistral-tiny', 'ministral-tiny']) {
  describe(`${name}: past the window through the API`, () => {
    const ref = reference(name)
    let rt
    before(async () => {
      rt = await Runtime.load(fixture(name))
    })
    after(() => rt?.dispose())

    it('a second turn reuses the cache and answers as a fresh session recomputing it all', async () => {
      const s = rt.createSession()
      const a = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 6 })
      assert.deepEqual(a.tokens, ref.f32.steps.slice(0, 6).map((x) => x.token))
      const b = await s.complete({ tokens: [50, 60] }, { ...GREEDY, maxTokens: 6 })
      assert.equal(b.usage.cachedTokens, ref.prompt_ids.length + 6 - 1)
      const fresh = await rt.createSession().complete({ tokens: [...ref.prompt_ids, ...a.tokens, 50, 60] }, { ...GREEDY, maxTokens: 6 })
      assert.deepEqual(b.tokens, fresh.tokens)
    })

    it('sessions sharing a prefix past the window reuse its blocks and answer as alone', async () => {
      const prefix = ref.prompt_ids.concat(ref.f32.steps.map((s) => s.token))
      const alone = await rt.createSession().complete({ tokens: [...prefix, 7] }, { ...GREEDY, maxTokens: 5 })
      const shared = await rt.createSession().complete({ tokens: [...prefix, 7] }, { ...GREEDY, maxTokens: 5 })
      assert.ok(shared.usage.cachedTokens >= 32, `cached ${shared.usage.cachedTokens}`)
      assert.deepEqual(shared.tokens, alone.tokens)
    })

    it('8 concurrent sessions of different lengths decode in one batch exactly as each alone', async () => {
      const prompts = Array.from({ length: 8 }, (_, i) => ref.prompt_ids.slice(0, 3 + 3 * i))
      const solo = []
      for (const p of prompts) solo.push((await rt.createSession().complete({ tokens: p }, { ...GREEDY, maxTokens: 12 })).tokens)
      const together = await Promise.all(prompts.map((p) => rt.createSession().complete({ tokens: p }, { ...GREEDY, maxTokens: 12 })))
      assert.deepEqual(together.map((r) => r.tokens), solo)
    })
  })
}
