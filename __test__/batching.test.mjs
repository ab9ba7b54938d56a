// Paged KV cache and continuous batching through the public API, on the tiny f32 fixtures:
// many concurrent sessions with different prompts, experts and lengths give exactly what each
// request gives alone; a shared prefix is evaluated once; a pool too small for everyone still
// finishes everyone, within its bound; and the KV options and errors.
//
// "Alone" means a second runtime with the prefix cache off, running one request at a time: a
// cold, unbatched reference for every comparison here.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { FIXTURES, GREEDY, LOGPROB_TOL } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const MODEL = path.join(FIXTURES, 'qwen3-tiny')
const ADAPTERS = path.join(FIXTURES, 'adapters')
const EXPERTS = ['lora', 'lora2', 'rslora', 'dora', 'ia3', 'lokr', 'prompt']

/** mulberry32 → deterministic token ids in [3, 400). */
function ids(seed, n) {
  let s = seed >>> 0
  const out = []
  for (let i = 0; i < n; i++) {
    s = (s + 0x6d2b79f5) >>> 0
    let t = s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    out.push(3 + Math.floor((((t ^ (t >>> 14)) >>> 0) / 4294967296) * 397))
  }
  return out
}

async function loadExperts(rt) {
  for (const name of EXPERTS) await rt.loadExpert(path.join(ADAPTERS, name), { name })
}

/** Streams one request, calling `onChunk(count)` after each chunk; returns tokens, logprobs, result. */
async function stream(session, input, opts, onChunk = () => {}) {
  const tokens = []
  const logprobs = []
  const s = session.generate(input, opts)
  for await (const c of s) {
    tokens.push(c.tokenId)
    logprobs.push(c.logprob)
    onChunk(tokens.length)
  }
  return { tokens, logprobs, result: s.result }
}

/** The request run alone on the cold reference runtime. */
async function alone(ref, input, opts, system) {
  const s = ref.createSession({ system })
  try {
    return await stream(s, input, opts)
  } finally {
    s.dispose()
  }
}

function assertSame(got, want, what) {
  assert.deepEqual(got.tokens, want.tokens.slice(0, got.tokens.length), `${what}: tokens differ from the request run alone`)
  got.logprobs.forEach((l, i) => {
    assert.ok(Math.abs(l - want.logprobs[i]) <= LOGPROB_TOL, `${what} step ${i}: logprob ${l} vs ${want.logprobs[i]} alone`)
  })
}

async function expectCode(p, code) {
  await assert.rejects(p, (e) => {
    assert.equal(e.code, code, `expected ${code}, got ${e.code}: ${e.message}`)
    return true
  })
}

