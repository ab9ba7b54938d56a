// Experts through the public API on the tiny fixtures (__test__/fixtures/adapters, written by
// scripts/gen_adapters.py with PEFT references): PEFT parity end to end for every kind and for
// two LoRAs together, metadata, session and request selection, KV invalidation on a change of
// set, pinning across unload, hot-swapping under load, and every adapter error.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { collect, FIXTURES, fixtureJson, GREEDY, LOGPROB_TOL } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime, Expert } = require('../dist/index.js')

const ADAPTERS = path.join(FIXTURES, 'adapters')
const REF = fixtureJson('adapters', 'reference.json')

const adapter = (name) => path.join(ADAPTERS, name)

function assertSteps(chunks, steps, what) {
  assert.deepEqual(
    chunks.map((c) => c.tokenId),
    steps.map((s) => s.token),
    `${what}: greedy tokens differ from PEFT`,
  )
  chunks.forEach((c, i) => {
    const d = Math.abs(c.logprob - steps[i].logprob)
    assert.ok(d <= LOGPROB_TOL, `${what} step ${i}: logprob ${c.logprob} vs PEFT ${steps[i].logprob} (|d| = ${d})`)
  })
}

async function expectCode(promiseOrFn, code, pattern) {
  let err
  try {
    const r = typeof promiseOrFn === 'function' ? promiseOrFn() : promiseOrFn
    if (r && typeof r.then === 'function') await r
  } catch (e) {
    err = e
  }
  assert.ok(err, `expected ${code}, nothing was thrown`)
  assert.equal(err.code, code, `expected ${code}, got ${err.code}: ${err.message}`)
  if (pattern) assert.match(err.message, pattern)
  return err
}

/** Greedy run of `{ tokens }` on a fresh session. */
async function run(rt, tokens, experts, n) {
  const s = rt.createSession()
  try {
    return await collect(s.generate({ tokens }, { ...GREEDY, maxTokens: n, experts }))
  } finally {
    s.dispose()
  }
}

// ---------------------------------------------------------------------------------------------
// PEFT parity through the binding.
// ---------------------------------------------------------------------------------------------

describe('experts match PEFT end to end', () => {
  const byBase = {}
  for (const [name, c] of Object.entries(REF.cases)) (byBase[c.base] ??= []).push([name, c])
  for (const [base, cases] of Object.entries(byBase)) {
    describe(base, () => {
      let rt
      before(async () => {
        rt = await Runtime.load(path.join(FIXTURES, base))
        const names = new Set(cases.flatMap(([, c]) => c.experts))
        for (const n of names) await rt.loadExpert(adapter(n), { name: n })
      })
      after(async () => rt?.dispose())
      for (const [name, c] of cases) {
        it(`${name}: identical greedy tokens, |Δlogprob| ≤ 1e-4`, async () => {
          const { chunks, result } = await run(rt, c.prompt_ids, c.experts, c.steps.length)
          assertSteps(chunks, c.steps, name)
          assert.equal(result.finishReason, 'length')
        })
      }
    })
  }

  it('an expert on a GGUF base (q/k rows permuted for interleaved RoPE) matches PEFT', async () => {
    const rt = await Runtime.load(path.join(FIXTURES, 'llama-tiny', 'model-f32.gguf'))
    try {
      for (const name of ['lora_llama', 'dora_llama']) {
        await rt.loadExpert(adapter(name))
        const c = REF.cases[name]
        const { chunks } = await run(rt, c.prompt_ids, [name], c.steps.length)
        assertSteps(chunks, c.steps, `${name} on GGUF`)
      }
    } finally {
      await rt.dispose()
    }
  })
})

describe('experts copied into memory (mmap: false) match PEFT as the mapped ones do', () => {
  for (const name of ['lora', 'dora']) {
    it(name, async () => {
      const c = REF.cases[name]
      const rt = await Runtime.load(path.join(FIXTURES, c.base))
      try {
        for (const n of c.experts) await rt.loadExpert(adapter(n), { name: n, mmap: false })
        assertSteps((await run(rt, c.prompt_ids, c.experts, c.steps.length)).chunks, c.steps, `${name}, copied`)
      } finally {
        await rt.dispose()
      }
    })
  }
})

