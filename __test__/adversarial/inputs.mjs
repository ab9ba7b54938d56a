// The hostile inputs the adversarial case files share: JSON values and whole files, numbers and
// wrong types for API options, special files, chat templates, safetensors mutations and texts.
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseSafetensors, patchUint, prng, writeSafetensors } from './formats.mjs'

export const FIXTURES = fileURLToPath(new URL('../fixtures/', import.meta.url))
export const fx = (...p) => path.join(FIXTURES, ...p)
export const readJson = (...p) => JSON.parse(readFileSync(fx(...p), 'utf8'))

/** Errors a request may legitimately end with on a model or adapter that loaded. */
export const PROBE_CODES = ['CONTEXT_OVERFLOW', 'KV_CACHE_EXHAUSTED']

// ---------------------------------------------------------------- JSON values

export const DELETE = Symbol('delete')
/** A JSON literal JSON.stringify cannot write (1e400, 2^64, -0). */
export const raw = (text) => ({ [RAW]: text })
export const RAW = Symbol('raw')
/** A value built only when its case runs (big arrays and strings). */
export const LAZY = Symbol('lazy')
export const lazy = (f) => ({ [LAZY]: f })

/** JSON text of `v`, with `raw(...)` values written verbatim. */
export function toJson(v) {
  const raws = []
  const text = JSON.stringify(v, (_k, x) => {
    if (x && typeof x === 'object' && RAW in x) {
      raws.push(x[RAW])
      return `@@RAW${raws.length - 1}@@`
    }
    return x
  })
  return text.replace(/"@@RAW(\d+)@@"/g, (_m, i) => raws[Number(i)])
}

/** JSON text of `obj` with `key` set to the raw JSON `text` (too deep for JSON.parse/stringify). */
export function toJsonDeep(obj, key, text) {
  return toJson({ ...obj, [key]: raw(text) })
}

/** A deep copy of `obj` with `value` at `keys` (DELETE removes it). */
export function withValue(obj, keys, value) {
  const out = structuredClone(obj)
  let o = out
  for (const k of keys.slice(0, -1)) o = o[k]
  const last = keys[keys.length - 1]
  if (value === DELETE) delete o[last]
  else o[last] = value
  return out
}

/** `[name, value]` pairs without repeated names (seeded picks may repeat). */
export const dedupe = (pairs) => [...new Map(pairs.map((p) => [p[0], p])).values()]

/** Hostile values for a JSON field. */
export const JSON_VALUES = [
  ['missing', DELETE], ['null', null], ['string', 'x'], ['numeric-string', '64'], ['true', true], ['array', [1]], ['object', {}],
  ['-1', -1], ['0', 0], ['1', 1], ['0.5', 0.5], ['1e9', 1e9], ['2^53', 2 ** 53],
  ['2^63', raw('9223372036854775808')], ['2^64', raw('18446744073709551616')], ['1e400', raw('1e400')], ['-1e400', raw('-1e400')],
  ['"NaN"', 'NaN'], ['"Infinity"', 'Infinity'], ['-0', raw('-0')],
]

/** Whole-file replacements for a JSON file. */
export const JSON_FILES = [
  ['empty', ''], ['open brace', '{'], ['null', 'null'], ['array', '[]'], ['string', '"x"'], ['number', '42'], ['empty object', '{}'],
  ['nested 100k deep', '['.repeat(100_000) + ']'.repeat(100_000)], ['nested objects 100k deep', '{"a":'.repeat(100_000) + '1' + '}'.repeat(100_000)],
  ['invalid utf-8', Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d])], ['NUL bytes', '{"a":\u0000}'],
]

// ---------------------------------------------------------------- numbers for API options