describe('continuous batching', () => {
  let rt, ref
  before(async () => {
    rt = await Runtime.load(MODEL)
    ref = await Runtime.load(MODEL, { kvCache: { prefixCache: false } })
    await loadExperts(rt)
    await loadExperts(ref)
  })
  after(async () => {
    await rt?.dispose()
    await ref?.dispose()
  })

  it('16 concurrent sessions (mixed lengths, experts, maxTokens, cancellations) match each request run alone', async () => {
    const sets = [[], ['lora'], ['dora'], ['ia3'], ['lokr'], ['prompt'], ['lora', 'lora2'], ['rslora']]
    const specs = Array.from({ length: 16 }, (_, i) => ({
      prompt: ids(100 + i, 3 + ((i * 23) % 90)),
      experts: sets[i % sets.length],
      // Four requests are cancelled after their second token (and may run 20).
      maxTokens: i % 4 === 3 ? 20 : 4 + ((i * 7) % 20),
      cancelAfter: i % 4 === 3 ? 2 : null,
    }))
    const solo = []
    for (const sp of specs) solo.push(await alone(ref, { tokens: sp.prompt }, { ...GREEDY, maxTokens: sp.maxTokens, experts: sp.experts }))

    let maxActive = 0
    const watch = () => (maxActive = Math.max(maxActive, rt.stats().activeRequests))
    const runs = specs.map(async (sp) => {
      const session = rt.createSession({ experts: sp.experts })
      const ac = new AbortController()
      const r = await stream(session, { tokens: sp.prompt }, { ...GREEDY, maxTokens: sp.maxTokens, signal: ac.signal }, (n) => {
        watch()
        if (n === sp.cancelAfter) ac.abort()
      })
      session.dispose()
      return r
    })
    const got = await Promise.all(runs)
    let cancelled = 0
    for (const [i, g] of got.entries()) {
      const sp = specs[i]
      assertSame(g, solo[i], `request ${i} (experts [${sp.experts}], ${sp.prompt.length} prompt tokens)`)
      if (g.result.finishReason === 'cancelled') {
        // The engine may run a few steps ahead of the JS consumer before the abort lands; what
        // it produced is a prefix of the request's output alone (checked above).
        assert.ok(sp.cancelAfter && g.tokens.length >= sp.cancelAfter, `request ${i} cancelled unasked`)
        cancelled++
      } else {
        assert.deepEqual(g.tokens, solo[i].tokens, `request ${i}: complete output`)
        assert.equal(g.result.finishReason, solo[i].result.finishReason)
      }
    }
    assert.ok(cancelled >= 2, `${cancelled} of 4 cancellations landed before the request ended`)
    assert.ok(maxActive >= 8, `requests ran together (max ${maxActive} active at once)`)
    assert.equal(rt.stats().activeRequests, 0)
  })

  it('a shared 200-token prefix is evaluated once: the second session computes only its own tokens', async () => {
    const system = ids(7, 200)
    const a = rt.createSession()
    const b = rt.createSession()
    const opts = { ...GREEDY, maxTokens: 8 }
    const first = await stream(a, { tokens: [...system, ...ids(8, 12)] }, opts)
    const hits = rt.stats().prefixCacheHitTokens
    const second = await stream(b, { tokens: [...system, ...ids(9, 10)] }, opts)
    // 12 full blocks are shared and the 8 prefix tokens of the 13th are copied out of the first
    // session's block (copy-on-write): exactly the 200 shared tokens.
    assert.equal(second.result.usage.cachedTokens, 200)
    assert.equal(rt.stats().prefixCacheHitTokens - hits, 200)
    assertSame(second, await alone(ref, { tokens: [...system, ...ids(9, 10)] }, opts), 'second session')
    assert.deepEqual(second.tokens, (await alone(ref, { tokens: [...system, ...ids(9, 10)] }, opts)).tokens)
    // The first session continues on its own blocks, untouched by the second's writes.
    const more = ids(10, 5)
    const cont = await stream(a, { tokens: more }, opts)
    const coldCont = await alone(ref, { tokens: [...system, ...ids(8, 12), ...first.tokens, ...more] }, opts)
    assertSame(cont, coldCont, 'first session, second turn')
    assert.deepEqual(cont.tokens, coldCont.tokens)
    // Under another expert set nothing is shared.
    const c = rt.createSession({ experts: ['lora'] })
    const third = await stream(c, { tokens: [...system, ...ids(9, 10)] }, opts)
    assert.equal(third.result.usage.cachedTokens, 0)
    for (const s of [a, b, c]) s.dispose()
  })

  it('chat sessions with the same system prompt share it', async () => {
    const system = 'You are a terse assistant. ' + 'Answer in one line. '.repeat(30)
    const a = rt.createSession({ system })
    const b = rt.createSession({ system })
    const r1 = await a.complete('Hello robot', { ...GREEDY, maxTokens: 4 })
    const r2 = await b.complete('Read the signs', { ...GREEDY, maxTokens: 4 })
    const sys = rt.tokenize(system, { addSpecialTokens: false }).length
    assert.ok(r2.usage.cachedTokens >= sys, `cachedTokens ${r2.usage.cachedTokens} < ${sys} system tokens`)
    const cold = ref.createSession({ system })
    assert.deepEqual(r2.tokens, (await cold.complete('Read the signs', { ...GREEDY, maxTokens: 4 })).tokens)
    assert.ok(r1.usage.promptTokens > 0)
    for (const s of [a, b, cold]) s.dispose()
  })
})