// ---------------------------------------------------------------------------------------------
// The Expert object and the registry.
// ---------------------------------------------------------------------------------------------

describe('Expert', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(path.join(FIXTURES, 'qwen3-tiny'))
  })
  after(async () => rt?.dispose())

  it('describes the adapter', async () => {
    const e = await rt.loadExpert(adapter('lora'))
    try {
      assert.ok(e instanceof Expert)
      assert.equal(e.name, 'lora') // from manifest.json
      assert.equal(e.kind, 'lora')
      assert.equal(e.rank, 4)
      assert.deepEqual(e.targetModules, ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'])
      // f32 on CPU: A and B of every module, nothing else, read in place from the file (on a
      // GPU they are copied to the device).
      const st = readFileSync(path.join(adapter('lora'), 'adapter_model.safetensors'))
      const headerLen = Number(st.readBigUInt64LE(0))
      assert.equal(e.bytes, st.length - 8 - headerLen)
      assert.equal(e.mappedBytes, rt.info.device === 'cpu' ? e.bytes : 0)
      assert.equal(e.manifest.version, '1.0.0')
      assert.deepEqual(e.manifest.routing.keywords, ['sql'])
      assert.equal(e.loaded, true)
      assert.deepEqual(rt.experts, [e])
      assert.equal(JSON.stringify(e).includes('"kind":"lora"'), true)
      const copied = await rt.loadExpert(adapter('lora'), { name: 'lora-copied', mmap: false })
      assert.deepEqual([copied.bytes, copied.mappedBytes], [e.bytes, 0])
      await copied.unload()
    } finally {
      await e.unload()
    }
    assert.equal(e.loaded, false)
    assert.deepEqual(rt.experts, [])
    await e.unload() // idempotent
  })

  it('reports kind and rank for every kind; a name option overrides the manifest', async () => {
    const want = { dora: ['dora', 4], ia3: ['ia3', null], lokr: ['lokr', 4], lokr_both: ['lokr', 2], prompt: ['prompt', null], rslora: ['lora', 8] }
    const loaded = []
    for (const [dir, [kind, rank]] of Object.entries(want)) {
      const e = await rt.loadExpert(adapter(dir), { name: `x-${dir}` })
      loaded.push(e)
      assert.equal(e.name, `x-${dir}`)
      assert.equal(e.kind, kind, dir)
      assert.equal(e.rank, rank, dir)
      assert.ok(e.bytes > 0)
      assert.equal(e.numVirtualTokens, dir === 'prompt' ? 4 : 0)
      assert.equal(e.manifest, null)
    }
    assert.deepEqual(rt.experts.map((e) => e.name), loaded.map((e) => e.name))
    for (const e of loaded) await e.unload()
  })

  it('refuses a second expert under a loaded name, and accepts it once unloaded', async () => {
    const a = await rt.loadExpert(adapter('lora2'), { name: 'dup' })
    await expectCode(rt.loadExpert(adapter('lora'), { name: 'dup' }), 'INVALID_ARGUMENT', /already loaded/)
    await a.unload()
    const b = await rt.loadExpert(adapter('lora'), { name: 'dup' })
    assert.notEqual(b, a)
    await b.unload()
  })

  it('scale multiplies the effect; scale 0 gives the base model', async () => {
    const c = REF.cases['qwen3-tiny']
    const zero = await rt.loadExpert(adapter('lora'), { name: 'zero', scale: 0 })
    const { chunks } = await run(rt, c.prompt_ids, ['zero'], c.steps.length)
    assertSteps(chunks, c.steps, 'scale 0')
    await zero.unload()
  })
})

// ---------------------------------------------------------------------------------------------
// Selection, caching and lifetime.
// ---------------------------------------------------------------------------------------------

