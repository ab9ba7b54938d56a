// Every options object of the API refuses a key it does not know (a misspelt option used to be
// ignored: `complete('hi', { maxToken: 5 })` ran to the end of the answer) with
// INVALID_ARGUMENT naming the key and the known key nearest to it, or every known key when none
// is close; user data inside options (JSON schemas, tool parameters, chat messages) may carry
// any keys. Integer options say one thing for every value out of range.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { coded, fixture } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime, fetchModel } = require('../dist/index.js')

const MODEL = fixture('qwen3-tiny')

/** An assert.rejects / assert.throws matcher: INVALID_ARGUMENT whose message matches `pattern`. */
const refused = (pattern) => (e) => coded('INVALID_ARGUMENT')(e) && (assert.match(e.message, pattern), true)

/** The message refusing `key` of `what` in favour of `near`. */
const suggests = (what, key, near, noun = 'option') => new RegExp(`^${what}: unknown ${noun} '${key}' \\(did you mean '${near}'\\?\\)$`)

describe('unknown option keys', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(MODEL, { threads: 2 })
  })
  after(() => rt?.dispose())

  it("complete / generate: 'maxToken' names 'maxTokens', and nothing runs", async () => {
    const s = rt.createSession()
    await assert.rejects(s.complete('hi', { maxToken: 5 }), refused(suggests('complete', 'maxToken', 'maxTokens')))
    // snake_case and case slips find the option too; a key near nothing lists them all.
    await assert.rejects(s.complete('hi', { max_tokens: 5 }), refused(suggests('complete', 'max_tokens', 'maxTokens')))
    await assert.rejects(s.complete('hi', { Temperature: 0 }), refused(suggests('complete', 'Temperature', 'temperature')))
    await assert.rejects(s.complete('hi', { ignoreEos: true }), refused(/^complete: unknown option 'ignoreEos' \(known options: maxTokens, temperature, .*speculative\)$/))
    const stream = s.generate('hi', { maxTokns: 5 })
    await assert.rejects(async () => {
      for await (const _ of stream) {
        /* refused before the first chunk */
      }
    }, refused(suggests('generate', 'maxTokns', 'maxTokens')))
    // Nothing ran: the session has no turn and is free. Chat messages are data, not options:
    // they keep their extra (OpenAI) fields.
    assert.deepEqual(s.history, [])
    const r = await s.complete([{ role: 'user', content: 'hi', name: 'ann', refusal: null }], { maxTokens: 2, temperature: 0 })
    assert.equal(r.usage.completionTokens, 2)
  })

  it('generate: speculative', async () => {
    const s = rt.createSession()
    await assert.rejects(s.complete('hi', { maxTokens: 2, speculative: { type: 'ngram', maxDraf: 4 } }), refused(suggests('speculative', 'maxDraf', 'maxDraft')))
  })

  it('generate: responseFormat (a field of another type too), but not inside its schema', async () => {
    const s = rt.createSession()
    await assert.rejects(s.complete('hi', { maxTokens: 2, responseFormat: { type: 'regex', patern: 'a+' } }), refused(suggests('responseFormat', 'patern', 'pattern', 'field')))
    await assert.rejects(
      s.complete('hi', { maxTokens: 2, responseFormat: { type: 'json_object', schema: { type: 'object' } } }),
      refused(/^responseFormat: unknown field 'schema' \(known fields: type\)$/),
    )
    // The schema is the caller's data: its keywords are the engine's to read, not option keys.
    const schema = { type: 'object', title: 'T', description: 'd', properties: { a: { type: 'integer', minimum: 0 } }, required: ['a'], additionalProperties: false }
    const r = await s.complete('hi', { maxTokens: 40, temperature: 0, responseFormat: { type: 'json_schema', schema, name: 'a', strict: true } })
    assert.ok(['stop', 'length'].includes(r.finishReason))
  })

  it('generate: tools and their function, but not inside parameters', async () => {
    const s = rt.createSession()
    const parameters = { type: 'object', title: 'P', properties: { city: { type: 'string', description: 'a name' } }, required: ['city'] }
    await assert.rejects(
      s.complete('hi', { maxTokens: 2, tools: [{ type: 'function', function: { name: 'f', paramters: parameters } }] }),
      refused(suggests('tools\\[0\\]\\.function', 'paramters', 'parameters', 'field')),
    )
    await assert.rejects(
      s.complete('hi', { maxTokens: 2, tools: [{ type: 'function', function: { name: 'f' } }, { type: 'function', funtion: {}, function: { name: 'g' } }] }),
      refused(suggests('tools\\[1\\]', 'funtion', 'function', 'field')),
    )
    const r = await s.complete('hi', { maxTokens: 2, temperature: 0, tools: [{ type: 'function', function: { name: 'f', description: 'd', parameters, strict: true } }] })
    assert.equal(r.usage.completionTokens > 0, true)
  })

  it('generate: toolChoice', async () => {
    const s = rt.createSession()
    const tools = [{ type: 'function', function: { name: 'f' } }]
    await assert.rejects(
      s.complete('hi', { maxTokens: 2, tools, toolChoice: { type: 'function', function: { name: 'f', argument: '{}' } } }),
      refused(/^toolChoice\.function: unknown field 'argument' \(known fields: name\)$/),
    )
    await assert.rejects(
      s.complete('hi', { maxTokens: 2, tools, toolChoice: { type: 'function', function: { name: 'f' }, nme: 'f' } }),
      refused(/^toolChoice: unknown field 'nme' /),
    )
  })

  it('Runtime.load, before anything is read', async () => {
    await assert.rejects(Runtime.load(MODEL, { threds: 2 }), refused(suggests('Runtime.load', 'threds', 'threads')))
    await assert.rejects(Runtime.load(MODEL, { contextLenght: 64 }), refused(suggests('Runtime.load', 'contextLenght', 'contextLength')))
  })

  it('Runtime.load: kvCache', async () => {
    await assert.rejects(Runtime.load(MODEL, { kvCache: { blocksize: 16 } }), refused(suggests('kvCache', 'blocksize', 'blockSize')))
  })

  it('Runtime.load: hub, also for a local path (where it is not used)', async () => {
    await assert.rejects(Runtime.load(MODEL, { hub: { offine: true } }), refused(suggests('hub', 'offine', 'offline')))
  })

  it('Runtime.load: ropeScaling (camelCase or snake_case keys)', async () => {
    await assert.rejects(Runtime.load(MODEL, { ropeScaling: { type: 'linear', factr: 2 } }), refused(suggests('ropeScaling', 'factr', 'factor')))
    await assert.rejects(
      Runtime.load(MODEL, { ropeScaling: { type: 'yarn', factor: 2, original_max_position_embedding: 64 } }),
      refused(suggests('ropeScaling', 'original_max_position_embedding', 'originalMaxPositionEmbeddings')),
    )
  })

  it('createSession', () => {
    assert.throws(() => rt.createSession({ sytem: 'Be brief.' }), refused(suggests('createSession', 'sytem', 'system')))
    assert.throws(() => rt.createSession({ contextShit: 'drop-oldest' }), refused(suggests('createSession', 'contextShit', 'contextShift')))
  })

  it('loadExpert (hub too)', async () => {
    await assert.rejects(rt.loadExpert(fixture('adapters', 'lora'), { nmae: 'x' }), refused(suggests('loadExpert', 'nmae', 'name')))
    await assert.rejects(rt.loadExpert(fixture('adapters', 'lora'), { hub: { tokn: '' } }), refused(suggests('hub', 'tokn', 'token')))
    assert.equal(rt.experts.length, 0)
  })

  it('tokenize', () => {
    assert.throws(() => rt.tokenize('hi', { addSpecialToken: false }), refused(suggests('tokenize', 'addSpecialToken', 'addSpecialTokens')))
  })

  it('embed', async () => {
    await assert.rejects(rt.embed(['a'], { normalise: false }), refused(suggests('embed', 'normalise', 'normalize')))
  })

  it('route', async () => {
    await assert.rejects(rt.route('hi', { historyTurn: 1 }), refused(suggests('route', 'historyTurn', 'historyTurns')))
  })

  it('setRouter and its weights; what rt.router reads back is accepted', () => {
    assert.throws(() => rt.setRouter({ treshold: 0.4 }), refused(suggests('setRouter', 'treshold', 'threshold')))
    assert.throws(() => rt.setRouter({ weights: { keyword: 1 } }), refused(suggests('weights', 'keyword', 'keywords')))
    rt.setRouter(rt.router)
  })

  it('fetchModel: a Hub ref object', async () => {
    await assert.rejects(fetchModel({ repo: 'org/repo', revison: 'main' }, { offline: true }), refused(suggests('a Hub ref', 'revison', 'revision', 'field')))
  })
})

