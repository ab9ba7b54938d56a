// Hostile input: every case must fail with an ExpertRuntimeError and its code, and leave the
// process (and the runtime) working. Cases that used to abort the process in the allocator
// run in a child process under an address-space limit, so a regression fails one test
// instead of taking the test runner (or the machine) down.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fixture, GREEDY, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime, ExpertRuntimeError } = require('../dist/index.js')
const DIST = path.resolve(fixture('..', '..', 'dist', 'index.js'))
const MODEL = fixture('qwen3-tiny')
const ref = reference('qwen3-tiny')

let tmp
before(async () => {
  tmp = await fs.promises.mkdtemp(path.join(os.tmpdir(), 'expert-runtime-hardening-'))
})
after(async () => {
  if (tmp) await fs.promises.rm(tmp, { recursive: true, force: true })
})

/** Asserts that `p` (a promise or a function) fails with an ExpertRuntimeError of `code`. */
async function expectCode(p, code) {
  let err
  try {
    await (typeof p === 'function' ? p() : p)
  } catch (e) {
    err = e
  }
  assert.ok(err instanceof ExpertRuntimeError, `expected ${code}, got ${err?.name}: ${err?.message}`)
  assert.equal(err.code, code, err.message)
  return err
}

/** A copy of the tiny Qwen3 fixture with `edit(dir)` applied. */
async function modelCopy(edit) {
  const dir = await fs.promises.mkdtemp(path.join(tmp, 'model-'))
  await fs.promises.cp(MODEL, dir, { recursive: true })
  await edit(dir)
  return dir
}

const editConfig = (f) => async (dir) => {
  const p = path.join(dir, 'config.json')
  const cfg = JSON.parse(await fs.promises.readFile(p, 'utf8'))
  f(cfg)
  await fs.promises.writeFile(p, JSON.stringify(cfg))
}

/**
 * Runs `body` (an async function body with `Runtime` and `model` in scope) in a child Node
 * under a 16 GiB address-space limit and a time limit; returns what it printed. The child
 * must exit normally.
 */
function inChild(body, model = MODEL) {
  const script = `const { Runtime } = require(${JSON.stringify(DIST)}); const model = ${JSON.stringify(model)};
    (async () => { ${body} })().then(() => process.exit(0), (e) => { console.log('UNCAUGHT', e && e.code, e && e.message); process.exit(3) })`
  const r = spawnSync('sh', ['-c', `ulimit -v 16777216; exec "${process.execPath}" -e "$0"`, script], { encoding: 'utf8', timeout: 60_000 })
  assert.equal(r.signal, null, `child killed by ${r.signal}: ${r.stderr}`)
  assert.equal(r.status, 0, `child exited ${r.status}: ${r.stdout}${r.stderr}`)
  return r.stdout.trim()
}

/** The child prints the code its load fails with. */
const loadCodeInChild = (options, model = MODEL) =>
  inChild(
    `try { const rt = await Runtime.load(model, ${JSON.stringify(options)}); await rt.dispose(); console.log('LOADED') } catch (e) { console.log(e.code) }`,
    model,
  )

describe('sizes from options and files are checked before anything is allocated', () => {
  it('kvCache.maxTokens far beyond the machine → INVALID_ARGUMENT, no abort', () => {
    for (const maxTokens of [1e8, 1e10, 1e12]) {
      assert.equal(loadCodeInChild({ kvCache: { maxTokens } }), 'INVALID_ARGUMENT', `maxTokens ${maxTokens}`)
    }
  })

  it('absurd layer, context and dimension counts in config.json → INVALID_MODEL, no abort', async () => {
    const cases = [
      ['num_hidden_layers 1e9', (c) => (c.num_hidden_layers = 1e9)],
      ['max_position_embeddings 1e9', (c) => (c.max_position_embeddings = 1e9)],
      ['max_position_embeddings 2^63', (c) => (c.max_position_embeddings = 2 ** 63)],
      ['max_position_embeddings 0', (c) => (c.max_position_embeddings = 0)],
      ['hidden_size 1e12', (c) => (c.hidden_size = 1e12)],
      ['rope_theta 0', (c) => (c.rope_theta = 0)],
      ['rope_theta -1', (c) => (c.rope_theta = -1)],
      ['rope_theta 1e400 (Infinity)', (c) => (c.rope_theta = 'INF')],
      ['rms_norm_eps -1', (c) => (c.rms_norm_eps = -1)],
    ]
    for (const [what, f] of cases) {
      const dir = await modelCopy(async (d) => {
        await editConfig(f)(d)
        // JSON cannot hold Infinity: write the literal the way a hostile file would.
        const p = path.join(d, 'config.json')
        await fs.promises.writeFile(p, (await fs.promises.readFile(p, 'utf8')).replace('"INF"', '1e400'))
      })
      assert.equal(loadCodeInChild({}, dir), 'INVALID_MODEL', what)
    }
  })

  it('threads beyond a few per core → INVALID_ARGUMENT', async () => {
    await expectCode(Runtime.load(MODEL, { threads: 1e6 }), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, { threads: os.availableParallelism() * 4 + 1 }), 'INVALID_ARGUMENT')
  })
})