describe('a KV pool smaller than the sessions need', () => {
  let rt, ref
  const POOL = 256 // 16 blocks of 16
  before(async () => {
    rt = await Runtime.load(MODEL, { kvCache: { maxTokens: POOL, blockSize: 16 } })
    ref = await Runtime.load(MODEL, { kvCache: { prefixCache: false } })
  })
  after(async () => {
    await rt?.dispose()
    await ref?.dispose()
  })

  it('reports its shape', () => {
    const s = rt.stats()
    assert.equal(s.kvBlocksTotal, 16)
    assert.equal(s.kvBlockSize, 16)
    // qwen3-tiny: 3 layers × K and V × 2 KV heads × 32 dims × 4 bytes.
    assert.equal(s.kvBytesPerToken, 3 * 2 * 2 * 32 * 4)
    assert.equal(s.kvBytes, s.kvBlocksUsed * 16 * s.kvBytesPerToken)
  })

  it('runs 8 sessions that need twice the pool: all finish correctly, the bound holds, idle sessions are evicted and resume', async () => {
    // Each request needs 40 + 24 - 1 positions = 4 blocks: at most 4 run at once.
    const specs = Array.from({ length: 8 }, (_, i) => ({ prompt: ids(300 + i, 40), more: ids(400 + i, 6) }))
    const opts = { ...GREEDY, maxTokens: 24 }
    let maxUsed = 0
    const watch = () => {
      const s = rt.stats()
      maxUsed = Math.max(maxUsed, s.kvBlocksUsed)
    }
    const sessions = specs.map(() => rt.createSession())
    const first = await Promise.all(specs.map((sp, i) => stream(sessions[i], { tokens: sp.prompt }, opts, watch)))
    for (const [i, sp] of specs.entries()) {
      const want = await alone(ref, { tokens: sp.prompt }, opts)
      assert.deepEqual(first[i].tokens, want.tokens, `session ${i}, turn 1`)
      assertSame(first[i], want, `session ${i}, turn 1`)
    }
    // (Counted by the engine: a sample of `queuedRequests` taken as chunks arrive can miss the
    // waiting under load.)
    assert.ok(rt.stats().waitedRequests > 0, `some requests waited for blocks: ${JSON.stringify(rt.stats())}`)
    // Second turns: the sessions' earlier blocks were partly evicted by the others.
    const second = await Promise.all(specs.map((sp, i) => stream(sessions[i], { tokens: sp.more }, opts, watch)))
    for (const [i, sp] of specs.entries()) {
      const want = await alone(ref, { tokens: [...sp.prompt, ...first[i].tokens, ...sp.more] }, opts)
      assert.deepEqual(second[i].tokens, want.tokens, `session ${i}, turn 2`)
      assertSame(second[i], want, `session ${i}, turn 2`)
    }
    const s = rt.stats()
    assert.ok(maxUsed <= 16 && s.kvBlocksUsed <= 16, `blocks used ${maxUsed} > 16`)
    assert.ok(s.evictedBlocks > 0, 'idle sessions were evicted')
    for (const x of sessions) x.dispose()
  })

  it('a prompt larger than the whole pool fails with KV_CACHE_EXHAUSTED while another request runs on', async () => {
    const other = rt.createSession()
    const running = stream(other, { tokens: ids(1, 20) }, { ...GREEDY, maxTokens: 12 })
    await expectCode(rt.createSession().complete({ tokens: ids(2, POOL + 10) }, GREEDY), 'KV_CACHE_EXHAUSTED')
    const r = await running
    assert.ok(r.tokens.length > 0)
    assert.deepEqual(r.tokens, (await alone(ref, { tokens: ids(1, 20) }, { ...GREEDY, maxTokens: 12 })).tokens)
  })

  it('a request that outgrows the pool ends with finishReason length at the pool size', async () => {
    const r = await rt.createSession().complete({ tokens: ids(3, POOL - 6) }, { ...GREEDY, maxTokens: 100 })
    if (r.finishReason === 'length') assert.equal(r.usage.completionTokens, 7)
    else assert.ok(r.usage.completionTokens <= 7, 'stopped by EOS before the pool ran out')
  })
})

describe('KV cache options', () => {
  it('rejects bad kvCache options with INVALID_ARGUMENT', async () => {
    await expectCode(Runtime.load(MODEL, { kvCache: { blockSize: 0 } }), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, { kvCache: { maxTokens: 1.5 } }), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, { kvCache: { prefixCache: 'yes' } }), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, { kvCache: 5 }), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, { kvCache: { blockSize: 2048 } }), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, { kvCache: { blockSize: 32, maxTokens: 16 } }), 'INVALID_ARGUMENT')
  })

  it('other block sizes give the same outputs', async () => {
    const rt = await Runtime.load(MODEL, { kvCache: { blockSize: 5, maxTokens: 1000 } })
    const ref = await Runtime.load(MODEL, { kvCache: { prefixCache: false } })
    try {
      assert.equal(rt.stats().kvBlocksTotal, 200)
      const p = ids(77, 33)
      const a = await alone(rt, { tokens: p }, { ...GREEDY, maxTokens: 10 })
      const b = await alone(rt, { tokens: [...p.slice(0, 21), 5, 6] }, { ...GREEDY, maxTokens: 10 })
      assert.deepEqual(a.tokens, (await alone(ref, { tokens: p }, { ...GREEDY, maxTokens: 10 })).tokens)
      assert.deepEqual(b.tokens, (await alone(ref, { tokens: [...p.slice(0, 21), 5, 6] }, { ...GREEDY, maxTokens: 10 })).tokens)
      assert.equal(b.result.usage.cachedTokens, 21)
    } finally {
      await rt.dispose()
      await ref.dispose()
    }
  })

  it('stats() after dispose fails with DISPOSED', async () => {
    const rt = await Runtime.load(MODEL)
    assert.equal(rt.stats().kvBlockSize, 16)
    assert.ok(rt.stats().kvBlocksTotal > 0)
    await rt.dispose()
    assert.throws(() => rt.stats(), (e) => e.code === 'DISPOSED')
  })
})
