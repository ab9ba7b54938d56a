// Structured output through the public API on the tiny f32 fixture: constrained and free
// requests batched together (with and without experts) give exactly what each gives alone,
// and every malformed format, tool or choice is refused with INVALID_ARGUMENT before anything
// runs, without harming the runtime.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import Ajv2020 from 'ajv/dist/2020.js'
import { FIXTURES, LOGPROB_TOL } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const MODEL = path.join(FIXTURES, 'qwen3-tiny')
const ADAPTERS = path.join(FIXTURES, 'adapters')
const ajv = new Ajv2020({ strict: false })

/** Schemas small enough for the fixture's 512-token context (it spells most text byte by byte). */
const SCHEMAS = [
  { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false },
  { type: 'object', properties: { n: { type: 'integer', minimum: -5, maximum: 50 } }, required: ['n'], additionalProperties: false },
  { type: 'array', items: { enum: ['a', 'b', 'c'] }, minItems: 1, maxItems: 3 },
  { enum: ['red', 'green', 'blue', 7, null] },
  { type: 'object', properties: { tag: { type: 'string', pattern: '^[a-z]{1,4}$' }, v: { type: 'number', minimum: 0, maximum: 1 } }, required: ['tag'], additionalProperties: false },
  { $defs: { p: { type: 'object', properties: { x: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['x'], additionalProperties: false } }, type: 'array', items: { $ref: '#/$defs/p' }, maxItems: 2 },
  { anyOf: [{ type: 'integer', minimum: 0, maximum: 99 }, { type: 'boolean' }] },
  { type: 'object', properties: { s: { type: 'string', maxLength: 3 } }, required: ['s'], additionalProperties: false },
]

async function run(session, input, opts) {
  const tokens = []
  const logprobs = []
  const s = session.generate(input, opts)
  for await (const c of s) {
    tokens.push(c.tokenId)
    logprobs.push(c.logprob)
  }
  return { tokens, logprobs, result: s.result }
}

async function expectInvalid(p, pattern) {
  await assert.rejects(p, (e) => {
    assert.equal(e.code, 'INVALID_ARGUMENT', `${e.code}: ${e.message}`)
    if (pattern) assert.match(e.message, pattern)
    return true
  })
}

describe('structured output: batching and refusals', () => {
  let rt, ref
  before(async () => {
    rt = await Runtime.load(MODEL)
    ref = await Runtime.load(MODEL, { kvCache: { prefixCache: false } })
    for (const r of [rt, ref]) for (const name of ['lora', 'dora', 'ia3']) await r.loadExpert(path.join(ADAPTERS, name), { name })
  })
  after(async () => {
    await rt?.dispose()
    await ref?.dispose()
  })

  it('16 concurrent sessions with different schemas, experts or none at all match each request run alone', async () => {
    const expertSets = [[], ['lora'], ['dora'], ['ia3']]
    const specs = Array.from({ length: 16 }, (_, i) => ({
      input: { tokens: [3 + i, 17, 40 + 3 * i, 9] },
      schema: i % 4 === 3 ? null : SCHEMAS[i % SCHEMAS.length],
      opts: {
        experts: expertSets[i % expertSets.length],
        maxTokens: 200,
        // Half greedy, half sampled with a seed (same seed, same draws, batched or not).
        ...(i % 2 === 0 ? { temperature: 0 } : { temperature: 0.9, seed: 1000 + i }),
      },
    }))
    const withFormat = (sp) => ({ ...sp.opts, ...(sp.schema ? { responseFormat: { type: 'json_schema', schema: sp.schema } } : {}) })
    const solo = []
    for (const sp of specs) solo.push(await run(ref.createSession(), sp.input, withFormat(sp)))
    const got = await Promise.all(specs.map((sp) => run(rt.createSession(), sp.input, withFormat(sp))))
    let constrained = 0
    for (const [i, g] of got.entries()) {
      const what = `request ${i} (experts [${specs[i].opts.experts}], ${specs[i].schema ? 'schema' : 'free'})`
      assert.deepEqual(g.tokens, solo[i].tokens, `${what}: tokens differ from the request run alone`)
      g.logprobs.forEach((l, j) => assert.ok(Math.abs(l - solo[i].logprobs[j]) <= LOGPROB_TOL, `${what} step ${j}`))
      if (!specs[i].schema) continue
      constrained++
      assert.equal(g.result.finishReason, 'stop', `${what}: ${JSON.stringify(g.result.text)}`)
      const value = JSON.parse(g.result.text)
      assert.ok(ajv.validate(specs[i].schema, value), `${what}: ${g.result.text} ${ajv.errorsText()}`)
    }
    assert.equal(constrained, 12)
  })

  it('a request cut by maxTokens inside a JSON value ends with length', async () => {
    const r = await rt.createSession().complete({ tokens: [5, 6, 7] }, { temperature: 0, maxTokens: 2, responseFormat: { type: 'json_schema', schema: SCHEMAS[4] } })
    assert.equal(r.finishReason, 'length')
    assert.equal(r.tokens.length, 2)
    assert.throws(() => JSON.parse(r.text))
  })

  it('regex, grammar, json_object and text formats constrain (or not) as asked', async () => {
    const s = rt.createSession()
    const rx = await s.complete({ tokens: [5] }, { temperature: 0.7, seed: 3, maxTokens: 40, responseFormat: { type: 'regex', pattern: '[0-9]{2}-[a-c]{1,3}' } })
    assert.match(rx.text, /^[0-9]{2}-[a-c]{1,3}$/)
    const g = await s.complete({ tokens: [6] }, { temperature: 0.7, seed: 4, maxTokens: 40, responseFormat: { type: 'grammar', grammar: 'start: "x" ("+" "x")*' } })
    assert.match(g.text, /^x(\+x)*$/)
    const o = await s.complete({ tokens: [7] }, { temperature: 0, maxTokens: 300, responseFormat: { type: 'json_object' } })
    if (o.finishReason === 'stop') assert.equal(typeof JSON.parse(o.text), 'object')
    else assert.match(o.text, /^\{/)
    const free = await rt.createSession().complete({ tokens: [8] }, { temperature: 0, maxTokens: 5, responseFormat: { type: 'text' } })
    const plain = await rt.createSession().complete({ tokens: [8] }, { temperature: 0, maxTokens: 5 })
    assert.deepEqual(free.tokens, plain.tokens)
  })

  it('refuses malformed formats, tools and choices with INVALID_ARGUMENT, and keeps serving', async () => {
    const s = rt.createSession()
    const go = (opts) => s.complete('hi', { maxTokens: 2, ...opts })
    const cyclic = { type: 'object' }
    cyclic.properties = { self: cyclic }
    let deep = { type: 'integer' }
    for (let i = 0; i < 5000; i++) deep = { type: 'array', items: deep }
    const cases = [
      [{ responseFormat: { type: 'json_schema', schema: { type: 'integer', minimum: 5, maximum: 1 } } }, /minimum/],
      [{ responseFormat: { type: 'json_schema', schema: { $ref: '#/$defs/nope' } } }],
      [{ responseFormat: { type: 'json_schema', schema: { type: 'wat' } } }],
      [{ responseFormat: { type: 'json_schema' } }, /schema/],
      [{ responseFormat: { type: 'json_schema', schema: 'string' } }, /schema/],
      [{ responseFormat: { type: 'json_schema', schema: cyclic } }, /JSON/],
      [{ responseFormat: { type: 'json_schema', schema: deep } }],
      [{ responseFormat: { type: 'json_schema', schema: { type: 'string', description: 'x'.repeat(2 << 20) } } }, /at most/],
      [{ responseFormat: { type: 'json_schema', schema: { type: 'integer', multipleOf: 0 } } }],
      [{ responseFormat: { type: 'regex', pattern: '(' } }],
      [{ responseFormat: { type: 'regex', pattern: 5 } }, /pattern/],
      [{ responseFormat: { type: 'regex', pattern: '[^\\s\\S]' } }, /no output/],
      [{ responseFormat: { type: 'grammar', grammar: 'start: missing' } }, /missing/],
      [{ responseFormat: { type: 'grammar', grammar: '' } }, /empty/],
      [{ responseFormat: { type: 'xml' } }, /responseFormat.type/],
      [{ responseFormat: null }, /responseFormat/],
      [{ responseFormat: 'json' }, /responseFormat/],
      [{ tools: 'f' }, /tools/],
      [{ tools: [{ type: 'function', function: { name: 'has space' } }] }, /tool name/],
      [{ tools: [{ type: 'function', function: { name: 'x'.repeat(65) } }] }, /tool name/],
      [{ tools: [{ type: 'function', function: { name: 'f' } }, { type: 'function', function: { name: 'f' } }] }, /twice/],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: 3 } }] }, /parameters/],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'integer', minimum: 3, maximum: 1 } } }], toolChoice: 'required' }],
      [{ tools: [{ type: 'other', function: { name: 'f' } }] }, /type: 'function'/],
      [{ tools: Array.from({ length: 129 }, (_, i) => ({ type: 'function', function: { name: `f${i}` } })) }, /at most 128/],
      [{ toolChoice: 'required' }, /needs tools/],
      [{ tools: [{ type: 'function', function: { name: 'f' } }], toolChoice: { type: 'function', function: { name: 'g' } } }, /not among/],
      [{ tools: [{ type: 'function', function: { name: 'f' } }], toolChoice: 'sometimes' }, /toolChoice/],
      [{ tools: [{ type: 'function', function: { name: 'f' } }], toolChoice: 'required', responseFormat: { type: 'json_object' } }, /cannot be combined/],
      [{ parallelToolCalls: 'yes' }, /parallelToolCalls/],
    ]
    for (const [opts, pattern] of cases) {
      await expectInvalid(go(opts), pattern)
    }
    await expectInvalid(s.complete([{ role: 'assistant', content: '', toolCalls: [{ id: 1 }] }]), /tool call/)
    await expectInvalid(s.complete([{ role: 'tool', content: 'x', toolCallId: 5 }]), /toolCallId/)
    // Still serving, and the session was never left busy.
    const r = await s.complete({ tokens: [5] }, { temperature: 0, maxTokens: 3 })
    assert.equal(r.tokens.length, 3)
  })
})
