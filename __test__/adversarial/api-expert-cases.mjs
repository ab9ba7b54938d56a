// Adversarial calls of the expert entry points: loadExpert, unload, setExperts, route, embed, setRouter.
import { bigText, fx, isU32, LAZY, lazy, NON_OBJECTS, NON_STRINGS, NUMS, readJson, TEXTS } from './inputs.mjs'

// ---------------------------------------------------------------- API misuse: experts and routing

/** Experts by API (`rt.loadExpert`, `unload`, `setExperts`), routing and embeddings (`rt.route`, `rt.embed`, `rt.setRouter`, `experts: 'auto'`). */
export function apiExpertCases(add) {
  const cat = 'api'
  const IA = ['INVALID_ARGUMENT']
  const MODEL = fx('qwen3-tiny')
  const PROMPT = readJson('qwen3-tiny', 'reference.json').prompt_ids

  // Experts by API.
  for (const [n, v] of NON_STRINGS) add(cat, `loadExpert path ${n}`, IA, false, async (ctx) => ctx.loadExpertAndProbe(v))
  add(cat, 'loadExpert path empty', IA, false, async (ctx) => ctx.loadExpertAndProbe(''))
  add(cat, 'loadExpert path missing', ['EXPERT_NOT_FOUND'], false, async (ctx) => ctx.loadExpertAndProbe('/nonexistent/adapter'))
  add(cat, 'loadExpert path 2 MB', ['EXPERT_NOT_FOUND', 'INVALID_ADAPTER'], false, async (ctx) => ctx.loadExpertAndProbe('/' + 'p'.repeat(2 << 20)))
  for (const [n, v] of NON_OBJECTS) add(cat, `loadExpert options ${n}`, IA, false, async (ctx) => ctx.loadExpertAndProbe(fx('adapters', 'lora'), v))
  for (const [n, v, ok] of [['number', 5, false], ['empty', '', false], ['null', null, false], ['object', {}, false], ['2 MB', lazy(() => 'n'.repeat(2 << 20)), true], ['NUL', 'a\u0000b', true], ['slash', '../../x', true], ['lone surrogate', '\ud800', true]]) {
    add(cat, `loadExpert name ${n}`, IA, ok, async (ctx) => ctx.loadExpertAndProbe(fx('adapters', 'lora'), { name: v?.[LAZY] ? v[LAZY]() : v }))
  }
  for (const [n, v, vk] of NUMS) {
    const ok = typeof v === 'number' && Number.isFinite(v)
    add(cat, `loadExpert scale ${n}`, IA, ok, async (ctx) => ctx.loadExpertAndProbe(fx('adapters', 'lora'), { scale: v }))
    if (vk === 'unsafe' || n === '-1') add(cat, `loadExpert scale ${n} on ia3`, IA, ok, async (ctx) => ctx.loadExpertAndProbe(fx('adapters', 'ia3'), { scale: v }))
  }
  add(cat, 'loadExpert scale on prompt tuning', IA, true, async (ctx) => ctx.loadExpertAndProbe(fx('adapters', 'prompt'), { scale: 2 }))
  add(cat, 'loadExpert the same name twice', IA, false, async (ctx) => {
    await ctx.loadExpert(fx('adapters', 'lora'))
    await ctx.loadExpert(fx('adapters', 'lora2'), { name: 'lora' })
  })
  add(cat, 'loadExpert the same adapter 4 times at once', IA, false, async (ctx) => {
    const rs = await Promise.allSettled(Array.from({ length: 4 }, () => ctx.loadExpert(fx('adapters', 'lora'))))
    if (rs.filter((r) => r.status === 'fulfilled').length !== 1) ctx.fail(`${rs.filter((r) => r.status === 'fulfilled').length} loads of one name succeeded`)
    throw rs.find((r) => r.status === 'rejected').reason
  })
  add(cat, 'unload twice, then use the name', ['EXPERT_NOT_FOUND'], false, async (ctx) => {
    const e = await ctx.loadExpert(fx('adapters', 'lora'))
    await e.unload()
    await e.unload()
    await (await ctx.session()).complete('Hi', { maxTokens: 1, experts: ['lora'] })
  })
  add(cat, 'unload while generating with it', [], true, async (ctx) => {
    const e = await ctx.loadExpert(fx('adapters', 'lora'))
    const stream = (await ctx.session()).generate({ tokens: PROMPT }, { maxTokens: 30, experts: ['lora'] })
    const it = stream[Symbol.asyncIterator]()
    await it.next()
    await e.unload()
    while (!(await it.next()).done) {
      /* drain */
    }
  })
  add(cat, 'setExperts hostile', IA, false, async (ctx) => (await ctx.session()).setExperts([{ toString: () => 'lora' }]))
  add(cat, 'setExperts unknown', ['EXPERT_NOT_FOUND'], false, async (ctx) => (await ctx.session()).setExperts(['nope']))
  add(cat, 'setExperts null', IA, false, async (ctx) => (await ctx.session()).setExperts(null))
  // Routing and embeddings (rt.route, rt.embed, rt.setRouter, experts: 'auto').
  for (const [n, v] of NON_STRINGS) add(cat, `route input ${n}`, IA, false, async (ctx) => (await ctx.shared()).route(v))
  for (const [n, v] of NON_OBJECTS) add(cat, `route options ${n}`, IA, false, async (ctx) => (await ctx.shared()).route('hi', v))
  for (const [n, v, kind] of NUMS) add(cat, `route historyTurns ${n}`, IA, isU32(kind, v), async (ctx) => (await ctx.shared()).route([{ role: 'user', content: 'hi' }], { historyTurns: v }))
  add(cat, 'route unknown options', IA, false, async (ctx) => (await ctx.shared()).route('hi', { turns: 1 }))
  add(cat, 'route a bad ChatMessage', IA, false, async (ctx) => (await ctx.shared()).route([{ role: 'user' }]))
  add(cat, 'route 10k turns, every one', [], true, async (ctx) => (await ctx.shared()).route(Array.from({ length: 10_000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: 'sql table '.repeat(20) })), { historyTurns: 2 ** 32 - 1 }))
  for (const [n, t] of TEXTS) add(cat, `route ${n}`, [], true, async (ctx) => (await ctx.shared()).route(t()))
  for (const [n, v] of NON_STRINGS.filter(([k]) => k !== 'array')) add(cat, `embed texts ${n}`, IA, false, async (ctx) => (await ctx.shared()).embed(v))
  for (const [n, v, expect, ok] of [
    ['[5]', [5], IA, false], ['[null]', [null], IA, false], ['sparse', Array(2), IA, false], ["['']", [''], IA, false], ['[]', [], IA, true],
    ['65537 texts', lazy(() => Array(65_537).fill('a')), IA, false], ['2000 texts', lazy(() => Array(2000).fill('a b c')), IA, true],
    ['2 MB text', lazy(() => ['a '.repeat(1 << 20)]), ['CONTEXT_OVERFLOW'], false], ['1 MB mixed text', lazy(() => [bigText(1 << 20)]), ['CONTEXT_OVERFLOW'], false],
    ['specials', ['<|im_start|><|im_end|>'], IA, true], ['NUL and surrogates', ['\u0000\ud800\udfff'], IA, true],
  ]) add(cat, `embed ${n}`, expect, ok, async (ctx) => (await ctx.shared()).embed(v?.[LAZY] ? v[LAZY]() : v))
  for (const [n, v] of NON_OBJECTS) add(cat, `embed options ${n}`, IA, false, async (ctx) => (await ctx.shared()).embed(['a'], v))
  for (const [n, o, expect] of [
    ['pooling max', { pooling: 'max' }, IA], ['pooling null', { pooling: null }, IA], ['normalize string', { normalize: 'yes' }, IA], ['experts string', { experts: 'lora' }, IA],
    ['experts unknown', { experts: ['nope'] }, ['EXPERT_NOT_FOUND']], ['unknown option', { normalise: true }, IA],
  ]) add(cat, `embed ${n}`, expect, false, async (ctx) => (await ctx.shared()).embed(['a'], o))
  add(cat, 'embed under every adapter kind', [], true, async (ctx) => {
    const names = []
    for (const a of ['lora', 'dora', 'ia3', 'lokr', 'prompt']) names.push((await ctx.loadExpert(fx('adapters', a))).name)
    for (const name of names) await (await ctx.shared()).embed(['hello there', 'x'], { experts: [name], pooling: 'last' })
  })
  add(cat, 'embed while 20 sessions generate', [], true, async (ctx) => {
    const rt = await ctx.shared()
    const runs = Array.from({ length: 20 }, async () => (await ctx.session()).complete({ tokens: PROMPT }, { maxTokens: 12 }))
    await Promise.all([...runs, rt.embed(Array(50).fill('some words to embed'))])
  })
  for (const [n, v] of NON_OBJECTS) add(cat, `setRouter ${n}`, IA, false, async (ctx) => (await ctx.load(MODEL)).setRouter(v))
  for (const field of ['threshold', 'maxExperts', 'historyTurns', 'genericMinKeywordHits']) {
    for (const [n, v, kind] of NUMS) {
      const ok = field === 'threshold' ? typeof v === 'number' && Number.isFinite(v) : isU32(kind, v) && (field !== 'maxExperts' || (v >= 1 && v <= 64))
      add(cat, `setRouter ${field} ${n}`, IA, ok, async (ctx) => (await ctx.load(MODEL)).setRouter({ [field]: v }))
    }
  }
  for (const [n, v, ok] of [
    ['[]', [], true], ['invalid regex', ['('], false], ['300 patterns', lazy(() => Array(300).fill('a')), false], ['a 5 kB pattern', lazy(() => ['a'.repeat(5000)]), false],
    ['huge repetition', ['\\w{1000}{1000}'], false], ['[5]', [5], false], ['string', 'hi', false], ['catastrophic (a+)+$', ['(a+)+$'], true],
  ]) {
    add(cat, `setRouter genericPatterns ${n}`, IA, ok, async (ctx) => {
      const rt = await ctx.load(MODEL)
      rt.setRouter({ genericPatterns: v?.[LAZY] ? v[LAZY]() : v })
      await rt.route('a'.repeat(50_000) + '!')
    })
  }
  for (const [n, w] of [['null', null], ['NaN', { keywords: NaN }], ['string', { similarity: '1' }], ['unknown', { keyword: 1 }], ['array', []]]) {
    add(cat, `setRouter weights ${n}`, IA, false, async (ctx) => (await ctx.load(MODEL)).setRouter({ weights: w }))
  }
  add(cat, 'setRouter unknown options', IA, false, async (ctx) => (await ctx.load(MODEL)).setRouter({ speed: 1 }))
  add(cat, "complete experts 'auto' without experts", IA, true, async (ctx) => (await ctx.session()).complete('How many users?', { maxTokens: 2, experts: 'auto' }))
  add(cat, "createSession experts 'auto', then turns", IA, true, async (ctx) => {
    const s = await ctx.session({ experts: 'auto' })
    await s.complete('How many users?', { maxTokens: 2 })
    await s.complete({ text: 'more' }, { maxTokens: 2 })
    await s.complete({ tokens: PROMPT }, { maxTokens: 2 })
  })
  add(cat, "createSession experts 'AUTO'", IA, false, async (ctx) => ctx.session({ experts: 'AUTO' }))
  add(cat, "setExperts 'auto' while generating", ['SESSION_BUSY'], false, async (ctx) => {
    const s = await ctx.session()
    const g = s.generate({ tokens: PROMPT }, { maxTokens: 400, temperature: 0 })
    try {
      s.setExperts('auto')
    } finally {
      g.cancel()
      for await (const _ of g) {
        /* drain */
      }
    }
  })
  add(cat, 'every adapter kind composed', [], true, async (ctx) => {
    const names = []
    for (const a of ['lora', 'lora2', 'rslora', 'lora_patterns', 'dora', 'ia3', 'lokr', 'lokr_both', 'prompt']) names.push((await ctx.loadExpert(fx('adapters', a))).name)
    await (await ctx.session()).complete({ tokens: PROMPT }, { maxTokens: 3, experts: names, temperature: 0 })
  })
}