describe('integer options: one wording for every value out of range', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(MODEL, { threads: 2 })
  })
  after(() => rt?.dispose())

  it('maxTokens: 0 and -1 both ask for a positive integer; 2^32 names the bound', async () => {
    const s = rt.createSession()
    for (const v of [0, -1, 1.5]) {
      await assert.rejects(s.complete('hi', { maxTokens: v }), refused(new RegExp(`^maxTokens must be a positive integer \\(1 or more\\), got ${v}$`)))
    }
    await assert.rejects(s.complete('hi', { maxTokens: 'five' }), refused(/^maxTokens must be a positive integer \(1 or more\), got "five"$/))
    await assert.rejects(s.complete('hi', { maxTokens: 2 ** 32 }), refused(/^maxTokens must be a positive integer \(at most 4294967295\), got 4294967296$/))
  })

  it('counts that may be 0 say so the same way', async () => {
    const s = rt.createSession()
    await assert.rejects(s.complete('hi', { topK: -1 }), refused(/^topK must be a non-negative integer \(0 or more\), got -1$/))
    await assert.rejects(s.complete('hi', { seed: -3 }), refused(/^seed must be a non-negative integer \(0 or more\), got -3$/))
    await assert.rejects(s.complete('hi', { speculative: { type: 'ngram', maxDraft: 0 } }), refused(/^speculative\.maxDraft must be a positive integer \(1 or more\), got 0$/))
    await assert.rejects(rt.route('hi', { historyTurns: -1 }), refused(/^historyTurns must be a non-negative integer \(0 or more\), got -1$/))
    assert.throws(() => rt.setRouter({ maxExperts: -1 }), refused(/^maxExperts must be a non-negative integer \(0 or more\), got -1$/))
    await assert.rejects(s.complete({ tokens: [1, -2] }), refused(/^tokens\[1\] must be a non-negative integer \(0 or more\), got -2$/))
  })

  it('Runtime.load: contextLength, threads and kvCache sizes', async () => {
    for (const v of [0, -1]) {
      await assert.rejects(Runtime.load(MODEL, { contextLength: v }), refused(new RegExp(`^contextLength must be a positive integer \\(1 or more\\), got ${v}$`)))
      await assert.rejects(Runtime.load(MODEL, { threads: v }), refused(new RegExp(`^threads must be a positive integer \\(1 or more\\), got ${v}$`)))
      await assert.rejects(Runtime.load(MODEL, { kvCache: { blockSize: v } }), refused(new RegExp(`^kvCache\\.blockSize must be a positive integer \\(1 or more\\), got ${v}$`)))
    }
    await assert.rejects(Runtime.load(MODEL, { hub: { timeoutMs: 2 ** 31 } }), refused(/^hub\.timeoutMs must be a positive integer \(at most 2147483647\), got 2147483648$/))
  })
})
