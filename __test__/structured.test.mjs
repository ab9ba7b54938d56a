// Grammar-constrained decoding on a real model: every JSON schema, regex and Lark grammar in
// fixtures/structured-corpus.json, sampled from SmolLM2-135M-Instruct at temperature 0.8 with
// three seeds, must give an answer that validates (JSON: parses, no repeated member name, ajv
// 2020-12 with ajv-formats; regexes: a full-match JS regex; Lark grammars: a JS regex or a small
// recognizer) and that ended by itself (finishReason 'stop'), not by running out of tokens.
// Requests run CONCURRENCY at a time on one Runtime, each on a fresh session, so the engine
// batches them. Batching changes the quantized kernels' last digits, so a seed does not pin an
// answer from one run to the next: the corpus keeps strings, arrays and fractions bounded enough
// that any sampled answer ends well inside maxTokens (the longest seen is under 200 tokens).
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import Ajv2020 from 'ajv/dist/2020.js'
import addFormats from 'ajv-formats'
import { smolLM2OrSkip } from '../scripts/assets.mjs'
import { duplicateKey, fixtureJson, pool } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const corpus = fixtureJson('structured-corpus.json')
const { modelPath, skip } = smolLM2OrSkip()

const SEEDS = [1, 2, 3]
const SAMPLING = { temperature: 0.8, maxTokens: 500 }
/** Sessions generating at once on the one Runtime (the engine batches them). */
const CONCURRENCY = 16

function makeAjv() {
  // Strict mode stays on, so a schema keyword ajv does not know fails the corpus check.
  // `multipleOfPrecision`: JSON numbers are decimals but JS reads them as doubles, so
  // 42.15 / 0.01 is 4214.999999999999; 9 digits of slack keep `multipleOf: 0.01` meaningful.
  const ajv = new Ajv2020({ strict: true, allowUnionTypes: true, allErrors: true, multipleOfPrecision: 9 })
  addFormats(ajv) // 'full' mode: dates are checked against the calendar, times against leap seconds
  return ajv
}

/** Full-match test with JS regex semantics (`u` flag); the corpus only uses constructs on which JS and Rust `regex` agree. */
const fullMatch = (pattern) => new RegExp(`^(?:${pattern})$`, 'u')

/** `(text) => null | reason` for JSON text that must parse, have unique member names and validate against `schema`. */
function jsonVerdict(ajv, schema) {
  const validate = ajv.compile(schema)
  return (text) => {
    let v
    try {
      v = JSON.parse(text)
    } catch (e) {
      return `not JSON: ${e.message}`
    }
    const dup = duplicateKey(text)
    if (dup !== null) return `duplicate member name ${JSON.stringify(dup)}`
    return validate(v) ? null : ajv.errorsText(validate.errors)
  }
}

// ---- recognizers for the Lark grammars that a regex cannot describe ----------------------

/** A tiny recursive-descent parser over `s`: `eat(re)` consumes a sticky regex match or returns null. */
function scanner(s) {
  let pos = 0
  return {
    eat(re) {
      const y = new RegExp(re.source, 'y')
      y.lastIndex = pos
      const m = y.exec(s)
      if (!m) return null
      pos = y.lastIndex
      return m[0]
    },
    get done() {
      return pos === s.length
    },
  }
}

/** expr: term (("+"|"-") term)*; term: factor (("*"|"/") factor)*; factor: NUMBER | "(" expr ")" */
function isArithmetic(s) {
  const sc = scanner(s)
  const factor = () => (sc.eat(/[0-9]{1,4}/) !== null ? !sc.eat(/[0-9]/) : sc.eat(/\(/) !== null && expr() && sc.eat(/\)/) !== null)
  const term = () => {
    if (!factor()) return false
    while (sc.eat(/[*/]/) !== null) if (!factor()) return false
    return true
  }
  const expr = () => {
    if (!term()) return false
    while (sc.eat(/[+-]/) !== null) if (!term()) return false
    return true
  }
  return expr() && sc.done
}

/** list: "[" (elem (", " elem){0,3})? "]"; elem: NUMBER | list; NUMBER: /[0-9]{1,3}/ */
function isNestedList(s) {
  const sc = scanner(s)
  const elem = () => (sc.eat(/[0-9]{1,3}/) !== null ? !sc.eat(/[0-9]/) : list())
  const list = () => {
    if (sc.eat(/\[/) === null) return false
    if (sc.eat(/\]/) !== null) return true
    if (!elem()) return false
    for (let k = 0; k < 3 && sc.eat(/, /) !== null; k++) if (!elem()) return false
    return sc.eat(/\]/) !== null
  }
  return list() && sc.done
}

