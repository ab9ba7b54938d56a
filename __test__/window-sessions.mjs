// Sessions on a model with sliding-window layers, past the window: shared by the families'
// suites (gemma3.test.mjs, mistral.test.mjs). `getRt()` returns the loaded Runtime, `ref` the
// fixture's reference.json (a prompt longer than the window and its greedy f32 steps).
import { it } from 'node:test'
import assert from 'node:assert/strict'
import { GREEDY } from './helpers.mjs'

export function itRunsSessionsPastTheWindow(getRt, ref) {
  it('a second turn reuses the cache and answers as a fresh session recomputing it all', async () => {
    const rt = getRt()
    const s = rt.createSession()
    const a = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 6 })
    assert.deepEqual(a.tokens, ref.f32.steps.slice(0, 6).map((x) => x.token))
    const b = await s.complete({ tokens: [50, 60] }, { ...GREEDY, maxTokens: 6 })
    // Everything but the last answer token, which was sampled and never evaluated.
    assert.equal(b.usage.cachedTokens, ref.prompt_ids.length + 6 - 1)
    const fresh = await rt.createSession().complete({ tokens: [...ref.prompt_ids, ...a.tokens, 50, 60] }, { ...GREEDY, maxTokens: 6 })
    assert.deepEqual(b.tokens, fresh.tokens)
  })

  it('layers past their window give its blocks back to the pool, and stats() shows it', async () => {
    const rt = getRt()
    const before = rt.stats()
    const s = rt.createSession()
    const r = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 24 })
    assert.deepEqual(r.tokens.slice(0, 6), ref.f32.steps.slice(0, 6).map((x) => x.token))
    const after = rt.stats()
    // The positions the idle session keeps for its next turn (the last answer token was never
    // evaluated), with every layer keeping them all, against what its blocks take.
    const positions = ref.prompt_ids.length + r.tokens.length - 1
    const allGlobal = Math.ceil(positions / after.kvBlockSize) * after.kvBlockSize * after.kvBytesPerToken
    const held = after.kvBytes - before.kvBytes
    assert.ok(after.kvBlocksBehindWindow > before.kvBlocksBehindWindow, JSON.stringify(after))
    assert.ok(held > 0 && held < allGlobal, `held ${held} of ${allGlobal}`)
    // The next turn continues from what the window kept, as a fresh session recomputing it all.
    const next = await s.complete({ tokens: [9, 8, 7] }, { ...GREEDY, maxTokens: 4 })
    assert.equal(next.usage.cachedTokens, positions)
    const fresh = await rt.createSession().complete({ tokens: [...ref.prompt_ids, ...r.tokens, 9, 8, 7] }, { ...GREEDY, maxTokens: 4 })
    assert.deepEqual(next.tokens, fresh.tokens)
  })

  it('sessions sharing a prefix past the window reuse its blocks and answer as alone', async () => {
    const rt = getRt()
    const prefix = ref.prompt_ids.concat(ref.f32.steps.map((s) => s.token))
    const alone = await rt.createSession().complete({ tokens: [...prefix, 7] }, { ...GREEDY, maxTokens: 5 })
    const shared = await rt.createSession().complete({ tokens: [...prefix, 7] }, { ...GREEDY, maxTokens: 5 })
    assert.ok(shared.usage.cachedTokens >= 32, `cached ${shared.usage.cachedTokens}`)
    assert.deepEqual(shared.tokens, alone.tokens)
  })

  it('8 concurrent sessions of different lengths decode in one batch exactly as each alone', async () => {
    const rt = getRt()
    const prompts = Array.from({ length: 8 }, (_, i) => ref.prompt_ids.slice(0, 3 + 3 * i))
    const solo = []
    for (const p of prompts) solo.push((await rt.createSession().complete({ tokens: p }, { ...GREEDY, maxTokens: 12 })).tokens)
    const together = await Promise.all(prompts.map((p) => rt.createSession().complete({ tokens: p }, { ...GREEDY, maxTokens: 12 })))
    assert.deepEqual(together.map((r) => r.tokens), solo)
  })
}