export const NUMS = [
  ['NaN', NaN, 'bad'], ['Infinity', Infinity, 'bad'], ['-Infinity', -Infinity, 'bad'], ['-1', -1, 'neg'], ['-0', -0, 'zero'], ['0', 0, 'zero'],
  ['0.5', 0.5, 'frac'], ['1e-300', 1e-300, 'frac'], ['1', 1, 'int'], ['2', 2, 'int'], ['7', 7, 'int'], ['2^31', 2 ** 31, 'int'], ['2^32-1', 2 ** 32 - 1, 'int'],
  ['2^32', 2 ** 32, 'big'], ['2^32+5', 2 ** 32 + 5, 'big'], ['2^53-1', 2 ** 53 - 1, 'big'], ['2^53', 2 ** 53, 'unsafe'], ['1e12', 1e12, 'big'],
  ['1e308', 1e308, 'unsafe'], ['MAX_VALUE', Number.MAX_VALUE, 'unsafe'],
  ['string', '5', 'type'], ['null', null, 'type'], ['true', true, 'type'], ['object', {}, 'type'], ['array', [5], 'type'],
  ['bigint', 5n, 'type'], ['symbol', Symbol('x'), 'type'], ['function', () => 5, 'type'], ['Number object', new Number(5), 'type'],
]
export const NON_OBJECTS = [['null', null], ['string', 'fast'], ['number', 5], ['true', true], ['array', []], ['function', () => ({})], ['symbol', Symbol('o')], ['bigint', 1n]]
export const NON_STRINGS = [['undefined', undefined], ['null', null], ['number', 5], ['true', true], ['object', {}], ['array', ['x']], ['bigint', 5n], ['symbol', Symbol('s')], ['String object', new String('x')], ['function', () => 'x']]

/** Whether `v` (from NUMS) is a u32 the TS layer passes on. */
export const isU32 = (kind, v) => Number.isInteger(v) && v >= 0 && v <= 2 ** 32 - 1 && kind !== 'type'

// ---------------------------------------------------------------- special files

export const SPECIALS = ['fifo', 'dir', 'zero', 'null', 'urandom', 'dangling', 'loop', 'proc', 'sparse-1g']

// ---------------------------------------------------------------- hostile chat templates

/**
 * A template is tried at load only for running out of fuel or output room; any other render
 * error depends on the conversation, so it is the request's INVALID_ARGUMENT (template.rs,
 * check_bounded). A template that renders nothing makes an empty, refused, input.
 */
export const TEMPLATE_PROBE = { probe: [...PROBE_CODES, 'INVALID_ARGUMENT'] }
export const H = 'heavy'

export const TEMPLATES = [
  ['unclosed expression', '{{ messages[0].content'],
  ['unclosed block', '{% for m in messages %}{{ m.content }}'],
  ['empty for', '{% for %}{% endfor %}'],
  ['stray endfor', '{% endfor %}'],
  ['unknown tag', '{% frobnicate %}'],
  ['division by zero', '{{ 1 / 0 }}'],
  ['integer overflow', '{{ 9223372036854775807 + 1 }}'],
  ['huge power', '{{ 10 ** 10 ** 10 }}'],
  ['raise_exception', "{{ raise_exception('refused') }}"],
  ['undefined call', '{{ nope() }}'],
  ['undefined chain', '{{ a.b.c.d }}'],
  ['endless recursion', '{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}'],
  ['nested loops', '{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}'],
  ['string repetition 1e9', "{{ 'x' * 1000000000 }}"],
  ['string repetition 1e11', "{{ 'x' * 100000000000 }}"],
  ['list repetition', '{{ [1] * 1000000000 }}'],
  ['huge range list', '{{ range(1000000000) | list | length }}'],
  // Heavy ones (H) run only from tokenizer_config.json, not again from every other source.
  ['string doubling', "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}", H],
  ['list doubling', '{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}', H],
  ['macro doubling', "{% macro f(s, n) %}{% if n > 0 %}{{ f(s ~ s, n - 1) }}{% else %}{{ s | length }}{% endif %}{% endmacro %}{{ f('x', 64) }}", H],
  ['replace squaring', "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s | replace('x', ns.s) %}{% endfor %}{{ ns.s }}", H],
  // A lazy list of 2^32 × 100,000 items: summing it allocates nothing new, so only the wait's
  // deadline ends it.
  ['lazy list sum', '{% set ns = namespace(l=range(100000) | list) %}{% for i in range(32) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | sum }}', H],
  ['center 1e9', "{{ 'x' | center(1000000000) }}"],
  ['indent 1e11', "{{ 'x\\ny' | indent(100000000000) }}", H],
  ['format width 1e11', "{{ '%100000000000d' | format(1) }}", H],
  ['replace empty', "{{ ('x' * 1000) | replace('', 'yyyyyyyyyy') }}"],
  ['deep nesting', '{% if true %}'.repeat(5000) + 'x' + '{% endif %}'.repeat(5000)],
  ['deep parens', '{{ ' + '('.repeat(100000) + '1' + ')'.repeat(100000) + ' }}'],
  ['include', "{% include 'other.jinja' %}"],
  ['extends', "{% extends 'base.jinja' %}"],
  ['import', "{% import 'macros.jinja' as m %}"],
  ['output only specials', "{{ '<|im_start|><|im_end|>' * 100 }}"],
  ['empty output', ''],
  ['one space', ' '],
  ['1 MB output', "{% for i in range(1000) %}{{ 'y ' * 500 }}{% endfor %}"],
  ['messages index out of range', '{{ messages[1000000].content }}'],
  ['string index', "{{ messages[0].content[1000000000] }}"],
  ['slice step 0', '{{ messages[::0] }}'],
  ['raise on role', "{% for m in messages %}{% if m.role == 'evil' %}{{ raise_exception('bad role') }}{% endif %}{{ m.content }}{% endfor %}"],
  ['NUL in template', '{{ "a\u0000b" }}{% for m in messages %}{{ m.content }}{% endfor %}'],
  ['lone surrogate', '\ud800{% for m in messages %}{{ m.content }}{% endfor %}'],
]

