// Speculative decoding (`speculative: { type: 'ngram' }`): drafts copied from the context are
// checked as extra rows of the request's pass and kept while they equal what sampling picks, so
// the output must be exactly plain decoding's. On the tiny fixtures, every PEFT case still
// matches its reference with speculation on; on SmolLM2 (an integer Q8_0 kernel, so a row's
// logits do not depend on the rows beside it) greedy and seeded outputs are bit-identical to
// plain decoding alone, in a batch, across turns, and where maxTokens or a stop string ends
// the answer inside a run of accepted drafts.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { smolLM2OrSkip } from '../scripts/assets.mjs'
import { coded, collect, FIXTURES, fixtureJson, GREEDY, LOGPROB_TOL } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const NGRAM = { type: 'ngram' }
// Single-token matches: drafts on nearly every step, the harshest check of the bookkeeping.
const EAGER = { type: 'ngram', ngram: 1, minNgram: 1, maxDraft: 4 }

const trace = ({ chunks }) => chunks.map((c) => [c.tokenId, c.logprob, (c.topLogprobs ?? []).map((t) => [t.tokenId, t.logprob])])

describe('speculative decoding on the fixtures', () => {
  const REF = fixtureJson('adapters', 'reference.json')

  it('every PEFT case keeps its greedy tokens and logprobs, with drafts checked and accepted', async () => {
    const byBase = {}
    for (const [name, c] of Object.entries(REF.cases)) (byBase[c.base] ??= []).push([name, c])
    let drafted = 0
    let accepted = 0
    for (const [base, cases] of Object.entries(byBase)) {
      const rt = await Runtime.load(path.join(FIXTURES, base))
      try {
        for (const n of new Set(cases.flatMap(([, c]) => c.experts))) await rt.loadExpert(path.join(FIXTURES, 'adapters', n), { name: n })
        for (const [name, c] of cases) {
          const s = rt.createSession()
          const { chunks, result } = await collect(
            s.generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: c.steps.length, experts: c.experts, speculative: EAGER }),
          )
          s.dispose()
          assert.deepEqual(chunks.map((x) => x.tokenId), c.steps.map((x) => x.token), `${name}: greedy tokens`)
          chunks.forEach((x, i) => assert.ok(Math.abs(x.logprob - c.steps[i].logprob) <= LOGPROB_TOL, `${name} step ${i}: ${x.logprob} vs ${c.steps[i].logprob}`))
          assert.equal(result.finishReason, 'length')
          assert.ok(result.usage.acceptedDraftTokens <= result.usage.draftTokens)
          drafted += result.usage.draftTokens
          accepted += result.usage.acceptedDraftTokens
        }
      } finally {
        await rt.dispose()
      }
    }
    assert.ok(drafted > 0 && accepted > 0, `drafts were checked (${drafted}) and some accepted (${accepted})`)
  })

  it('refuses malformed options with INVALID_ARGUMENT', async () => {
    const rt = await Runtime.load(path.join(FIXTURES, 'qwen3-tiny'))
    try {
      const s = rt.createSession()
      const bad = [
        'ngram',
        null,
        [],
        {},
        { type: 'lookahead' },
        { type: 'draft' },
        { type: 'draft', model: null },
        { type: 'ngram', maxDraft: 0 },
        { type: 'ngram', maxDraft: 65 },
        { type: 'ngram', maxDraft: -1 },
        { type: 'ngram', maxDraft: 1.5 },
        { type: 'ngram', maxDraft: 2 ** 40 },
        { type: 'ngram', maxDraft: Number.NaN },
        { type: 'ngram', ngram: 0 },
        { type: 'ngram', ngram: 17 },
        { type: 'ngram', ngram: 2, minNgram: 3 },
        { type: 'ngram', minNgram: 0 },
        { type: 'ngram', draftModel: 'x' },
      ]
      for (const speculative of bad) {
        await assert.rejects(s.complete({ tokens: [1, 2, 3] }, { maxTokens: 2, speculative }), coded('INVALID_ARGUMENT'), JSON.stringify(speculative))
      }
      // The session still works afterwards.
      const r = await s.complete({ tokens: [1, 2, 3] }, { ...GREEDY, maxTokens: 3, speculative: NGRAM })
      assert.equal(r.usage.completionTokens, 3)
    } finally {
      await rt.dispose()
    }
  })
})