/** A checker for one Lark corpus entry: `(text) => null | 'why it is invalid'`. */
function larkChecker(entry, ajv) {
  if (entry.check !== undefined) {
    const re = fullMatch(entry.check)
    return (text) => (re.test(text) ? null : `does not match ${re}`)
  }
  const json = entry.schema && jsonVerdict(ajv, entry.schema)
  const jsonAfter = (prefix, text) => (text.startsWith(prefix) ? json(text.slice(prefix.length)) : `does not start with ${JSON.stringify(prefix)}`)
  switch (entry.recognizer) {
    case 'arithmetic':
      return (text) => (isArithmetic(text) ? null : 'not an arithmetic expression of the grammar')
    case 'nested_list':
      return (text) => (isNestedList(text) ? null : 'not a nested list of the grammar')
    case 'prefixed_json':
      return (text) => jsonAfter(entry.prefix, text)
    case 'ok_or_error':
      return (text) =>
        text.startsWith('ok ') ? jsonAfter('ok ', text) : /^error [A-Za-z ,.]{1,60}$/u.test(text) ? null : 'neither "ok <json>" nor "error <message>"'
    default:
      throw new Error(`lark entry ${entry.name}: unknown recognizer ${entry.recognizer}`)
  }
}

// ---- corpus coverage (no model needed) -------------------------------------------------------

/** The JSON Schema features a schema uses, for the coverage check. */
function features(schema) {
  const f = new Set()
  if (schema.type === 'array') f.add('top-level array')
  if (schema.enum && !schema.type) f.add('top-level enum')
  const walk = (s, depth) => {
    if (!s || typeof s !== 'object') return
    if (Array.isArray(s)) return s.forEach((x) => walk(x, depth))
    for (const k of ['minItems', 'maxItems', 'enum', 'const', 'minimum', 'maximum', 'exclusiveMinimum', 'multipleOf', 'pattern', 'minLength', 'maxLength', 'anyOf', 'oneOf', '$ref', '$defs']) {
      if (k in s) f.add(k)
    }
    if (typeof s.format === 'string') f.add(`format:${s.format}`)
    if (s.additionalProperties === false) f.add('additionalProperties:false')
    const types = [s.type].flat()
    if (types.includes('boolean')) f.add('boolean')
    if (types.includes('null') || (s.enum ?? []).includes(null)) f.add('null')
    if (Array.isArray(s.type) && types.includes('null')) f.add('nullable type array')
    if (types.includes('object') && depth > 0) f.add('nested object')
    if (types.includes('object') && s.properties && Array.isArray(s.required) && Object.keys(s.properties).some((p) => !s.required.includes(p))) f.add('optional field')
    if (types.includes('object') && Array.isArray(s.required) && s.required.length) f.add('required field')
    if (types.includes('array') && [s.items].flat().some((i) => i && i.type === 'object')) f.add('array of objects')
    if (types.includes('string') && s.maxLength === undefined && !s.pattern && !s.format && !s.enum && s.const === undefined) f.add('unbounded string')
    for (const v of Object.values(s)) walk(v, depth + 1)
  }
  walk(schema, 0)
  return f
}