// ---------------------------------------------------------------- safetensors mutations

/** Mutations of one safetensors file's bytes, shared by models and adapters. */
export function safetensorsMutations(buf, seed, { flips = 60, dataFlips = 8, cuts = 24, tensors = 5 } = {}) {
  const st = parseSafetensors(buf)
  const hl = st.headerLen
  const rnd = prng(seed)
  const out = [] // [name, () => Buffer, okAllowed]
  const cutAt = new Set([0, 1, 4, 7, 8, 9, 16, Math.floor(hl / 2), hl + 7, hl + 8, hl + 9, buf.length - 4, buf.length - 1])
  while (cutAt.size < 13 + cuts) cutAt.add(rnd.int(hl + 8, buf.length))
  for (const n of [...cutAt].sort((a, b) => a - b)) out.push([`truncated at ${n}`, () => buf.subarray(0, n), false])
  const lens = [0, 1, 2, hl - 1, hl + 1, buf.length - 8, buf.length - 7, buf.length, 2 ** 31, 2 ** 32, 2 ** 32 + hl, 100e6, 2n ** 53n, 2n ** 63n, 2n ** 64n - 1n]
  for (const v of lens) out.push([`header length ${v}`, () => patchUint(buf, 0, 8, v), false])
  const flipAt = new Set()
  while (flipAt.size < flips) flipAt.add(rnd.int(0, 8 + hl))
  for (const at of [...flipAt].sort((a, b) => a - b)) {
    const bit = rnd.int(0, 8)
    out.push([`header bit ${bit} flipped at ${at}`, () => flip(buf, at, bit), true])
  }
  for (let i = 0; i < dataFlips; i++) {
    const at = rnd.int(8 + hl, buf.length)
    const bit = rnd.int(0, 8)
    out.push([`data bit ${bit} flipped at ${at}`, () => flip(buf, at, bit), true])
  }
  const names = Object.keys(st.header).filter((k) => k !== '__metadata__')
  const picked = [names[0], names[names.length - 1]]
  while (picked.length < Math.min(tensors, names.length)) {
    const n = rnd.pick(names)
    if (!picked.includes(n)) picked.push(n)
  }
  const dataLen = st.data.length
  for (const name of picked) {
    const t = st.header[name]
    const [s, e] = t.data_offsets
    const mut = (what, f, ok = false) => out.push([`${name} ${what}`, () => writeSafetensors(typeof f === 'function' ? f(structuredClone(st.header)) : f, st.data), ok])
    const set = (k, v) => (h) => ((h[name][k] = v), h)
    // A dtype of the same element size reads the same bytes as other numbers: a valid file.
    for (const dt of ['F16', 'BF16', 'F64', 'I64', 'I32', 'U32', 'U8', 'BOOL', 'F8_E4M3', 'F8_E5M2', 'F4', 'XX', '', 5, null]) {
      mut(`dtype ${JSON.stringify(dt)}`, set('dtype', dt), ['I32', 'U32', 'F32'].includes(dt) && t.dtype === 'F32')
    }
    const sh = t.shape
    const shapes = [[], [0], [1e9], [-1], [...sh].reverse(), [...sh, 1], [sh.reduce((a, b) => a * b, 1)], ['a'], [2 ** 53], [2 ** 32, 2 ** 32], [0, 0], 'x', null, sh.map((d) => d + 1)]
    const shapeSeen = new Set([JSON.stringify(sh)])
    for (const shape of shapes) {
      if (shapeSeen.has(JSON.stringify(shape))) continue
      shapeSeen.add(JSON.stringify(shape))
      mut(`shape ${JSON.stringify(shape)}`, set('shape', shape))
    }
    const offs = [[0, 0], [e, s], [s, e + 4], [s, dataLen + 4], [dataLen, dataLen + (e - s)], [-1, e], [s + 0.5, e], [String(s), e], [s], [s, e, e], null, [s, e - 4]]
    for (const o of offs) mut(`data_offsets ${JSON.stringify(o)}`, set('data_offsets', o))
    mut('data_offsets [s, 2^64]', () => toJson({ ...st.header, [name]: { ...t, data_offsets: [s, raw('18446744073709551616')] } }))
    mut('data_offsets [2^63, 2^63 + size]', () => toJson({ ...st.header, [name]: { ...t, data_offsets: [raw('9223372036854775808'), raw(String(2n ** 63n + BigInt(e - s)))] } }))
    mut('removed', (h) => (delete h[name], h))
    mut('renamed', (h) => {
      const v = h[name]
      delete h[name]
      h[`${name}.renamed`] = v
      return h
    })
    mut('duplicated key', () => JSON.stringify(st.header).slice(0, -1) + `,${JSON.stringify(name)}:${JSON.stringify({ ...t, shape: [1] })}}`)
    mut('same bytes as another tensor', (h) => ((h[name].data_offsets = [...h[picked[0] === name ? picked[1] : picked[0]].data_offsets]), h), true)
  }
  const H = (what, text, ok = false) => out.push([what, () => writeSafetensors(text, st.data), ok])
  H('header not JSON', 'x'.repeat(hl))
  H('header null', 'null')
  H('header array', '[]')
  H('header number', '1')
  H('header empty object', '{}')
  H('header nested 100k deep', '{"a":'.repeat(100_000) + '1' + '}'.repeat(100_000))
  H('metadata not strings', JSON.stringify({ ...st.header, __metadata__: { format: 5, x: { y: [] } } }))
  H('metadata array', JSON.stringify({ ...st.header, __metadata__: [] }))
  H('extra tensor past the data', JSON.stringify({ ...st.header, extra: { dtype: 'F32', shape: [4], data_offsets: [dataLen, dataLen + 16] } }))
  H('header padded with spaces', JSON.stringify(st.header) + ' '.repeat(4096), true)
  H('header with NUL', JSON.stringify(st.header).slice(0, -1) + ',"\u0000":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}', true)
  out.push(['empty file', () => Buffer.alloc(0), false])
  out.push(['8 zero bytes', () => Buffer.alloc(8), false])
  out.push(['header only', () => buf.subarray(0, 8 + hl), false])
  return dedupe(out)
}