describe('selecting experts', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(path.join(FIXTURES, 'qwen3-tiny'))
    for (const n of ['lora', 'lora2', 'dora', 'ia3', 'lokr', 'prompt']) await rt.loadExpert(adapter(n), { name: n })
  })
  after(async () => rt?.dispose())

  it('a session default set applies, and a request can override it (including [] for the base)', async () => {
    const c = REF.cases.lora
    const s = rt.createSession({ experts: ['lora'] })
    assert.deepEqual(s.experts, ['lora'])
    assertSteps((await collect(s.generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: 12 }))).chunks, c.steps, 'session default')
    s.reset()
    const d = REF.cases.dora
    assertSteps((await collect(s.generate({ tokens: d.prompt_ids }, { ...GREEDY, maxTokens: 12, experts: ['dora'] }))).chunks, d.steps, 'override')
    s.reset()
    const b = REF.cases['qwen3-tiny']
    assertSteps((await collect(s.generate({ tokens: b.prompt_ids }, { ...GREEDY, maxTokens: 12, experts: [] }))).chunks, b.steps, 'base')
    assert.deepEqual(s.experts, ['lora'], 'a request override does not change the default')
    s.dispose()
  })

  it('changing the set re-evaluates the conversation under the new set; keeping it reuses the cache', async () => {
    // A system prompt no other test uses: nothing in the shared prefix cache matches it.
    const s = rt.createSession({ system: 'Be brief, set test.', experts: ['lora'] })
    const r1 = await s.complete('Tell me about robots.', { ...GREEDY, maxTokens: 6 })
    assert.equal(r1.usage.cachedTokens, 0)
    const r2 = await s.complete('And then?', { ...GREEDY, maxTokens: 6 })
    assert.ok(r2.usage.cachedTokens > 0, 'same set: the earlier turn is reused')
    s.setExperts(['lokr', 'ia3'])
    assert.deepEqual(s.experts, ['lokr', 'ia3'])
    const history = s.history
    const r3 = await s.complete('More.', { ...GREEDY, maxTokens: 6 })
    assert.equal(r3.usage.cachedTokens, 0, 'new set: nothing computed under the old set is reused')
    // Same conversation, fresh session under the new set: same answer.
    const fresh = rt.createSession({ experts: ['lokr', 'ia3'] })
    const want = await fresh.complete([...history, { role: 'user', content: 'More.' }], { ...GREEDY, maxTokens: 6 })
    assert.deepEqual(r3.tokens, want.tokens)
    assert.equal(r3.usage.promptTokens, want.usage.promptTokens)
    // A request-level set other than the cached one invalidates too, and so does going back:
    // only blocks computed under 'lora' (turns 1–2, still in the prefix cache) can be reused,
    // never the third turn, which only ever ran under the other set.
    const r4 = await s.complete('Again.', { ...GREEDY, maxTokens: 4, experts: ['lora'] })
    assert.ok(r4.usage.cachedTokens <= r2.usage.promptTokens + r2.usage.completionTokens - 1, `cachedTokens ${r4.usage.cachedTokens}`)
    const cold = rt.createSession({ experts: ['lora'] })
    const want4 = await cold.complete(s.history.slice(0, -1), { ...GREEDY, maxTokens: 4 })
    assert.deepEqual(r4.tokens, want4.tokens)
    cold.dispose()
    const r5 = await s.complete('Once more.', { ...GREEDY, maxTokens: 4, experts: ['lora'] })
    assert.ok(r5.usage.cachedTokens > 0)
    s.dispose()
    fresh.dispose()
  })

  it('prompt tuning keeps its virtual tokens cached across turns', async () => {
    const s = rt.createSession({ experts: ['prompt'] })
    const fresh = rt.createSession({ experts: ['prompt'] })
    await s.complete('Hello there.', { ...GREEDY, maxTokens: 5 })
    const history = s.history
    const r = await s.complete('Next.', { ...GREEDY, maxTokens: 5 })
    assert.ok(r.usage.cachedTokens > 0)
    const want = await fresh.complete([...history, { role: 'user', content: 'Next.' }], { ...GREEDY, maxTokens: 5 })
    assert.deepEqual(r.tokens, want.tokens)
    s.dispose()
    fresh.dispose()
  })

  it('the set cannot change while the session generates (SESSION_BUSY), and a request keeps the set it started with', async () => {
    const c = REF.cases.lora
    const s = rt.createSession({ experts: ['lora'] })
    // No maxTokens: greedy runs to the end of the context (500 tokens, ~130 ms here), so the
    // engine cannot finish the request between generate() and the check below, as 12 tokens
    // (~7 ms) once did on a loaded machine.
    const stream = s.generate({ tokens: c.prompt_ids }, GREEDY)
    // generate() marks the session busy synchronously; the engine clears it when the request ends.
    assert.throws(() => s.setExperts(['dora']), (e) => e.code === 'SESSION_BUSY')
    assert.deepEqual(s.experts, ['lora'])
    const it = stream[Symbol.asyncIterator]()
    const got = []
    while (got.length < c.steps.length) got.push((await it.next()).value)
    await it.return() // cancels and waits for the engine to release the session
    assertSteps(got, c.steps, 'pinned')
    s.setExperts(['dora']) // allowed once idle
    s.dispose()
  })

  it('unload: running requests keep the expert; later use fails with EXPERT_NOT_FOUND', async () => {
    const e = await rt.loadExpert(adapter('lora2'), { name: 'temp' })
    const c = REF.cases.lora2
    const s = rt.createSession({ experts: ['temp'] })
    const stream = s.generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: 12 })
    const it = stream[Symbol.asyncIterator]()
    const got = [(await it.next()).value]
    await e.unload()
    assert.equal(rt.experts.some((x) => x.name === 'temp'), false)
    for (let r = await it.next(); !r.done; r = await it.next()) got.push(r.value)
    assertSteps(got, c.steps, 'pinned across unload')
    // The session's default set names it: its next request fails, and nothing else breaks.
    const err = await expectCode(s.complete('hi', { maxTokens: 2 }), 'EXPERT_NOT_FOUND', /temp/)
    assert.match(err.message, /loaded: \[/)
    await expectCode(() => rt.createSession({ experts: ['temp'] }), 'EXPERT_NOT_FOUND')
    await expectCode(() => s.setExperts(['temp']), 'EXPERT_NOT_FOUND')
    s.setExperts([])
    const ok = await s.complete('hi', { ...GREEDY, maxTokens: 2 })
    assert.equal(ok.finishReason, 'length')
    s.dispose()
  })

  it('rejects a name listed twice and non-string names', async () => {
    const s = rt.createSession()
    await expectCode(s.complete('hi', { experts: ['lora', 'lora'] }), 'INVALID_ARGUMENT', /twice/)
    await expectCode(s.complete('hi', { experts: 'lora' }), 'INVALID_ARGUMENT')
    await expectCode(() => rt.createSession({ experts: [1] }), 'INVALID_ARGUMENT')
    s.dispose()
  })

  it('hot-swap under load: two sessions alternate experts across 50 requests, each equal to a fresh single-expert run', async () => {
    const sets = [['lora'], ['dora'], ['ia3'], ['lokr'], ['prompt'], []]
    const questions = ['Hi.', 'What is a robot?', 'Tell me more.', 'Why?', 'Go on.']
    const runs = [] // [session label, history before, question, set, tokens]
    async function drive(label, offset) {
      const s = rt.createSession({ system: `Session ${label}.` })
      for (let i = 0; i < 25; i++) {
        if (i % 5 === 0) s.reset()
        const set = sets[(i + offset) % sets.length]
        const q = questions[i % questions.length]
        const before = s.history
        const r = await s.complete(q, { ...GREEDY, maxTokens: 4, experts: set })
        runs.push([label, before, q, set, r.tokens])
      }
      s.dispose()
    }
    await Promise.all([drive('A', 0), drive('B', 3)])
    assert.equal(runs.length, 50)
    for (const [label, before, q, set, tokens] of runs) {
      const fresh = rt.createSession({ experts: set })
      const want = await fresh.complete([...before, { role: 'user', content: q }], { ...GREEDY, maxTokens: 4 })
      fresh.dispose()
      assert.deepEqual(tokens, want.tokens, `session ${label}, set ${JSON.stringify(set)}, after ${before.length} messages`)
    }
  })
})

