// Sessions on a model with sliding-window layers, past the window: shared by the families'
// suites (gemma3.test.mjs, mistral.test.mjs). `getRt()` returns the loaded Runtime, `ref` the
// fixture's reference.json (a prompt longer than the window and its greedy f32 steps), `model`
// the fixture's path (a test that counts the pool's blocks loads a runtime of its own).
import { it } from 'node:test'
import assert from 'node:assert/strict'
import { Runtime } from '../dist/index.js'
import { GREEDY } from './helpers.mjs'

/** `rt.stats()` once the engine has published the end of every request (the last token reaches
 * JS just before the engine's step ends and the table gives back its spare blocks). */
async function statsWhenIdle(rt) {
  const deadline = Date.now() + 20_000
  let st = rt.stats()
  while (st.activeRequests > 0 && Date.now() < deadline) {
    await new Promise((r) => setImmediate(r))
    st = rt.stats()
  }
  return st
}

export function itRunsSessionsPastTheWindow(getRt, ref, model) {
  it('a second turn reuses the cache and answers as a fresh session recomputing it all', async () => {
    const rt = getRt()
    const s = rt.createSession()
    const a = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 6 })
    assert.deepEqual(a.tokens, ref.f32.steps.slice(0, 6).map((x) => x.token))
    const b = await s.complete({ tokens: [50, 60] }, { ...GREEDY, maxTokens: 6 })
    // At least everything but the last answer token, which was sampled and never evaluated
    // (another session that went on with the same answer may hold more of it).
    assert.ok(b.usage.cachedTokens >= ref.prompt_ids.length + 6 - 1, `cached ${b.usage.cachedTokens}`)
    const fresh = await rt.createSession().complete({ tokens: [...ref.prompt_ids, ...a.tokens, 50, 60] }, { ...GREEDY, maxTokens: 6 })
    assert.deepEqual(b.tokens, fresh.tokens)
  })

  it('layers past their window give its blocks back to the pool, and stats() shows it', async () => {
    // A runtime of its own: sessions of other tests, freed whenever the garbage collector
    // drops them, would move the count.
    const rt = await Runtime.load(model)
    try {
      const before = rt.stats()
      assert.equal(before.kvBlocksUsed, 0)
      const s = rt.createSession()
      const r = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 24 })
      assert.deepEqual(r.tokens.slice(0, 6), ref.f32.steps.slice(0, 6).map((x) => x.token))
      const after = await statsWhenIdle(rt)
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
    } finally {
      await rt.dispose()
    }
  })

  it('sessions sharing a prefix past the window reuse its blocks and answer as alone', async () => {
    const rt = getRt()
    const prefix = ref.prompt_ids.concat(ref.f32.steps.map((s) => s.token))
    const alone = await rt.createSession().complete({ tokens: [...prefix, 7] }, { ...GREEDY, maxTokens: 5 })
    const shared = await rt.createSession().complete({ tokens: [...prefix, 7] }, { ...GREEDY, maxTokens: 5 })
    assert.ok(shared.usage.cachedTokens >= 32, `cached ${shared.usage.cachedTokens}`)
    assert.deepEqual(shared.tokens, alone.tokens)
  })

  it('a prefix stays reachable after the sessions that computed it moved past its window', async () => {
    // Unrelated sessions first: their window blocks go back to the pool and are never asked
    // for again, so the pool judges its cache not worth keeping and recycles it first. The
    // window's blocks before a shared prefix's end are then soon gone; a hit must walk past
    // them to the blocks its window reads.
    const rt = await Runtime.load(model)
    try {
      const other = (i) => Array.from({ length: 40 }, (_, j) => 3 + ((i * 7 + j * 5) % 40))
      const keep = []
      for (let i = 0; i < 3; i++) {
        const s = rt.createSession()
        keep.push(s)
        await s.complete({ tokens: other(i) }, { ...GREEDY, maxTokens: 8 })
      }
      const prefix = ref.prompt_ids.concat(ref.f32.steps.map((s) => s.token))
      const cached = []
      for (let i = 0; i < 4; i++) {
        const s = rt.createSession()
        keep.push(s)
        cached.push((await s.complete({ tokens: [...prefix, 7] }, { ...GREEDY, maxTokens: 5 })).usage.cachedTokens)
      }
      const whole = Math.floor(prefix.length / 16) * 16
      assert.ok(cached.slice(1).every((n) => n >= whole), `cached ${cached} of a ${prefix.length}-token prefix`)
    } finally {
      await rt.dispose()
    }
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
