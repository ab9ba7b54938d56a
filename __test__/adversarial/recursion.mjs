// Inputs that make a parser or a compiler recurse: JSON schemas whose `$ref`s chain, Lark
// grammars whose rules or tokens chain, schemas embedded in grammars and in tool parameters,
// nested regexes, router patterns, GGUF arrays of arrays. A stack overflow is no error: it
// kills the process (SIGSEGV), which the suite reports as a crash pinned on the case. Each case
// must either work or fail with its typed error. The depth bound they meet is
// `MAX_FORMAT_DEPTH` (src/sampling/format_depth.rs): chains up to it compile, deeper ones are
// refused before the compiler sees them.
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { GGUF, cloneGguf, parseGguf, writeGguf } from './formats.mjs'

const FIXTURES = fileURLToPath(new URL('../fixtures/', import.meta.url))
const PROMPT = JSON.parse(readFileSync(path.join(FIXTURES, 'qwen3-tiny', 'reference.json'), 'utf8')).prompt_ids

/** `$defs` a0 … a(n-1), each wrapping (`wrap`) a `$ref` to the next; the last is a string. */
export function refChain(n, wrap = (r) => r) {
  const defs = {}
  for (let i = 0; i < n; i++) defs[`a${i}`] = i + 1 < n ? wrap({ $ref: `#/$defs/a${i + 1}` }) : { type: 'string' }
  return { $defs: defs, $ref: '#/$defs/a0' }
}

/** `start: r0`, then `r<i>: <body(i + 1)>` for n rules; the last matches "x". */
export function ruleChain(n, body = (k) => `r${k}`) {
  const lines = ['start: r0']
  for (let i = 0; i < n; i++) lines.push(`r${i}: ${i + 1 < n ? body(i + 1) : '"x"'}`)
  return lines.join('\n') + '\n'
}

export function tokenChain(n) {
  const lines = ['start: T0']
  for (let i = 0; i < n; i++) lines.push(`T${i}: ${i + 1 < n ? `"a" T${i + 1}` : '"x"'}`)
  return lines.join('\n') + '\n'
}

/** A GGUF metadata array nested `depth` deep (encoded by hand: the writer recurses). */
function nestedArray(depth) {
  const level = Buffer.alloc(12)
  level.writeUInt32LE(GGUF.ARRAY, 0)
  level.writeBigUInt64LE(1n, 4)
  const leaf = Buffer.alloc(13)
  leaf.writeUInt32LE(GGUF.UINT8, 0)
  leaf.writeBigUInt64LE(1n, 4)
  // The key's own type is ARRAY: its value starts with the element type.
  return { raw: Buffer.concat([...Array.from({ length: depth - 1 }, () => level), leaf]) }
}

