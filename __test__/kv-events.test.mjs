// KV events over ZeroMQ (issue 53): a subscriber decodes vLLM's EventBatch (msgpack, tagged
// arrays) and finds a request's prompt blocks as BlockStored events, chained by parent hash,
// with their token ids; blocks the pool recycles come back as BlockRemoved, each for a block
// stored before; and a subscriber that never reads does not stall generation.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { fixture, GREEDY } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const { createServer } = require('../dist/server/index.js')
const zmq = require('zeromq')
const { decode } = require('@msgpack/msgpack')

const ids = (seed, n) => Array.from({ length: n }, (_, i) => 5 + ((seed * 31 + i * 17) % 90))
const run = async (rt, tokens, maxTokens = 4) => rt.createSession().complete({ tokens }, { ...GREEDY, maxTokens })

/** Receives until `done(events)` or `tries` receive timeouts; returns every decoded event. */
async function collect(sub, state, done, tries = 20) {
  for (let i = 0; i < tries && !done(state.events); i++) {
    let frames
    try {
      frames = await sub.receive()
    } catch (e) {
      if (e.code === 'EAGAIN') continue
      throw e
    }
    const [topic, seq, payload] = frames
    assert.equal(String(topic), state.topic)
    const n = seq.readBigUInt64BE(0)
    if (state.seq !== undefined) assert.equal(n, state.seq + 1n, 'sequence numbers follow each other')
    state.seq = n
    const [ts, events] = decode(payload)
    assert.ok(Math.abs(ts - Date.now() / 1000) < 60, `ts ${ts}`)
    state.events.push(...events)
  }
  return state.events
}