describe('generation_config.json', () => {
  it('a default no request could use fails the load with INVALID_MODEL', async () => {
    for (const bad of [{ top_p: 0 }, { temperature: -1 }, { min_p: 2 }, { repetition_penalty: 0 }]) {
      const dir = await modelCopy((d) => fs.promises.writeFile(path.join(d, 'generation_config.json'), JSON.stringify(bad)))
      await expectCode(Runtime.load(dir), 'INVALID_MODEL')
    }
  })
})

describe('tokenizer and chat template are tried at load', () => {
  const editJson = (file, f) => async (dir) => {
    const p = path.join(dir, file)
    const v = JSON.parse(await fs.promises.readFile(p, 'utf8'))
    f(v)
    await fs.promises.writeFile(p, JSON.stringify(v))
  }

  it('a chat template that never ends → INVALID_MODEL at load, in bounded time', async () => {
    const endless = '{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}'
    const dir = await modelCopy(editJson('tokenizer_config.json', (v) => (v.chat_template = endless)))
    const e = await expectCode(Runtime.load(dir), 'INVALID_MODEL')
    assert.match(e.message, /fuel/)
  })

  it('a chat template whose output explodes → INVALID_MODEL at load', async () => {
    const huge = `{% for i in range(90000) %}${'x'.repeat(1000)}{% endfor %}`
    const dir = await modelCopy(editJson('tokenizer_config.json', (v) => (v.chat_template = huge)))
    const e = await expectCode(Runtime.load(dir), 'INVALID_MODEL')
    assert.match(e.message, /exceeds/)
  })

  it('tokenizer ids past the model vocabulary → INVALID_MODEL naming the tokenizer', async () => {
    const dir = await modelCopy(editJson('tokenizer.json', (v) => v.added_tokens.push({ ...v.added_tokens[0], id: 5000, content: '<|extra|>' })))
    const e = await expectCode(Runtime.load(dir), 'INVALID_MODEL')
    assert.match(e.message, /tokenizer/)
  })
})

describe('special files are never opened or read without bound', () => {
  it('config.json as a named pipe → INVALID_MODEL at once, not a hang', async () => {
    const dir = await modelCopy(async (d) => {
      await fs.promises.rm(path.join(d, 'config.json'))
      execFileSync('mkfifo', [path.join(d, 'config.json')])
    })
    // In a child with a time limit: a regression would block in open() forever.
    assert.equal(loadCodeInChild({}, dir), 'INVALID_MODEL')
  })

  it('config.json and tokenizer.json linked to /dev/zero → INVALID_MODEL', async () => {
    for (const f of ['config.json', 'tokenizer.json', 'generation_config.json']) {
      const dir = await modelCopy(async (d) => {
        await fs.promises.rm(path.join(d, f), { force: true })
        await fs.promises.symlink('/dev/zero', path.join(d, f))
      })
      // In a child under a memory limit: a regression would read until memory runs out.
      assert.equal(loadCodeInChild({}, dir), 'INVALID_MODEL', f)
    }
  })

  it('a model path that is a named pipe → INVALID_MODEL', async () => {
    const p = path.join(tmp, 'model.gguf')
    execFileSync('mkfifo', [p])
    assert.equal(loadCodeInChild({}, p), 'INVALID_MODEL')
  })

  it('adapter_config.json and the adapter weights as special files → INVALID_ADAPTER', async () => {
    const dirs = []
    for (const f of ['adapter_config.json', 'adapter_model.safetensors', 'manifest.json']) {
      const dir = await fs.promises.mkdtemp(path.join(tmp, 'adapter-'))
      await fs.promises.cp(fixture('adapters', 'lora'), dir, { recursive: true })
      await fs.promises.rm(path.join(dir, f), { force: true })
      await fs.promises.symlink('/dev/zero', path.join(dir, f))
      dirs.push(dir)
    }
    const out = inChild(`const rt = await Runtime.load(model)
      for (const d of ${JSON.stringify(dirs)}) { try { await rt.loadExpert(d); console.log('LOADED') } catch (e) { console.log(e.code) } }
      await rt.dispose()`)
    assert.deepEqual(out.split('\n'), ['INVALID_ADAPTER', 'INVALID_ADAPTER', 'INVALID_ADAPTER'])
  })
})