export function recursionCases(add) {
  const cat = 'recursion'
  const IA = ['INVALID_ARGUMENT']
  // Inputs are built when the case runs (thunks): building every case must stay cheap.
  const generate = (options) => async (ctx) => {
    const s = await ctx.session()
    await s.complete({ tokens: PROMPT }, { maxTokens: 4, temperature: 0, ...options() })
  }
  const schema = (s) => generate(() => ({ responseFormat: { type: 'json_schema', schema: s() } }))
  const grammar = (g) => generate(() => ({ responseFormat: { type: 'grammar', grammar: g() } }))
  // Within the bound: compiled (the 650-link chain killed the process before the fix).
  for (const n of [650, 990]) add(cat, `json_schema $ref chain ${n}`, IA, true, schema(() => refChain(n)))
  add(cat, 'json_schema anyOf $ref chain 300', IA, true, schema(() => refChain(300, (r) => ({ anyOf: [r, { type: 'null' }] }))))
  add(cat, 'json_schema allOf $ref chain 300', IA, true, schema(() => refChain(300, (r) => ({ allOf: [r, { type: 'string' }] }))))
  add(cat, 'json_schema property $ref chain 300', IA, true, schema(() => refChain(300, (r) => ({ type: 'object', properties: { x: r }, required: ['x'] }))))
  add(cat, 'json_schema $ref with sibling chain 900', IA, true, schema(() => refChain(900, (r) => ({ ...r, type: 'string' }))))
  // Beyond it: refused before compiling.
  for (const n of [1100, 5000, 40_000]) add(cat, `json_schema $ref chain ${n}`, IA, false, schema(() => refChain(n)))
  add(cat, 'json_schema anyOf $ref chain 3000', IA, false, schema(() => refChain(3000, (r) => ({ anyOf: [r, { type: 'null' }] }))))
  add(cat, 'json_schema $ref cycle of 5000', IA, false, schema(() => refChain(5000, (r) => ({ anyOf: [r, { $ref: '#/$defs/a0' }] }))))
  add(cat, 'json_schema $id/$anchor chain 3000', IA, false, async (ctx) => {
    const defs = {}
    for (let i = 0; i < 3000; i++) defs[`a${i}`] = { $id: `urn:a${i}`, $anchor: `x${i}`, ...(i + 1 < 3000 ? { $ref: `urn:a${i + 1}#x${i + 1}` } : { type: 'string' }) }
    await schema(() => ({ $defs: defs, $ref: 'urn:a0' }))(ctx)
  })
  // Nesting deeper than JSON's parser takes, and deeper than JSON.stringify can write.
  const nest = (n, wrap) => Array.from({ length: n }).reduce((inner) => wrap(inner), { type: 'integer' })
  add(cat, 'json_schema items nested 120', IA, true, schema(() => nest(120, (i) => ({ type: 'array', items: i, maxItems: 1 }))))
  add(cat, 'json_schema items nested 1000', IA, false, schema(() => nest(1000, (i) => ({ type: 'array', items: i }))))
  add(cat, 'json_schema nested 1e6 (JSON.stringify overflows)', IA, false, async (ctx) => {
    let deep = {}
    for (let i = 0; i < 1e6; i++) deep = { not: deep }
    await schema(() => deep)(ctx)
  })
  // Lark: rule chains (800 killed the process before the fix), token chains, brackets,
  // schemas embedded with %json.
  for (const n of [800, 990]) add(cat, `grammar rule chain ${n}`, IA, true, grammar(() => ruleChain(n)))
  add(cat, 'grammar rule chain in brackets 300', IA, true, grammar(() => ruleChain(300, (k) => `"a" ("b" [r${k}])`)))
  add(cat, 'grammar token chain 900', IA, true, grammar(() => tokenChain(900)))
  for (const n of [1100, 5000, 100_000]) add(cat, `grammar rule chain ${n}`, IA, false, grammar(() => ruleChain(n)))
  add(cat, 'grammar token chain 5000', IA, false, grammar(() => tokenChain(5000)))
  add(cat, 'grammar mutual recursion of 5000 rules', IA, false, grammar(() => ruleChain(5000, (k) => `"a" r${k} | "b" r0`)))
  add(cat, 'grammar %json $ref chain 5000', IA, false, grammar(() => `start: %json ${JSON.stringify(refChain(5000))}\n`))
  add(cat, 'grammar %json $ref chain 500', IA, true, grammar(() => `start: %json ${JSON.stringify(refChain(500))}\n`))
  add(cat, 'grammar nested parentheses 100k', IA, false, grammar(() => `start: ${'('.repeat(100_000)}"a"${')'.repeat(100_000)}\n`))
  add(cat, 'grammar nested %lark 1000', IA, false, grammar(() => `start: ${'%lark { start: '.repeat(1000)}"a"${' }'.repeat(1000)}\n`))
  // Regexes: nesting (the regex parser's own limit), as a format and inside a grammar.
  for (const n of [200, 300, 100_000]) {
    add(cat, `regex nested ${n}`, IA, n <= 200, generate(() => ({ responseFormat: { type: 'regex', pattern: `${'('.repeat(n)}a${')'.repeat(n)}` } })))
  }
  add(cat, 'grammar regex nested 100k', IA, false, grammar(() => `start: /${'('.repeat(100_000)}a${')'.repeat(100_000)}/\n`))
  // Tool parameters are schemas too: forced calls compile them.
  const tools = (params) => [{ type: 'function', function: { name: 'f', parameters: params } }]
  add(cat, 'tools parameters $ref chain 5000, required', IA, false, generate(() => ({ tools: tools(refChain(5000)), toolChoice: 'required' })))
  add(cat, 'tools parameters $ref chain 500, required', IA, true, generate(() => ({ tools: tools(refChain(500)), toolChoice: 'required' })))
  // The router's patterns (regexes compiled on the caller's thread).
  for (const n of [100, 100_000]) {
    add(cat, `setRouter genericPatterns nested ${n}`, IA, n === 100, async (ctx) => {
      const rt = await ctx.shared()
      const before = rt.router
      try {
        rt.setRouter({ genericPatterns: [`${'('.repeat(n)}a${')'.repeat(n)}`] })
      } finally {
        rt.setRouter(before)
      }
    })
  }
  // A GGUF metadata value nested 100k arrays deep (the header reader recurses per level).
  add(cat, 'gguf array nested 100k', ['INVALID_MODEL'], false, async (ctx) => {
    const g = parseGguf(readFileSync(path.join(FIXTURES, 'qwen3-tiny', 'model-q8_0.gguf')))
    const m = cloneGguf(g)
    m.kvs.push({ key: 'x.nested', type: GGUF.ARRAY, value: nestedArray(100_000) })
    await ctx.loadAndProbe(await ctx.file('model.gguf', writeGguf(m)))
  })
}
