// The expert router and embeddings on a real model: SmolLM2-135M-Instruct with its two trained
// experts (experts/sql-smollm2, experts/shell-smollm2), routed over the labelled queries in
// fixtures/routing-queries.json (written for this test: SQL, shell, both, generic and tricky
// ones). Accuracy is printed per class; the queries marked `heldOut` were kept out of tuning the
// router's default weights and threshold and are reported separately.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { smolLM2OrSkip } from '../scripts/assets.mjs'
import { fixtureJson } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const ROOT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..')
const QUERIES = fixtureJson('routing-queries.json').queries
const SQL = /^\s*SELECT\b[^;]*\bFROM\s+(users|orders|products)\b[^;]*;\s*$/i
const { modelPath, skip } = smolLM2OrSkip()

const same = (a, b) => JSON.stringify([...a].sort()) === JSON.stringify([...b].sort())

describe('router on SmolLM2 with the sql and shell experts', { skip }, () => {
  let rt
  before(async () => {
    rt = await Runtime.load(modelPath, { threads: 2 })
    await rt.loadExpert(path.join(ROOT, 'experts', 'sql-smollm2'))
    await rt.loadExpert(path.join(ROOT, 'experts', 'shell-smollm2'))
  })
  after(() => rt?.dispose())

  it('routes the labelled queries: ≥ 90% overall, generic ≥ 95% to the base model', async () => {
    const tally = {}
    const misses = []
    for (const q of QUERIES) {
      const d = await rt.route(q.query)
      const key = q.heldOut ? 'held out' : q.class
      const t = (tally[key] ??= { ok: 0, n: 0 })
      const all = (tally.all ??= { ok: 0, n: 0 })
      const cls = q.heldOut ? (tally[`${q.class} (all)`] ??= { ok: 0, n: 0 }) : null
      const ok = same(d.experts, q.experts)
      for (const x of [t, all, cls, q.heldOut ? null : (tally['tuned'] ??= { ok: 0, n: 0 })]) {
        if (x) (x.ok += ok, x.n++)
      }
      if (q.class === 'generic' && q.heldOut) (tally['generic (all)'] ??= { ok: 0, n: 0 })
      if (!ok) misses.push(`${q.class}${q.heldOut ? ' (held out)' : ''}: "${q.query}" → [${d.experts}] want [${q.experts}] — ${d.reason}`)
    }
    const byClass = {}
    for (const q of QUERIES) {
      const c = (byClass[q.class] ??= { ok: 0, n: 0 })
      c.n++
      c.ok += misses.every((m) => !m.includes(`"${q.query}"`))
    }
    const pct = ({ ok, n }) => `${ok}/${n} (${((100 * ok) / n).toFixed(0)}%)`
    console.log('routing accuracy by class:', Object.entries(byClass).map(([k, v]) => `${k} ${pct(v)}`).join(', '))
    console.log(`tuned on: ${pct(tally.tuned)}; held out: ${pct(tally['held out'])}; overall: ${pct(tally.all)}`)
    for (const m of misses) console.log('  miss:', m)
    assert.ok(QUERIES.length >= 40 && tally['held out'].n >= 10)
    assert.ok(tally.all.ok / tally.all.n >= 0.9, `overall ${pct(tally.all)}`)
    assert.ok(byClass.generic.ok / byClass.generic.n >= 0.95, `generic ${pct(byClass.generic)}`)
  })

  it('explains each decision: scores, hits, similarity and a reason', async () => {
    const d = await rt.route('Write a SQL query that counts users by city.')
    assert.deepEqual(d.experts, ['sql'])
    assert.equal(d.generic, false)
    const sql = d.scores.find((s) => s.name === 'sql')
    assert.deepEqual(sql.keywordHits.sort(), ['query', 'sql', 'users'])
    assert.deepEqual(sql.excludeHits, [])
    assert.ok(sql.similarity > -1 && sql.similarity <= 1)
    assert.equal(typeof d.genericSimilarity, 'number')
    assert.equal(d.scores[0].name, 'sql', 'best first')
    assert.match(d.reason, /^chose sql \(score [\d.]+; keywords .*sql/)

    const g = await rt.route('hello, how are you?')
    assert.deepEqual(g.experts, [])
    assert.equal(g.generic, true)
    assert.match(g.reason, /^base model: a generic query/)

    // Chat input routes on the last user message; historyTurns adds earlier user turns.
    const chat = [
      { role: 'user', content: 'I need to clean up my disk.' },
      { role: 'assistant', content: 'Sure.' },
      { role: 'user', content: 'thanks!' },
    ]
    assert.deepEqual((await rt.route(chat)).experts, [])
    const withHistory = await rt.route(chat, { historyTurns: 1 })
    assert.equal(withHistory.generic, true, 'the generic rules see the joined text')
  })

  it("experts: 'auto' turns a database question into SQL and leaves a greeting to the base model", async () => {
    const s = rt.createSession({ experts: 'auto' })
    assert.equal(s.experts, 'auto')
    const q = await s.complete("How many orders have status 'shipped'?", { temperature: 0, maxTokens: 48 })
    assert.deepEqual(q.experts, ['sql'])
    assert.match(q.text, SQL, q.text)
    assert.deepEqual(q.routing.experts, ['sql'])
    const hello = await s.complete('hello, how are you?', { temperature: 0, maxTokens: 24 })
    assert.deepEqual(hello.experts, [])
    assert.doesNotMatch(hello.text, /\bSELECT\b/)
    assert.match(hello.routing.reason, /generic/)
    s.dispose()

    // Per request, on a session with a fixed set; and a fixed set reports itself.
    const t = rt.createSession()
    const sh = await t.complete('Show the disk usage of my home directory.', { temperature: 0, maxTokens: 32, experts: 'auto' })
    assert.deepEqual(sh.experts, ['shell'])
    assert.match(sh.text.trim(), /^du\b/, sh.text)
    const fixed = await t.complete('hi', { temperature: 0, maxTokens: 4, experts: ['sql'] })
    assert.deepEqual(fixed.experts, ['sql'])
    assert.equal(fixed.routing, undefined)
    t.dispose()
  })

  it('embeddings: one unit vector per text, hiddenSize long, nearer for related texts', async () => {
    const [a, b, c] = await rt.embed(['How many users live in Paris?', 'Count the users from London.', 'Tell me a joke.'], { pooling: 'last' })
    assert.equal(a.length, rt.info.hiddenSize)
    assert.ok(a instanceof Float32Array)
    const dot = (x, y) => x.reduce((s, v, i) => s + v * y[i], 0)
    assert.ok(Math.abs(dot(a, a) - 1) < 1e-4)
    assert.ok(dot(a, b) > dot(a, c), 'related questions are nearer than unrelated ones')
    const raw = await rt.embed(['How many users live in Paris?'], { normalize: false })
    assert.ok(Math.abs(dot(raw[0], raw[0]) - 1) > 1e-2, 'normalize: false keeps the length')
    const under = await rt.embed(['How many users live in Paris?'], { experts: ['sql'], pooling: 'last' })
    assert.ok(Math.abs(dot(under[0], a) - 1) > 1e-4, 'an expert changes the embedding')
  })
})

describe('router input checks (no experts loaded)', { skip }, () => {
  let rt
  before(async () => {
    rt = await Runtime.load(modelPath, { threads: 2 })
  })
  after(() => rt?.dispose())

  it('refuses bad input with typed errors and routes to the base without routable experts', async () => {
    const bad = [
      () => rt.embed('text'),
      () => rt.embed([1]),
      () => rt.embed(['a'], { pooling: 'max' }),
      () => rt.embed(['a'], { normalise: true }),
      () => rt.embed(['a'], { experts: 'sql' }),
      () => rt.route(42),
      () => rt.route('x', { turns: 1 }),
      () => rt.route('x', { historyTurns: -1 }),
    ]
    for (const f of bad) await assert.rejects(f, { code: 'INVALID_ARGUMENT' })
    await assert.rejects(() => rt.embed(['a'], { experts: ['nope'] }), { code: 'EXPERT_NOT_FOUND' })
    await assert.rejects(() => rt.embed(['']), { code: 'INVALID_ARGUMENT' }, 'an empty text has no tokens')
    assert.deepEqual(await rt.embed([]), [])
    for (const f of [
      () => rt.setRouter({ threshold: NaN }),
      () => rt.setRouter({ maxExperts: 0 }),
      () => rt.setRouter({ genericPatterns: ['('] }),
      () => rt.setRouter({ weights: { keyword: 1 } }),
      () => rt.setRouter({ speed: 1 }),
      () => rt.setRouter(null),
    ]) assert.throws(f, { code: 'INVALID_ARGUMENT' })

    const d = await rt.route('How many orders shipped last week?')
    assert.deepEqual(d.experts, [])
    assert.match(d.reason, /no experts are loaded/)
    const s = rt.createSession({ experts: 'auto' })
    const r = await s.complete('How many orders shipped last week?', { maxTokens: 2 })
    assert.deepEqual(r.experts, [])
    assert.match(r.routing.reason, /no experts are loaded/)
    const e = await rt.route('')
    assert.deepEqual(e.experts, [])
    s.dispose()
  })

  it('setRouter tunes and reads back; patterns are data', async () => {
    const before = rt.router
    assert.equal(before.threshold, 0.5)
    assert.deepEqual(before.weights, { keywords: 1, similarity: 2 })
    assert.ok(before.genericPatterns.length > 3)
    rt.setRouter({ genericPatterns: ['^ahoy\\b'], maxExperts: 1 })
    assert.deepEqual(rt.router.genericPatterns, ['^ahoy\\b'])
    assert.equal(rt.router.maxExperts, 1)
    assert.equal(rt.router.threshold, 0.5, 'fields left out keep their values')
    assert.equal((await rt.route('ahoy there, sailor')).generic, true)
    assert.equal((await rt.route('hello there, sailor')).generic, false)
    rt.setRouter({ genericPatterns: before.genericPatterns, maxExperts: before.maxExperts })
  })
})