/** A copy of `buf` with bit `bit` of byte `at` flipped. */
export function flip(buf, at, bit) {
  const out = Buffer.from(buf)
  out[at] ^= 1 << bit
  return out
}

// ---------------------------------------------------------------- texts for API inputs

/** A seeded text of at least `n` characters (the big inputs of tokenize, createSession and embed). */
export const bigText = (n) => {
  // Seeded mix of ASCII, CJK, emoji, combining marks and specials.
  const r = prng(n)
  const parts = []
  let len = 0
  while (len < n) {
    const k = r.int(0, 6)
    const s = k === 0 ? 'hello world ' : k === 1 ? '日本語の文 ' : k === 2 ? '🤖🚀 ' : k === 3 ? 'e\u0301\u0302\u0303 ' : k === 4 ? '<|im_start|>' : String.fromCodePoint(r.int(32, 0x2ffff) & ~0x800 | 0x20)
    parts.push(s)
    len += s.length
  }
  return parts.join('')
}

/** Texts for tokenize and route: `[name, () => text, big]` (a big one takes seconds: tokenized once, with the defaults). */
export const TEXTS = [
  ['empty', () => ''], ['NUL', () => '\u0000'], ['lone high surrogate', () => '\ud800'], ['reversed surrogates', () => '\udfff\ud800'], ['BOM', () => '\ufeff'],
  ['2 MB ASCII', () => 'a'.repeat(2 << 20), true], ['1 MB mixed', () => bigText(1 << 20), true], ['100k specials', () => '<|im_start|>'.repeat(100_000), true],
  ['1 MB whitespace', () => ' \t\r\n'.repeat(1 << 18), true], ['100k combining marks', () => 'e' + '\u0301'.repeat(100_000)], ['1 MB digits', () => '0123456789'.repeat(100_000), true],
  ['special-token prefixes', () => '<|im_st<|im_end<|endoftext'.repeat(10_000)], ['catastrophic-regex bait', () => 'x'.repeat(50_000) + 'z'],
]