describe('KV events over ZeroMQ', () => {
  let rt, server, sub, state
  before(async () => {
    // 10 blocks of 16: a few prompts make the pool recycle cached blocks.
    rt = await Runtime.load(fixture('qwen3-tiny'), { kvCache: { maxTokens: 160 } })
    server = createServer(rt, { modelName: 'tiny', kvEvents: { endpoint: 'tcp://127.0.0.1:*', topic: 'kv@test@tiny', intervalMs: 5 } })
    await server.listen(0, '127.0.0.1')
    await server.kvEventsReady
    sub = new zmq.Subscriber({ receiveTimeout: 200 })
    sub.connect(server.kvEvents.boundEndpoint)
    sub.subscribe('kv@test@tiny')
    state = { topic: 'kv@test@tiny', events: [], seq: undefined }
    // The subscription takes a moment to reach the publisher: requests until an event arrives.
    for (let i = 0; i < 25 && state.events.length === 0; i++) {
      await run(rt, ids(100 + i, 20))
      await collect(sub, state, (e) => e.length > 0, 2)
    }
    assert.ok(state.events.length > 0, 'the subscriber receives events')
  })
  after(async () => {
    sub?.close()
    await server?.close()
    await rt?.dispose()
  })

  it('a request\'s prompt blocks arrive as BlockStored, chained, with their tokens', async () => {
    state.seen = state.events.filter((e) => e[0] === 'BlockStored').map((e) => e[1][0])
    state.events = []
    const prompt = ids(1, 70)
    await run(rt, prompt)
    const mine = (e) => e[0] === 'BlockStored' && prompt.slice(0, 16).every((t, i) => e[3][i] === t)
    const events = await collect(sub, state, (ev) => ev.filter((e) => e[0] === 'BlockStored').length >= 4 && ev.some(mine))
    const stored = events.filter((e) => e[0] === 'BlockStored')
    const first = stored.findIndex(mine)
    assert.ok(first >= 0, JSON.stringify(events).slice(0, 300))
    const chain = stored.slice(first, first + 4)
    for (const [k, e] of chain.entries()) {
      const [tag, hashes, parent, tokens, blockSize, loraId, medium] = e
      assert.equal(tag, 'BlockStored')
      assert.equal(hashes.length, 1)
      assert.ok(Number.isSafeInteger(Number(hashes[0])))
      assert.equal(parent, k === 0 ? null : chain[k - 1][1][0], `block ${k}'s parent`)
      assert.deepEqual(tokens, prompt.slice(16 * k, 16 * k + 16))
      assert.equal(blockSize, 16)
      assert.equal(loraId, null)
      assert.equal(medium, null)
    }
    state.chain = chain.map((e) => e[1][0])
  })

  it('blocks the pool recycles come back as BlockRemoved, each stored before', async () => {
    const storedSoFar = new Set([...state.seen, ...state.events.filter((e) => e[0] === 'BlockStored').map((e) => e[1][0])])
    for (const h of state.chain) storedSoFar.add(h)
    state.events = []
    // Three other 70-token prompts need the whole pool: the first prompt's cached blocks go.
    for (const seed of [2, 3, 4]) await run(rt, ids(seed, 70))
    const events = await collect(sub, state, (ev) => state.chain.every((h) => ev.some((e) => e[0] === 'BlockRemoved' && e[1][0] === h)))
    const removed = events.filter((e) => e[0] === 'BlockRemoved').map((e) => e[1][0])
    for (const h of state.chain) assert.ok(removed.includes(h), `block ${h} was removed`)
    for (const e of events) if (e[0] === 'BlockStored') storedSoFar.add(e[1][0])
    // Hashes grow with each block stored: those below the first the subscriber saw were
    // stored before it had joined.
    const firstSeen = Math.min(...[...storedSoFar].map(Number))
    for (const h of removed) assert.ok(storedSoFar.has(h) || Number(h) < firstSeen, `removed ${h} was stored before`)
    assert.equal(new Set(removed).size, removed.length, 'each removed once')
    assert.equal(rt.stats().kvEventsDropped, 0)
  })

  it('a subscriber that never reads, or none at all, does not stall generation', async () => {
    const lazy = new zmq.Subscriber({ receiveHighWaterMark: 1 })
    lazy.connect(server.kvEvents.boundEndpoint)
    lazy.subscribe('')
    const sentBefore = server.kvEvents.sent
    for (let i = 0; i < 20; i++) await run(rt, ids(200 + i, 40), 8)
    assert.ok(server.kvEvents.sent > sentBefore, 'batches kept going out')
    lazy.close()
    // No subscriber and a runtime whose events are never taken: the queue is bounded.
    const alone = await Runtime.load(fixture('qwen3-tiny'))
    try {
      alone.startKvEvents()
      for (let i = 0; i < 5; i++) await run(alone, ids(300 + i, 70))
      assert.ok(alone.takeKvEvents(1 << 20).length > 0)
      assert.equal(alone.stats().kvEventsDropped, 0)
    } finally {
      await alone.dispose()
    }
  })

  it('a socket that cannot be bound rejects kvEventsReady; the HTTP side still serves', async () => {
    const taken = createServer(rt, { kvEvents: { endpoint: server.kvEvents.boundEndpoint } })
    const { port } = await taken.listen(0, '127.0.0.1')
    await assert.rejects(taken.kvEventsReady, /Address already in use|EADDRINUSE|in use/i)
    assert.equal((await fetch(`http://127.0.0.1:${port}/health`)).status, 200)
    await taken.close()
  })

  it('refuses bad kvEvents options', () => {
    for (const bad of [null, 'tcp://x:1', {}, { endpoint: 'udp://127.0.0.1:5' }, { endpoint: 'tcp://127.0.0.1:99999' }, { endpoint: 'tcp://127.0.0.1:0' },
      { endpoint: 'tcp://a b:5' }, { endpoint: 'tcp://127.0.0.1:5', topic: 5 }, { endpoint: 'tcp://127.0.0.1:5', intervalMs: 0 }]) {
      assert.throws(() => createServer(rt, { kvEvents: bad }), /kvEvents/, JSON.stringify(bad))
    }
  })
})
