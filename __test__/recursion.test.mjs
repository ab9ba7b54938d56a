// Inputs that used to overflow a thread's stack: a stack overflow is no exception and no panic,
// it kills the process with SIGSEGV (and, in the server, every request in flight with it). Each
// class runs in a child process, in-process and through `expert-runtime serve`, and the test
// checks how the child ended: a normal exit, the typed errors, and a server still answering.
import { describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import path from 'node:path'
import { fixture } from './helpers.mjs'
import { refChain, ruleChain, tokenChain } from './adversarial/recursion.mjs'

const DIST = path.resolve(fixture('..', '..', 'dist', 'index.js'))
const CLI = path.join(path.dirname(DIST), 'cli.js')
const MODEL = fixture('qwen3-tiny')

/** Runs `body` in a child Node with `Runtime`, `model`, `refChain`, `ruleChain` and
 * `tokenChain` in scope; returns its stdout lines. The child must exit normally. */
function inChild(body) {
  const helpers = [refChain, ruleChain, tokenChain].map(String).join('\n')
  const script = `const { Runtime } = require(${JSON.stringify(DIST)}); const model = ${JSON.stringify(MODEL)};
    ${helpers}
    (async () => { ${body} })().then(() => process.exit(0), (e) => { console.log('UNCAUGHT', e && e.code, e && e.message); process.exit(3) })`
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 120_000 })
  assert.equal(r.signal, null, `child killed by ${r.signal} (a stack overflow is SIGSEGV): ${r.stderr.slice(-2000)}`)
  assert.equal(r.status, 0, `child exited ${r.status}: ${r.stdout}${r.stderr.slice(-2000)}`)
  return r.stdout.trim().split('\n')
}

/** The code each `responseFormat` fails with, or `ok`, in one child. */
function formatOutcomes(formats) {
  return inChild(`
    const rt = await Runtime.load(model, { threads: 2 })
    const formats = ${formats}
    for (const f of formats) {
      const s = rt.createSession()
      try {
        await s.complete({ text: 'x' }, { maxTokens: 2, temperature: 0, ...f })
        console.log('ok')
      } catch (e) { console.log(e.code + ' ' + e.message.slice(0, 200).replace(/\\n/g, ' ')) }
      s.dispose()
    }
    await rt.dispose()`)
}

describe('recursion classes that overflowed a stack', () => {
  it('a JSON schema $ref chain: 650 links compile, 5000 are refused, the process lives', () => {
    const out = formatOutcomes(`[650, 5000, 25000].map((n) => ({ responseFormat: { type: 'json_schema', schema: refChain(n) } }))`)
    assert.equal(out[0], 'ok')
    for (const line of out.slice(1)) assert.match(line, /^INVALID_ARGUMENT the JSON schema cannot be used: it nests too deeply: its \$ref chains and nesting reach \d+ levels, at most 1000/)
  })

  it('a Lark rule or token chain: 800 rules compile, 5000 are refused, the process lives', () => {
    const out = formatOutcomes(`[ruleChain(800), ruleChain(5000), tokenChain(5000), 'start: %json ' + JSON.stringify(refChain(5000))]
      .map((g) => ({ responseFormat: { type: 'grammar', grammar: g } }))`)
    assert.equal(out[0], 'ok')
    for (const line of out.slice(1)) assert.match(line, /^INVALID_ARGUMENT the grammar cannot be used: it nests too deeply: its (rule|\$ref) chains and nesting reach \d+ levels/)
  })

  it('tool parameters with a deep $ref chain are refused', () => {
    const out = formatOutcomes(`[{ tools: [{ type: 'function', function: { name: 'f', parameters: refChain(5000) } }], toolChoice: 'required' }]`)
    assert.match(out[0], /^INVALID_ARGUMENT the tools' parameter schemas cannot be used: it nests too deeply/)
  })

  it('through the server: the deep request gets a 400, every other request its answer', async () => {
    const child = spawn(process.execPath, [CLI, 'serve', MODEL, '--port', '0', '--threads', '2'], { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    child.stderr.on('data', (d) => (err += d))
    const exited = new Promise((r) => child.on('exit', (code, signal) => r({ code, signal })))
    try {
      await new Promise((resolve, reject) => {
        child.stdout.on('data', (d) => {
          out += d
          if (out.includes('ready')) resolve()
        })
        child.on('exit', (code, signal) => reject(new Error(`exited ${code} ${signal}: ${err}`)))
      })
      const url = /listening on (http:\/\/\S+)\/v1/.exec(out)[1]
      const post = (body) =>
        fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'qwen3-tiny', max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: 'Hi' }], ...body }) })
      const schema = (s) => ({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: s } } })
      // A normal request in flight while the deep ones arrive.
      const [normal, deep, grammarDeep, ok650] = await Promise.all([
        post({}),
        post(schema(refChain(5000))),
        post({ response_format: { type: 'grammar', grammar: ruleChain(5000) } }),
        post(schema(refChain(650))),
      ])
      assert.equal(normal.status, 200, await normal.clone().text())
      assert.equal(deep.status, 400)
      assert.match((await deep.json()).error.message, /nests too deeply/)
      assert.equal(grammarDeep.status, 400)
      assert.equal(ok650.status, 200, await ok650.clone().text())
      assert.equal((await post({})).status, 200, 'the server still answers')
    } finally {
      child.kill('SIGTERM')
    }
    assert.deepEqual(await exited, { code: 0, signal: null })
  })
})