describe('speculative decoding with a draft model', () => {
  const QWEN3 = path.join(FIXTURES, 'qwen3-tiny')
  const REF = fixtureJson('qwen3-tiny', 'reference.json')
  let rt, same, other
  before(async () => {
    rt = await Runtime.load(QWEN3)
    same = await Runtime.load(QWEN3) // the same weights: its drafts are the target's own tokens
    other = await Runtime.load(path.join(FIXTURES, 'llama-tiny')) // same tokenizer, other weights
  })
  after(async () => {
    await Promise.all([rt?.dispose(), same?.dispose(), other?.dispose()])
  })

  const cases = () => [['f32 reference', { prompt_ids: REF.prompt_ids, steps: REF.f32.steps }]]

  it('gives the HF reference tokens with drafts from the same model (nearly all kept) and from another (few kept)', async () => {
    assert.ok(cases().length > 0, 'the reference has cases')
    for (const [model, minKept] of [[same, 0.9], [other, 0]]) {
      let drafted = 0
      let kept = 0
      for (const [name, c] of cases()) {
        const s = rt.createSession()
        const { chunks, result } = await collect(s.generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: c.steps.length, speculative: { type: 'draft', model, maxDraft: 4 } }))
        s.dispose()
        assert.deepEqual(chunks.map((x) => x.tokenId), c.steps.map((x) => x.token), `${name}: greedy tokens`)
        chunks.forEach((x, i) => assert.ok(Math.abs(x.logprob - c.steps[i].logprob) <= LOGPROB_TOL, `${name} step ${i}`))
        drafted += result.usage.draftTokens
        kept += result.usage.acceptedDraftTokens
      }
      assert.ok(drafted > 0, 'drafts were proposed')
      assert.ok(kept >= minKept * drafted, `${kept} of ${drafted} drafts kept`)
      if (model === other) assert.ok(kept < drafted, 'another model is sometimes wrong')
    }
    // Longer than the reference: the same tokens as plain decoding.
    const plain = await rt.createSession().complete({ tokens: REF.prompt_ids }, { ...GREEDY, maxTokens: 80 })
    for (const model of [same, other]) {
      const r = await rt.createSession().complete({ tokens: REF.prompt_ids }, { ...GREEDY, maxTokens: 80, speculative: { type: 'draft', model } })
      assert.deepEqual(r.tokens, plain.tokens)
    }
  })

  it('refuses a draft model with another vocabulary, a disposed one, and misplaced fields', async () => {
    const s = rt.createSession()
    const gone = await Runtime.load(QWEN3)
    await gone.dispose()
    await assert.rejects(s.complete({ tokens: [1, 2, 3] }, { maxTokens: 2, speculative: { type: 'draft', model: gone } }), coded('DISPOSED'))
    for (const speculative of [
      { type: 'draft' },
      { type: 'draft', model: {} },
      { type: 'draft', model: 'qwen3-tiny' },
      { type: 'ngram', model: same },
      { type: 'draft', model: same, ngram: 2 },
      { type: 'draft', model: same, maxDraft: 0 },
    ]) {
      await assert.rejects(s.complete({ tokens: [1, 2, 3] }, { maxTokens: 2, speculative }), coded('INVALID_ARGUMENT'), String(speculative.type))
    }
    const { modelPath, skip } = smolLM2OrSkip()
    if (!skip) {
      const big = await Runtime.load(modelPath, { threads: 2 })
      try {
        await assert.rejects(s.complete({ tokens: [1, 2, 3] }, { maxTokens: 2, speculative: { type: 'draft', model: big } }), (e) => coded('INVALID_ARGUMENT')(e) && /vocabulary/.test(e.message))
      } finally {
        await big.dispose()
      }
    }
    assert.equal((await s.complete({ tokens: [1, 2, 3] }, { ...GREEDY, maxTokens: 3, speculative: { type: 'draft', model: same } })).usage.completionTokens, 3)
  })
})

const { modelPath, skip } = smolLM2OrSkip()

