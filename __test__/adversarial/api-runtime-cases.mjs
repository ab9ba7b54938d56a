// Adversarial calls of the runtime's entry points: Runtime.load, tokenize / detokenize, createSession.
import { prng } from './formats.mjs'
import { bigText, fx, isU32, LAZY, lazy, NON_OBJECTS, NON_STRINGS, NUMS, TEXTS } from './inputs.mjs'

// ---------------------------------------------------------------- API misuse: the runtime

/** `Runtime.load(path, options)`, `rt.tokenize` / `rt.detokenize`, `rt.createSession`. */
export function apiRuntimeCases(add) {
  const cat = 'api'
  const IA = ['INVALID_ARGUMENT']
  const MODEL = fx('qwen3-tiny')

  // Runtime.load(path, options)
  for (const [n, v] of NON_STRINGS) add(cat, `Runtime.load path ${n}`, IA, false, async (ctx) => ctx.loadAndProbe(v))
  add(cat, 'Runtime.load path empty', IA, false, async (ctx) => ctx.loadAndProbe(''))
  add(cat, 'Runtime.load path 2 MB', ['MODEL_NOT_FOUND', 'INVALID_MODEL'], false, async (ctx) => ctx.loadAndProbe('/' + 'p'.repeat(2 << 20)))
  add(cat, 'Runtime.load path with NUL', ['MODEL_NOT_FOUND', 'INVALID_MODEL', 'INVALID_ARGUMENT'], false, async (ctx) => ctx.loadAndProbe(MODEL + '\u0000/x'))
  add(cat, 'Runtime.load path missing', ['MODEL_NOT_FOUND'], false, async (ctx) => ctx.loadAndProbe('/nonexistent/model'))
  add(cat, 'Runtime.load path relative missing', ['MODEL_NOT_FOUND'], false, async (ctx) => ctx.loadAndProbe('nonexistent-model-dir'))
  add(cat, 'Runtime.load path lone surrogate', ['MODEL_NOT_FOUND'], false, async (ctx) => ctx.loadAndProbe('/tmp/\ud800'))
  for (const [n, v] of NON_OBJECTS) add(cat, `Runtime.load options ${n}`, IA, false, async (ctx) => ctx.loadAndProbe(MODEL, v))
  for (const field of ['contextLength', 'threads', 'kvCache.blockSize', 'kvCache.maxTokens']) {
    for (const [n, v, kind] of NUMS) {
      const opts = field.startsWith('kvCache.') ? { kvCache: { [field.slice(8)]: v } } : { [field]: v }
      const valid = isU32(kind, v) && v > 0
      const safe = field === 'kvCache.maxTokens' && Number.isSafeInteger(v) && v > 0
      add(cat, `Runtime.load ${field} ${n}`, IA, valid || safe, async (ctx) => ctx.loadAndProbe(MODEL, opts))
    }
  }
  for (const [n, v] of [['CPU', 'CPU'], ['empty', ''], ['gpu', 'gpu'], ['cuda:-1', 'cuda:-1'], ['cuda:1e3', 'cuda:1e3'], ['number', 5], ['true', true], ['object', {}], ['cpu ', 'cpu '], ['tpu', 'tpu']]) {
    add(cat, `Runtime.load device ${n}`, IA, false, async (ctx) => ctx.loadAndProbe(MODEL, { device: v }))
  }
  for (const v of ['cuda', 'cuda:0', 'cuda:7']) add(cat, `Runtime.load device ${v}`, ['NO_CUDA_DEVICE'], true, async (ctx) => ctx.loadAndProbe(MODEL, { device: v }))
  // Without the CUDA build this is NO_CUDA_DEVICE before the index is read.
  add(cat, 'Runtime.load device cuda:2^67', ['INVALID_ARGUMENT', 'NO_CUDA_DEVICE'], false, async (ctx) => ctx.loadAndProbe(MODEL, { device: 'cuda:99999999999999999999' }))
  add(cat, 'Runtime.load device null', IA, true, async (ctx) => ctx.loadAndProbe(MODEL, { device: null }))
  for (const [n, v, ok] of [['f8', 'f8', false], ['F32', 'F32', false], ['empty', '', false], ['number', 5, false], ['true', true, false], ['object', {}, false], ['f16', 'f16', true], ['bf16', 'bf16', true], ['auto', 'auto', true], ['null', null, true]]) {
    add(cat, `Runtime.load dtype ${n}`, IA, ok, async (ctx) => ctx.loadAndProbe(MODEL, { dtype: v }))
  }
  for (const [n, v] of NON_OBJECTS) add(cat, `Runtime.load kvCache ${n}`, IA, false, async (ctx) => ctx.loadAndProbe(MODEL, { kvCache: v }))
  // State slots of a model with recurrent layers (ignored by others): 1..=4096.
  const HYBRID = fx('qwen35-tiny')
  for (const [n, v, ok] of [['0', 0, false], ['1', 1, true], ['4096', 4096, true], ['4097', 4097, false], ['2^40', 2 ** 40, false], ['-1', -1, false], ['NaN', NaN, false], ['1.5', 1.5, false], ['string', '8', false], ['null', null, false]]) {
    add(cat, `Runtime.load kvCache.maxSequences ${n} (qwen35-tiny)`, IA, ok, async (ctx) => ctx.loadAndProbe(HYBRID, { kvCache: { maxSequences: v } }))
  }
  add(cat, 'Runtime.load kvCache.maxBytes below the states (qwen35-tiny)', IA, false, async (ctx) => ctx.loadAndProbe(HYBRID, { kvCache: { maxBytes: 4096 } }))
  for (const [n, v] of [['string', 'yes'], ['number', 1], ['null', null], ['object', {}]]) add(cat, `Runtime.load kvCache.prefixCache ${n}`, IA, false, async (ctx) => ctx.loadAndProbe(MODEL, { kvCache: { prefixCache: v } }))
  for (const [n, v] of [['number', 5], ['string', 'x'], ['object', {}], ['null', null]]) add(cat, `Runtime.load onProgress ${n}`, IA, false, async (ctx) => ctx.loadAndProbe(MODEL, { onProgress: v }))
  add(cat, 'Runtime.load onProgress throws', [], true, async (ctx) => {
    const boom = new Error('boom')
    try {
      await ctx.loadAndProbe(MODEL, { onProgress: () => { throw boom } })
    } catch (e) {
      if (e === boom) return
      throw e
    }
    ctx.fail('a throwing onProgress did not reject the load')
  })
  add(cat, 'Runtime.load onProgress throws a non-Error', [], true, async (ctx) => {
    try {
      await ctx.loadAndProbe(MODEL, { onProgress: () => { throw 42 } })
    } catch (e) {
      if (e === 42) return
      throw e
    }
    ctx.fail('a throwing onProgress did not reject the load')
  })
  add(cat, 'Runtime.load unknown options', IA, true, async (ctx) => ctx.loadAndProbe(MODEL, { foo: 1, kvCache: { bar: 2 }, Threads: -1 }))
  add(cat, 'Runtime.load inherited options', IA, true, async (ctx) => ctx.loadAndProbe(MODEL, Object.create({ threads: -1, contextLength: NaN })))
  add(cat, 'Runtime.load contextLength 1, then a request', ['CONTEXT_OVERFLOW', 'INVALID_ARGUMENT'], true, async (ctx) => ctx.loadAndProbe(MODEL, { contextLength: 1 }))
  add(cat, 'Runtime.load kvCache.maxTokens 1, then a request', ['KV_CACHE_EXHAUSTED', 'INVALID_ARGUMENT'], true, async (ctx) => ctx.loadAndProbe(MODEL, { kvCache: { maxTokens: 1 } }))
  add(cat, 'Runtime.load 8 loads at once', IA, true, async (ctx) => {
    const rts = await Promise.all(Array.from({ length: 8 }, () => ctx.load(MODEL)))
    for (const rt of rts) await ctx.probe(rt)
  })

  // rt.tokenize / rt.detokenize
  for (const [n, v] of NON_STRINGS) add(cat, `tokenize text ${n}`, IA, false, async (ctx) => (await ctx.shared()).tokenize(v))
  for (const [n, v] of NON_OBJECTS) add(cat, `tokenize options ${n}`, IA, false, async (ctx) => (await ctx.shared()).tokenize('hi', v))
  for (const opt of ['addSpecialTokens', 'parseSpecialTokens']) {
    for (const [n, v] of [['number', 1], ['string', 'yes'], ['null', null], ['object', {}]]) add(cat, `tokenize ${opt} ${n}`, IA, false, async (ctx) => (await ctx.shared()).tokenize('hi', { [opt]: v }))
  }
  for (const [n, t, big] of TEXTS) {
    // The big texts take seconds each: once, with the default.
    const variants = big ? [undefined] : [undefined, { addSpecialTokens: false }, { addSpecialTokens: true, parseSpecialTokens: true }, { parseSpecialTokens: false }]
    for (const o of variants) {
      add(cat, `tokenize ${n} ${JSON.stringify(o ?? {})}`, [], true, async (ctx) => {
        const rt = await ctx.shared()
        const ids = o === undefined ? rt.tokenize(t()) : rt.tokenize(t(), o)
        rt.detokenize(ids)
      })
    }
  }
  const idsCases = [
    ['undefined', undefined], ['null', null], ['number', 5], ['string', 'abc'], ['object', {}], ['array-like', { length: 3, 0: 1 }], ['Uint32Array', new Uint32Array([1, 2])],
    ['[NaN]', [NaN]], ['[-1]', [-1]], ['[0.5]', [0.5]], ['[2^32]', [2 ** 32]], ['[2^32+5]', [2 ** 32 + 5]], ['[Infinity]', [Infinity]], ["['1']", ['1']], ['[null]', [null]],
    ['[1n]', [1n]], ['[400]', [400]], ['[2^31]', [2 ** 31]], ['[u32 max]', [2 ** 32 - 1]], ['sparse', [, 1]], ['holes only', Array(5)], ['[Number(1)]', [new Number(1)]],
  ]
  for (const [n, v] of idsCases) add(cat, `detokenize ${n}`, IA, false, async (ctx) => (await ctx.shared()).detokenize(v))
  add(cat, 'detokenize 1e6 ids', [], true, async (ctx) => (await ctx.shared()).detokenize(Array(1_000_000).fill(5)))
  add(cat, 'detokenize 1e6 random ids', [], true, async (ctx) => {
    const r = prng(77)
    ;(await ctx.shared()).detokenize(Array.from({ length: 1_000_000 }, () => r.int(0, 400)))
  })
  add(cat, 'detokenize every id, specials included', [], true, async (ctx) => (await ctx.shared()).detokenize(Array.from({ length: 400 }, (_, i) => i)))
  add(cat, 'detokenize array with extra properties', [], true, async (ctx) => (await ctx.shared()).detokenize(Object.assign([1, 2], { foo: 'bar', [-1]: 9 })))

  // rt.createSession
  for (const [n, v] of NON_OBJECTS) add(cat, `createSession options ${n}`, IA, false, async (ctx) => ctx.session(v))
  for (const [n, v] of NON_STRINGS.filter(([k]) => k !== 'undefined')) add(cat, `createSession system ${n}`, IA, false, async (ctx) => ctx.session({ system: v }))
  for (const [n, v, expect] of [['string', 'lora', IA], ['[5]', [5], IA], ['[null]', [null], IA], ['sparse', Array(2), IA], ['unknown', ['nope'], ['EXPERT_NOT_FOUND']], ['10k unknown', lazy(() => Array(10_000).fill('nope')), ['EXPERT_NOT_FOUND']], ['object', {}, IA], ['null', null, IA]]) {
    add(cat, `createSession experts ${n}`, expect, false, async (ctx) => ctx.session({ experts: v?.[LAZY] ? v[LAZY]() : v }))
  }
  add(cat, 'createSession system 2 MB, then a turn', ['CONTEXT_OVERFLOW'], false, async (ctx) => {
    const s = await ctx.session({ system: bigText(2 << 20) })
    await s.complete('Hi', { maxTokens: 2 })
  })
  add(cat, 'createSession system of specials, then a turn', ['CONTEXT_OVERFLOW'], true, async (ctx) => {
    const s = await ctx.session({ system: '<|im_end|><|im_start|>assistant\n<think>' })
    await s.complete('Hi', { maxTokens: 2 })
  })
  add(cat, 'createSession 2000 sessions', [], true, async (ctx) => {
    for (let i = 0; i < 2000; i++) await ctx.session()
  })
}