describe('misuse of the API gives coded errors, never a TypeError or INTERNAL', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(MODEL)
  })
  after(() => rt?.dispose())

  it('null and non-object options', async () => {
    await expectCode(Runtime.load(MODEL, null), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, 'fast'), 'INVALID_ARGUMENT')
    await expectCode(() => rt.createSession(null), 'INVALID_ARGUMENT')
    await expectCode(rt.loadExpert(fixture('adapters', 'lora'), null), 'INVALID_ARGUMENT')
    await expectCode(() => rt.tokenize('hi', null), 'INVALID_ARGUMENT')
    const s = rt.createSession()
    await expectCode(s.complete('Hi', null), 'INVALID_ARGUMENT')
    await expectCode(s.complete('Hi', [1]), 'INVALID_ARGUMENT')
    await expectCode(async () => {
      for await (const _ of s.generate('Hi', null)) {
        /* fails on the first step */
      }
    }, 'INVALID_ARGUMENT')
  })

  it('wrongly typed flags and signals', async () => {
    const s = rt.createSession()
    await expectCode(s.complete('Hi', { signal: {} }), 'INVALID_ARGUMENT')
    await expectCode(s.complete('Hi', { signal: 'abort' }), 'INVALID_ARGUMENT')
    await expectCode(s.complete('Hi', { enableThinking: 'yes' }), 'INVALID_ARGUMENT')
    await expectCode(() => rt.tokenize('hi', { addSpecialTokens: 'yes' }), 'INVALID_ARGUMENT')
  })

  it('integers that would wrap to 32 bits', async () => {
    const s = rt.createSession()
    await expectCode(s.complete({ tokens: [2 ** 32 + 5] }), 'INVALID_ARGUMENT')
    await expectCode(() => rt.detokenize([2 ** 32 + 5]), 'INVALID_ARGUMENT')
    for (const k of ['maxTokens', 'topK', 'topLogprobs']) {
      await expectCode(s.complete('Hi', { [k]: 2 ** 32 + 1 }), 'INVALID_ARGUMENT')
    }
    await expectCode(Runtime.load(MODEL, { contextLength: 2 ** 32 + 16 }), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, { threads: 2 ** 32 + 1 }), 'INVALID_ARGUMENT')
    await expectCode(Runtime.load(MODEL, { kvCache: { blockSize: 2 ** 32 + 16 } }), 'INVALID_ARGUMENT')
  })

  it('return() before the first next() cancels the request and frees the session', async () => {
    const s = rt.createSession()
    const stream = s.generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 100 })
    const it = stream[Symbol.asyncIterator]()
    assert.deepEqual(await it.return(), { done: true, value: undefined })
    assert.equal(stream.result?.finishReason, 'cancelled')
    const r = await s.complete('Hi', { ...GREEDY, maxTokens: 1 })
    assert.equal(r.tokens.length, 1)
  })

  it('afterwards the runtime still gives the reference output', async () => {
    const r = await rt.createSession().complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 4 })
    assert.deepEqual(r.tokens, ref.f32.steps.slice(0, 4).map((s) => s.token))
  })
})

describe('an exception thrown by onProgress', () => {
  it('rejects the load with that exception and frees the engine; the process lives on', async () => {
    const boom = new Error('progress callback failed')
    await assert.rejects(
      Runtime.load(MODEL, {
        onProgress: () => {
          throw boom
        },
      }),
      (e) => e === boom,
    )
    const rt = await Runtime.load(MODEL, { onProgress: () => {} })
    const r = await rt.createSession().complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 2 })
    assert.equal(r.tokens.length, 2)
    await rt.dispose()
  })
})