describe('structured-output corpus', () => {
  it('has enough entries, each with a name, a prompt and its format', () => {
    assert.ok(corpus.json.length >= 52, `json: ${corpus.json.length}`)
    assert.ok(corpus.regex.length >= 10, `regex: ${corpus.regex.length}`)
    assert.ok(corpus.lark.length >= 8, `lark: ${corpus.lark.length}`)
    const names = new Set()
    for (const [cat, key] of [['json', 'schema'], ['regex', 'pattern'], ['lark', 'grammar']]) {
      for (const e of corpus[cat]) {
        assert.equal(typeof e.name, 'string')
        assert.ok(!names.has(`${cat}/${e.name}`), `duplicate name ${cat}/${e.name}`)
        names.add(`${cat}/${e.name}`)
        assert.ok(typeof e.prompt === 'string' && e.prompt.length > 0, `${e.name}: prompt`)
        assert.ok(e[key] !== undefined, `${e.name}: ${key}`)
      }
    }
    for (const e of corpus.lark) assert.ok(e.check !== undefined || e.recognizer !== undefined, `${e.name}: a check regex or a recognizer`)
  })

  it('covers the JSON Schema features it is meant to', (t) => {
    const seen = new Map()
    for (const e of corpus.json) for (const f of features(e.schema)) seen.set(f, (seen.get(f) ?? 0) + 1)
    const wanted = [
      'nested object', 'minItems', 'maxItems', 'enum', 'const', 'minimum', 'maximum', 'exclusiveMinimum', 'multipleOf',
      'pattern', 'format:date', 'format:email', 'format:uuid', 'format:date-time', 'format:ipv4', 'minLength', 'maxLength',
      'anyOf', 'oneOf', '$ref', '$defs', 'optional field', 'required field', 'additionalProperties:false', 'boolean', 'null',
      'nullable type array', 'array of objects', 'top-level array', 'top-level enum',
    ]
    for (const w of wanted) assert.ok(seen.has(w), `no schema uses ${w}`)
    assert.ok((seen.get('unbounded string') ?? 0) >= 5, `schemas with unbounded strings: ${seen.get('unbounded string') ?? 0}`)
    t.diagnostic(`features: ${[...seen].sort().map(([k, v]) => `${k}=${v}`).join(', ')}`)
  })

  it('every schema compiles with ajv (strict), every pattern and check is a valid JS regex', () => {
    const ajv = makeAjv()
    for (const e of corpus.json) assert.doesNotThrow(() => ajv.compile(e.schema), `json/${e.name}`)
    for (const e of corpus.regex) assert.doesNotThrow(() => fullMatch(e.pattern), `regex/${e.name}`)
    for (const e of corpus.lark) assert.doesNotThrow(() => larkChecker(e, ajv), `lark/${e.name}`)
  })

  it('the recognizers accept and reject what they should', () => {
    assert.ok(isArithmetic('12*(3+4)'))
    assert.ok(isArithmetic('((1))-2/3'))
    assert.ok(!isArithmetic('12*(3+4'))
    assert.ok(!isArithmetic('12345'))
    assert.ok(!isArithmetic('1 + 2'))
    assert.ok(isNestedList('[1, [2, 3]]'))
    assert.ok(isNestedList('[]'))
    assert.ok(isNestedList('[[], [[1]], 2, 3]'))
    assert.ok(!isNestedList('[1, 2, 3, 4, 5]'))
    assert.ok(!isNestedList('[1,2]'))
    assert.ok(!isNestedList('[1234]'))
    assert.equal(duplicateKey('{"a": 1, "b": {"a": 2}, "c": [{"a": 3}, {"a": 4}]}'), null)
    assert.equal(duplicateKey('{"a": "x\\"y", "b": ["a", "a"], "c": "a"}'), null)
    assert.equal(duplicateKey('{"pears": 5, "plums": 1, "pears": 2}'), 'pears')
    assert.equal(duplicateKey('[{"k": {"x": 1}, "k" : 2}]'), 'k')
    assert.equal(duplicateKey('{"a\\u0062": 1, "ab": 2}'), 'ab')
  })
})