// ---------------------------------------------------------------------------------------------
// Bad adapters: clear codes, the runtime keeps working.
// ---------------------------------------------------------------------------------------------

/** A safetensors file from `{ name: { shape, data: Float32Array } }`. */
function writeSafetensors(file, tensors) {
  const header = { __metadata__: { format: 'pt' } }
  let off = 0
  for (const [k, t] of Object.entries(tensors)) {
    header[k] = { dtype: 'F32', shape: t.shape, data_offsets: [off, off + t.data.byteLength] }
    off += t.data.byteLength
  }
  let json = JSON.stringify(header)
  json += ' '.repeat((8 - (json.length % 8)) % 8)
  const len = Buffer.alloc(8)
  len.writeBigUInt64LE(BigInt(json.length))
  writeFileSync(file, Buffer.concat([len, Buffer.from(json), ...Object.values(tensors).map((t) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength))]))
}

function readSafetensors(file) {
  const buf = readFileSync(file)
  const n = Number(buf.readBigUInt64LE(0))
  const header = JSON.parse(buf.subarray(8, 8 + n).toString())
  const out = {}
  for (const [k, v] of Object.entries(header)) {
    if (k === '__metadata__') continue
    const bytes = buf.subarray(8 + n + v.data_offsets[0], 8 + n + v.data_offsets[1])
    out[k] = { shape: v.shape, data: new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength)) }
  }
  return out
}

