// Sessions that outlive the context: `contextShift: 'drop-oldest'` keeps a long chat going in
// a small context (dropping the oldest turns, keeping the system prompt and its cache), and
// `setHistory` restores a saved conversation. On the tiny Qwen3 fixture, greedy.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { fixture, GREEDY, reference, coded } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const CONTEXT = 256
const SYSTEM = 'You answer in one short sentence.'
const TURN = { ...GREEDY, maxTokens: 24 }
const question = (i) => `Question ${i}: what is the weather like today?`


describe('contextShift and setHistory (qwen3-tiny, 256-token context)', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(fixture('qwen3-tiny'), { contextLength: CONTEXT })
  })
  after(() => rt?.dispose())

  it('without contextShift a long chat ends in CONTEXT_OVERFLOW', async () => {
    const s = rt.createSession({ system: SYSTEM })
    let failed
    for (let i = 0; i < 20 && !failed; i++) {
      await s.complete(question(i), TURN).catch((e) => (failed = e))
    }
    assert.ok(failed, 'twenty turns cannot fit in 256 tokens')
    coded('CONTEXT_OVERFLOW')(failed)
    s.dispose()
  })

  it("'drop-oldest': a 20-turn chat keeps answering; old turns leave, the system prompt stays", async () => {
    const s = rt.createSession({ system: SYSTEM, contextShift: 'drop-oldest' })
    let shifts = 0
    let previous = s.history.length
    for (let i = 0; i < 20; i++) {
      const r = await s.complete(question(i), TURN)
      assert.ok(r.tokens.length > 0, `turn ${i} answered`)
      assert.ok(r.usage.promptTokens + r.usage.completionTokens <= CONTEXT, `turn ${i} fits the context`)
      const h = s.history
      assert.deepEqual(h[0], { role: 'system', content: SYSTEM })
      assert.deepEqual(h.at(-2), { role: 'user', content: question(i) })
      assert.equal(h.at(-1).role, 'assistant')
      // The history alternates user / assistant after the system prompt: whole turns leave.
      h.slice(1).forEach((m, j) => assert.equal(m.role, j % 2 === 0 ? 'user' : 'assistant'))
      if (h.length < previous + 2) {
        shifts++
        // The system prompt's tokens (and the template's markup before the first turn) are
        // still cached: only what follows the first dropped turn is evaluated again.
        assert.ok(r.usage.cachedTokens > 0, `turn ${i}: the kept prefix is reused`)
        assert.ok(r.usage.cachedTokens < r.usage.promptTokens)
      } else if (i > 0) {
        // No shift: everything before this turn's question is cached.
        assert.ok(r.usage.cachedTokens > r.usage.promptTokens / 2, `turn ${i}: ${JSON.stringify(r.usage)}`)
      }
      previous = h.length
    }
    assert.ok(shifts >= 5, `the context shifted ${shifts} times`)
    s.dispose()
  })

  it('a shifted turn runs exactly as the kept conversation would in a fresh session', async () => {
    const s = rt.createSession({ system: SYSTEM, contextShift: 'drop-oldest' })
    let last
    for (let i = 0; i < 12; i++) last = await s.complete(question(i), TURN)
    const kept = s.history.slice(0, -1)
    assert.ok(kept.length < 1 + 2 * 12, 'turns were dropped')
    const fresh = rt.createSession()
    fresh.setHistory(kept.slice(0, -1))
    const again = await fresh.complete(kept.at(-1).content, TURN)
    assert.deepEqual(again.tokens, last.tokens)
    assert.equal(again.usage.promptTokens, last.usage.promptTokens)
    assert.deepEqual(fresh.history, s.history)
    s.dispose()
    fresh.dispose()
  })

  it('a question longer than the context still fails with CONTEXT_OVERFLOW, and the session lives on', async () => {
    const s = rt.createSession({ system: SYSTEM, contextShift: 'drop-oldest' })
    await s.complete(question(0), TURN)
    await assert.rejects(s.complete('word '.repeat(CONTEXT), TURN), coded('CONTEXT_OVERFLOW'))
    assert.equal(s.history.length, 3, 'a refused turn leaves the history as it was')
    const r = await s.complete(question(1), TURN)
    assert.ok(r.tokens.length > 0)
    s.dispose()
  })

  it('raw { tokens } input is never shifted', async () => {
    const s = rt.createSession({ contextShift: 'drop-oldest' })
    await assert.rejects(s.complete({ tokens: new Array(CONTEXT + 1).fill(5) }, TURN), coded('CONTEXT_OVERFLOW'))
    s.dispose()
  })

  it('setHistory restores a saved conversation: the next turn equals the original session’s', async () => {
    const a = rt.createSession({ system: SYSTEM })
    await a.complete(question(0), TURN)
    await a.complete(question(1), TURN)
    const saved = JSON.parse(JSON.stringify(a.history))
    const b = rt.createSession()
    b.setHistory(saved)
    assert.deepEqual(b.history, saved)
    const [ra, rb] = [await a.complete(question(2), TURN), await b.complete(question(2), TURN)]
    assert.deepEqual(rb.tokens, ra.tokens)
    assert.equal(rb.usage.promptTokens, ra.usage.promptTokens)
    assert.deepEqual(b.history, a.history)
    // reset() goes back to the system prompt the session was created with (none for b).
    b.reset()
    assert.deepEqual(b.history, [])
    a.dispose()
    b.dispose()
  })

  it('setHistory replaces what the session had, and checks its argument', async () => {
    const s = rt.createSession({ system: SYSTEM })
    await s.complete(question(0), TURN)
    const restored = [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'hello' }]
    s.setHistory(restored)
    const r = await s.complete('and now?', TURN)
    // The old conversation is gone: the turn runs as on a fresh session given the same history.
    const fresh = rt.createSession()
    fresh.setHistory(restored)
    const expected = await fresh.complete('and now?', TURN)
    assert.deepEqual(r.tokens, expected.tokens)
    assert.equal(r.usage.promptTokens, expected.usage.promptTokens)
    assert.deepEqual(s.history, fresh.history)
    fresh.dispose()
    s.setHistory([])
    assert.deepEqual(s.history, [])
    assert.throws(() => s.setHistory('hi'), coded('INVALID_ARGUMENT'))
    assert.throws(() => s.setHistory([{ role: 'user' }]), coded('INVALID_ARGUMENT'))
    assert.throws(() => s.setHistory([null]), coded('INVALID_ARGUMENT'))
    assert.throws(() => rt.createSession({ contextShift: 'drop-newest' }), coded('INVALID_ARGUMENT'))
    s.dispose()
    assert.throws(() => s.setHistory([]), coded('DISPOSED'))
  })

  it('setHistory while generating fails with SESSION_BUSY', async () => {
    const s = rt.createSession()
    // The reference prompt never samples an EOS greedily: it runs until the context is full.
    const stream = s.generate({ tokens: reference('qwen3-tiny').prompt_ids }, GREEDY)
    const it = stream[Symbol.asyncIterator]()
    await it.next()
    assert.throws(() => s.setHistory([]), coded('SESSION_BUSY'))
    await it.return()
    s.setHistory([])
    s.dispose()
  })
})