describe('speculative decoding on SmolLM2', { skip }, () => {
  let rt
  before(async () => {
    rt = await Runtime.load(modelPath, { threads: 2 })
  })
  after(async () => rt?.dispose())

  const CODE = `function totalPrice(items, taxRate) {
  let subtotal = 0
  for (const item of items) {
    if (item.quantity <= 0) continue
    subtotal += item.price * item.quantity
  }
  const tax = subtotal * taxRate
  return Math.round((subtotal + tax) * 100) / 100
}`
  const EDIT = `Rewrite this JavaScript function, renaming the variable subtotal to net. Output only the code.\n\n${CODE}`

  async function once(input, opts) {
    const s = rt.createSession()
    try {
      return await collect(s.generate(input, opts))
    } finally {
      s.dispose()
    }
  }

  it('greedy: identical tokens, logprobs and top logprobs, many tokens from accepted drafts', async () => {
    const opts = { ...GREEDY, maxTokens: 120, topLogprobs: 3 }
    const plain = await once(EDIT, opts)
    for (const speculative of [NGRAM, EAGER]) {
      const spec = await once(EDIT, { ...opts, speculative })
      assert.deepEqual(trace(spec), trace(plain), JSON.stringify(speculative))
      assert.equal(spec.result.text, plain.result.text)
      const u = spec.result.usage
      assert.ok(u.acceptedDraftTokens * 3 > u.completionTokens, `a third of the tokens came from drafts: ${JSON.stringify(u)}`)
      assert.equal(plain.result.usage.draftTokens, 0)
    }
  })

  it('seeded sampling: the same tokens with and without drafts', async () => {
    const opts = { temperature: 0.4, topP: 0.95, seed: 1234, maxTokens: 80, repetitionPenalty: 1.05 }
    const plain = await once(EDIT, opts)
    const spec = await once(EDIT, { ...opts, speculative: EAGER })
    assert.deepEqual(trace(spec), trace(plain))
    assert.ok(spec.result.usage.acceptedDraftTokens > 0, JSON.stringify(spec.result.usage))
  })

  it('inside a batch of plain and speculative sessions, each answer is its answer alone', async () => {
    const questions = [EDIT, 'Name three planets.', EDIT.replace('subtotal to net', 'items to lines'), 'Why is the sea salty?']
    const opts = { ...GREEDY, maxTokens: 60 }
    const alone = []
    for (const q of questions) alone.push(trace(await once(q, opts)))
    const runs = await Promise.all(questions.flatMap((q) => [once(q, opts), once(q, { ...opts, speculative: EAGER })]))
    runs.forEach((r, i) => assert.deepEqual(trace(r), alone[i >> 1], `question ${i >> 1}, ${i % 2 ? 'speculative' : 'plain'}`))
  })

  it('maxTokens and stop strings end the answer inside a run of accepted drafts', async () => {
    const plain = await once(EDIT, { ...GREEDY, maxTokens: 120 })
    for (const maxTokens of [1, 2, 5, 17, 33]) {
      const r = await once(EDIT, { ...GREEDY, maxTokens, speculative: EAGER })
      assert.equal(r.result.usage.completionTokens, Math.min(maxTokens, plain.chunks.length))
      assert.deepEqual(trace(r), trace(plain).slice(0, maxTokens), `maxTokens ${maxTokens}`)
    }
    const stop = 'quantity'
    assert.ok(plain.result.text.includes(stop), plain.result.text)
    const withStop = await once(EDIT, { ...GREEDY, maxTokens: 120, stop: [stop] })
    const specStop = await once(EDIT, { ...GREEDY, maxTokens: 120, stop: [stop], speculative: EAGER })
    assert.equal(specStop.result.text, withStop.result.text)
    assert.equal(specStop.result.finishReason, 'stop')
    assert.deepEqual(trace(specStop), trace(withStop))
  })

  it('a conversation continues from the right cache after speculative turns', async () => {
    const turns = [EDIT, 'Now rename items to lines as well.', 'Add a comment above the loop.']
    const run = async (speculative) => {
      const s = rt.createSession()
      const out = []
      try {
        for (const t of turns) {
          const r = await collect(s.generate(t, { ...GREEDY, maxTokens: 70, speculative }))
          out.push(trace(r))
          if (speculative) assert.ok(r.result.usage.cachedTokens > 0 || out.length === 1)
        }
      } finally {
        s.dispose()
      }
      return out
    }
    assert.deepEqual(await run(EAGER), await run(undefined))
  })
})