describe('bad adapters', () => {
  let rt
  let tmp
  before(async () => {
    rt = await Runtime.load(path.join(FIXTURES, 'qwen3-tiny'))
    tmp = mkdtempSync(path.join(os.tmpdir(), 'expert-runtime-adapters-'))
  })
  after(async () => {
    await rt?.dispose()
    if (tmp) rmSync(tmp, { recursive: true, force: true })
  })

  /** A copy of a fixture adapter, changed by `edit(dir)`. */
  function variant(name, from, edit) {
    const dir = path.join(tmp, name)
    cpSync(adapter(from), dir, { recursive: true })
    edit(dir)
    return dir
  }
  const editConfig = (dir, f) => {
    const p = path.join(dir, 'adapter_config.json')
    writeFileSync(p, JSON.stringify(f(JSON.parse(readFileSync(p, 'utf8')))))
  }
  const editTensors = (dir, f) => {
    const p = path.join(dir, 'adapter_model.safetensors')
    writeSafetensors(p, f(readSafetensors(p)))
  }
  const KEY = 'base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight'

  const cases = [
    ['a missing directory', () => path.join(tmp, 'nope'), 'EXPERT_NOT_FOUND', /no adapter/],
    ['another PEFT type', () => variant('loha', 'lora', (d) => editConfig(d, (c) => ({ ...c, peft_type: 'LOHA' }))), 'UNSUPPORTED_ADAPTER', /LOHA/],
    ['LoRA with trained biases', () => variant('bias', 'lora', (d) => editConfig(d, (c) => ({ ...c, bias: 'all' }))), 'UNSUPPORTED_ADAPTER', /bias/],
    ['rank 0', () => variant('r0', 'lora', (d) => editConfig(d, (c) => ({ ...c, r: 0 }))), 'INVALID_ADAPTER', /\br must be a positive integer/],
    ['a missing tensor', () => variant('missing', 'lora', (d) => editTensors(d, (t) => { delete t[KEY]; return t })), 'INVALID_ADAPTER', new RegExp(`missing tensor ${KEY.replaceAll('.', '\\.')}`)],
    ['a wrong shape', () => variant('shape', 'lora', (d) => editTensors(d, (t) => { t[KEY] = { shape: [32, 4], data: new Float32Array(128) }; return t })), 'INVALID_ADAPTER', /v_proj\.lora_B\.weight has shape \[32, ?4\]/],
    ['a rank that disagrees with the config', () => variant('rank', 'lora', (d) => editConfig(d, (c) => ({ ...c, r: 8 }))), 'INVALID_ADAPTER', /lora_A\.weight has shape \[4, ?64\], expected \[8, ?64\]/],
    ['an unexpected tensor', () => variant('extra', 'lora', (d) => editTensors(d, (t) => ({ ...t, 'base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight': { shape: [2], data: new Float32Array(2) } }))), 'INVALID_ADAPTER', /lora_C/],
    ['a layer the model does not have', () => variant('layer', 'lora', (d) => editTensors(d, (t) => ({ ...t, 'base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight': { shape: [4, 64], data: new Float32Array(256) } }))), 'INVALID_ADAPTER', /layer 9/],
    ['a corrupt weights file', () => variant('corrupt', 'lora', (d) => writeFileSync(path.join(d, 'adapter_model.safetensors'), Buffer.from('garbage, not safetensors'))), 'INVALID_ADAPTER', /adapter_model\.safetensors/],
    ['a truncated weights file', () => variant('trunc', 'lora', (d) => { const p = path.join(d, 'adapter_model.safetensors'); writeFileSync(p, readFileSync(p).subarray(0, 5000)) }), 'INVALID_ADAPTER', /adapter_model\.safetensors/],
    ['no weights file', () => variant('noweights', 'lora', (d) => rmSync(path.join(d, 'adapter_model.safetensors'))), 'INVALID_ADAPTER', /missing/],
    ['no config', () => variant('noconfig', 'lora', (d) => rmSync(path.join(d, 'adapter_config.json'))), 'INVALID_ADAPTER', /adapter_config\.json/],
    ['a config that is not JSON', () => variant('badjson', 'lora', (d) => writeFileSync(path.join(d, 'adapter_config.json'), '{oops')), 'INVALID_ADAPTER', /adapter_config\.json/],
    ['targets that match nothing', () => variant('nomatch', 'lora', (d) => editConfig(d, (c) => ({ ...c, target_modules: ['c_attn'] }))), 'INVALID_ADAPTER', /selects none/],
    ['embedding targets', () => variant('embed', 'lora', (d) => editConfig(d, (c) => ({ ...c, target_modules: ['embed_tokens'] }))), 'UNSUPPORTED_ADAPTER', /embed_tokens/],
    ['a manifest naming another model size', () => variant('big', 'lora', (d) => writeFileSync(path.join(d, 'manifest.json'), JSON.stringify({ name: 'big', base_model: 'Qwen/Qwen3-0.6B' }))), 'INVALID_ADAPTER', /600M params \(Qwen\/Qwen3-0\.6B\)/],
    ['a manifest naming another architecture', () => variant('arch', 'lora', (d) => writeFileSync(path.join(d, 'manifest.json'), JSON.stringify({ base_model: { architecture: 'llama' } }))), 'INVALID_ADAPTER', /architecture llama/],
    ['a manifest with another hidden size', () => variant('hidden', 'lora', (d) => writeFileSync(path.join(d, 'manifest.json'), JSON.stringify({ base_model: { architecture: 'qwen3', hidden_size: 1024 } }))), 'INVALID_ADAPTER', /hidden_size 1024/],
    ['an adapter trained on another architecture', () => variant('class', 'lora', (d) => editConfig(d, (c) => ({ ...c, auto_mapping: { base_model_class: 'LlamaForCausalLM' } }))), 'INVALID_ADAPTER', /LlamaForCausalLM/],
    ['prompt tuning for another hidden size', () => variant('ptdim', 'prompt', (d) => editTensors(d, () => ({ prompt_embeddings: { shape: [4, 32], data: new Float32Array(128) } }))), 'INVALID_ADAPTER', /prompt_embeddings has shape \[4, ?32\]/],
    ['a LoKr factor that does not fit', () => variant('lokrfit', 'lokr', (d) => editTensors(d, (t) => { t['base_model.model.model.layers.0.self_attn.k_proj.lokr_w1'] = { shape: [4, 8], data: new Float32Array(32) }; return t })), 'INVALID_ADAPTER', /lokr_w1/],
    ['an IA³ vector of the wrong length', () => variant('ia3len', 'ia3', (d) => editTensors(d, (t) => { t['base_model.model.model.layers.0.mlp.down_proj.ia3_l'] = { shape: [1, 64], data: new Float32Array(64) }; return t })), 'INVALID_ADAPTER', /down_proj\.ia3_l has shape/],
    // Trained on another model: the message names that model and this one, not only a shape.
    ['an adapter trained on another base', () => path.join(FIXTURES, 'adapters', 'lora_qwen2'), 'INVALID_ADAPTER', /^this adapter was trained for __test__\/fixtures\/qwen2-tiny, not for the model this runtime runs \(a qwen3 model with hidden size 64, 3 layers\); load it on its own base model \(tensor .* has shape/],
    // A file instead of an adapter directory: what it is and what to pass.
    ['a GGUF file', () => path.join(FIXTURES, 'qwen3-tiny', 'model-q8_0.gguf'), 'UNSUPPORTED_ADAPTER', /model-q8_0\.gguf is a GGUF file; experts are PEFT adapter directories/],
    ["the adapter's weights file", () => path.join(FIXTURES, 'adapters', 'lora', 'adapter_model.safetensors'), 'INVALID_ADAPTER', /is a file; pass the adapter's directory/],
  ]
  for (const [what, make, code, pattern] of cases) {
    it(`${what}: ${code}`, async () => {
      await expectCode(rt.loadExpert(make()), code, pattern)
      assert.deepEqual(rt.experts, [])
    })
  }

  it('a non-finite weight: INVALID_ADAPTER when copied (mmap: false, or a GPU); read in place, it loads and nothing fails', async () => {
    const dir = variant('nan', 'lora', (d) => editTensors(d, (t) => { t[KEY].data[3] = NaN; return t }))
    await expectCode(rt.loadExpert(dir, { mmap: false }), 'INVALID_ADAPTER', /non-finite value at element 3/)
    assert.deepEqual(rt.experts, [])
    if (rt.info.device !== 'cpu') {
      // Adapters on a GPU are always copied, so always checked.
      await expectCode(rt.loadExpert(dir), 'INVALID_ADAPTER', /non-finite value at element 3/)
      return
    }
    const e = await rt.loadExpert(dir)
    const c = REF.cases.lora
    const { chunks } = await run(rt, c.prompt_ids, [e.name], 4)
    assert.equal(chunks.length, 4)
    await e.unload()
  })

  it('f32 data the header leaves misaligned is copied, not mapped, and gives the same tokens', async () => {
    const dir = variant('misaligned', 'lora', (d) => {
      const p = path.join(d, 'adapter_model.safetensors')
      const bytes = readFileSync(p)
      const n = Number(bytes.readBigUInt64LE(0))
      // Pad the header with spaces (valid JSON) so that the data starts 2 bytes past a multiple of 4.
      const pad = (((2 - ((8 + n) % 4)) % 4) + 4) % 4 || 4
      const header = Buffer.concat([bytes.subarray(8, 8 + n), Buffer.alloc(pad, ' ')])
      const len = Buffer.alloc(8)
      len.writeBigUInt64LE(BigInt(header.length))
      writeFileSync(p, Buffer.concat([len, header, bytes.subarray(8 + n)]))
    })
    const e = await rt.loadExpert(dir, { name: 'misaligned' })
    try {
      assert.equal(e.mappedBytes, 0)
      const c = REF.cases.lora
      assertSteps((await run(rt, c.prompt_ids, ['misaligned'], c.steps.length)).chunks, c.steps, 'misaligned lora')
    } finally {
      await e.unload()
    }
  })

  it('the runtime keeps working after every failure', async () => {
    const c = REF.cases['qwen3-tiny']
    const { chunks } = await run(rt, c.prompt_ids, [], c.steps.length)
    assertSteps(chunks, c.steps, 'base after failures')
    const e = await rt.loadExpert(adapter('lora'))
    const l = REF.cases.lora
    assertSteps((await run(rt, l.prompt_ids, ['lora'], 12)).chunks, l.steps, 'lora after failures')
    await e.unload()
  })

  it('rejects bad arguments', async () => {
    await expectCode(rt.loadExpert(''), 'INVALID_ARGUMENT')
    await expectCode(rt.loadExpert(adapter('lora'), { scale: NaN }), 'INVALID_ARGUMENT')
    await expectCode(rt.loadExpert(adapter('lora'), { name: '' }), 'INVALID_ARGUMENT')
    await expectCode(rt.loadExpert(adapter('lora'), { mmap: 'yes' }), 'INVALID_ARGUMENT', /mmap/)
    await expectCode(rt.loadExpert(adapter('prompt'), { scale: 2 }), 'INVALID_ARGUMENT', /prompt-tuning/)
  })

  it('a disposed runtime refuses loadExpert with DISPOSED', async () => {
    const r2 = await Runtime.load(path.join(FIXTURES, 'qwen3-tiny'))
    await r2.dispose()
    await expectCode(r2.loadExpert(adapter('lora')), 'DISPOSED')
  })
})