describe('structured outputs from SmolLM2-135M-Instruct validate', { skip }, () => {
  let rt
  let ajv
  before(async () => {
    rt = await Runtime.load(modelPath)
    ajv = makeAjv()
  })
  after(() => rt?.dispose())

  /**
   * Runs every (entry, seed) of a category, CONCURRENCY at a time, each on a fresh session;
   * `check(entry)` gives `(text) => null | reason`. Reports the counts and fails listing every
   * invalid or cut-off answer.
   */
  async function runCategory(t, category, entries, responseFormat, check) {
    const jobs = entries.flatMap((entry) => SEEDS.map((seed) => ({ entry, seed, verdict: check(entry) })))
    const t0 = Date.now()
    const results = await pool(jobs, CONCURRENCY, async ({ entry, seed, verdict }) => {
      const s = rt.createSession()
      try {
        const r = await s.complete(entry.prompt, { ...SAMPLING, seed, responseFormat: responseFormat(entry) })
        return { name: entry.name, seed, finishReason: r.finishReason, tokens: r.usage.completionTokens, text: r.text, why: verdict(r.text) }
      } catch (e) {
        return { name: entry.name, seed, finishReason: 'error', tokens: 0, text: '', why: `${e.code ?? ''} ${e.message}` }
      } finally {
        s.dispose()
      }
    })
    const secs = ((Date.now() - t0) / 1000).toFixed(1)
    const valid = results.filter((r) => r.why === null).length
    const stopped = results.filter((r) => r.finishReason === 'stop').length
    const tokens = results.map((r) => r.tokens)
    // A grammar bounds the shape of an answer, not its length: a 135M model sampled at 0.8 can
    // run a number's digits or a string out to maxTokens (geo_point seed 1 wrote 500 digits of
    // a longitude). Such cut-offs are the model's, and allowed while rare; every answer that
    // stops must be valid.
    const cutOff = results.filter((r) => r.finishReason === 'length')
    const failures = results.filter((r) => r.finishReason !== 'length' && (r.why !== null || r.finishReason !== 'stop'))
    t.diagnostic(
      `${category}: ${valid}/${results.length} valid, ${stopped}/${results.length} finishReason 'stop' ` +
        `(${entries.length} cases x ${SEEDS.length} seeds; completion tokens mean ${(tokens.reduce((a, b) => a + b, 0) / tokens.length).toFixed(1)}, ` +
        `max ${Math.max(...tokens)}; ${secs} s)`,
    )
    const longest = [...results].sort((a, b) => b.tokens - a.tokens).slice(0, 3)
    t.diagnostic(`${category} longest: ${longest.map((r) => `${r.name} seed ${r.seed} (${r.tokens})`).join(', ')}`)
    for (const f of failures) t.diagnostic(`FAIL ${category}/${f.name} seed ${f.seed}: finishReason ${f.finishReason}, ${f.why ?? 'valid'}; text ${JSON.stringify(f.text)}`)
    for (const f of cutOff) t.diagnostic(`cut off ${category}/${f.name} seed ${f.seed} at ${f.tokens} tokens: ${JSON.stringify(f.text.slice(0, 120))}…`)
    const allowed = Math.max(1, Math.floor(results.length / 100))
    assert.ok(cutOff.length <= allowed, `${cutOff.length} of ${results.length} ${category} answers cut off at maxTokens (at most ${allowed} allowed)`)
    assert.deepEqual(
      failures.map((f) => `${f.name} seed ${f.seed}: ${f.finishReason}; ${f.why ?? 'valid'}; ${JSON.stringify(f.text)}`),
      [],
      `${failures.length} of ${results.length} ${category} answers failed`,
    )
  }

  it('JSON schemas: every answer that stops parses and validates with ajv', async (t) => {
    const verdict = (entry) => jsonVerdict(ajv, entry.schema)
    await runCategory(t, 'json', corpus.json, (e) => ({ type: 'json_schema', schema: e.schema }), verdict)
  })

  it('regexes: every answer that stops fully matches the pattern', async (t) => {
    await runCategory(t, 'regex', corpus.regex, (e) => ({ type: 'regex', pattern: e.pattern }), (entry) => {
      const re = fullMatch(entry.pattern)
      return (text) => (re.test(text) ? null : `does not match ${re}`)
    })
  })

  it('Lark grammars: every answer that stops is in the grammar', async (t) => {
    await runCategory(t, 'lark', corpus.lark, (e) => ({ type: 'grammar', grammar: e.grammar }), (entry) => larkChecker(entry, ajv))
  })

  // The grammar llguidance builds for `patternProperties` (keys matched by a pattern, not named)
  // keeps no memory of the names written; the JSON watch (src/sampling/json_watch.rs) does.
  // Without it SmolLM2 wrote {"apples": 3, "pears": 5, "pears": 2, "plums": 1} at seed 5 (run
  // alone), which JSON.parse and ajv accept (the last "pears" wins) but which means pears=5 to a
  // first-wins parser. These seeds each repeated a name before the watch.
  it('patternProperties answers never repeat a member name', async () => {
    const entry = corpus.json.find((e) => e.name === 'pattern_properties_inventory')
    const texts = []
    for (const seed of [5, 8, 12]) {
      const s = rt.createSession()
      try {
        texts.push((await s.complete(entry.prompt, { ...SAMPLING, seed, responseFormat: { type: 'json_schema', schema: entry.schema } })).text)
      } finally {
        s.dispose()
      }
    }
    assert.deepEqual(texts.filter((t) => duplicateKey(t) !== null), [])
  })

  it('a schema answer cut by a too-small maxTokens ends with length', async () => {
    const entry = corpus.json.find((e) => e.name === 'person_basic')
    const s = rt.createSession()
    try {
      const r = await s.complete(entry.prompt, { ...SAMPLING, seed: 1, maxTokens: 3, responseFormat: { type: 'json_schema', schema: entry.schema } })
      assert.equal(r.finishReason, 'length', `text ${JSON.stringify(r.text)}`)
      assert.equal(r.usage.completionTokens, 3)
      assert.throws(() => JSON.parse(r.text), 'three tokens cannot hold the whole object')
      assert.ok(r.text.startsWith('{'), `the cut answer starts the object: ${JSON.stringify(r.text)}`)
    } finally {
      s.dispose()
    }
  })
})
