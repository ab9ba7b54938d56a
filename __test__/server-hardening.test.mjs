// The OpenAI server under misbehaving clients and launchers, on the tiny Qwen3 fixture: request
// bodies (and headers) that stall are answered 408 and their connections closed without
// holding a generation slot, wherever the handler is mounted; malformed percent-encoding in a
// path is a 400; failed requests are counted in /metrics under their endpoint and model;
// streamed answers say which experts run (first chunk and a header), routed or named; and the
// `serve` command shuts down on SIGINT / SIGTERM and when whoever launched it (npx) is gone.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer as createHttpServer } from 'node:http'
import { createRequire } from 'node:module'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { CLI, fixture } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const { createServer, openaiHandler } = require('../dist/server/index.js')
const { default: OpenAI } = require('openai')
const parsePrometheus = require('parse-prometheus-text-format')

const MODEL = fixture('qwen3-tiny')
const ADAPTERS = fixture('adapters')
const GREEDY = { temperature: 0 }
const SQL_ASK = [{ role: 'user', content: 'Write an sql query that lists every user.' }]

async function start(rt, options = {}) {
  const server = createServer(rt, { modelName: 'tiny', ...options })
  const { port } = await server.listen(0, '127.0.0.1')
  const base = `http://127.0.0.1:${port}`
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: options.apiKey ?? 'unused', maxRetries: 0 })
  return { server, port, base, client }
}

/**
 * A raw connection to `port` that writes `text` and never finishes its request: `answer`
 * resolves with everything the server sent once the server has closed the connection.
 */
function stalled(port, text) {
  const sock = net.connect(port, '127.0.0.1')
  sock.write(text)
  let got = ''
  sock.setEncoding('utf8').on('data', (d) => (got += d))
  // A write after the server closed may reset the connection: what it sent is read by then.
  sock.on('error', () => {})
  const answer = new Promise((resolve) => sock.on('close', () => resolve(got)))
  return { sock, answer }
}

const head = (contentLength, extra = '') =>
  `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${contentLength}\r\n${extra}\r\n`

/** An answer read off a raw connection: its status and JSON body. */
function parseAnswer(raw) {
  const [headers, body] = raw.split('\r\n\r\n')
  return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(headers)?.[1]), headers, body: body ? JSON.parse(body) : null }
}

/** Reads an SSE response: the header naming the experts, and the JSON events before [DONE]. */
async function sse(res) {
  assert.equal(res.status, 200)
  const text = await res.text()
  assert.ok(text.endsWith('data: [DONE]\n\n'), text.slice(-200))
  const events = text.split('\n\n').filter(Boolean).map((e) => e.slice('data: '.length))
  return { header: res.headers.get('x-expert-runtime-experts'), events: events.slice(0, -1).map((e) => JSON.parse(e)) }
}

const post = (base, route, body) => fetch(`${base}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })

describe('OpenAI server hardening', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(MODEL, { threads: 2 })
    await rt.loadExpert(path.join(ADAPTERS, 'lora')) // its manifest routes "sql" to it
    await rt.loadExpert(path.join(ADAPTERS, 'dora'))
  })
  after(() => rt?.dispose())

  it('answers bodies that stall 408 and closes them; they hold no generation slot, so others still run', { timeout: 30_000 }, async () => {
    const stalledCount = 6
    const s = await start(rt, { apiKey: 'k', maxConcurrentRequests: 2, bodyTimeoutMs: 3000 })
    try {
      let seen = 0
      const arrived = new Promise((resolve) => s.server.http.on('request', () => ++seen === stalledCount && resolve()))
      const conns = Array.from({ length: stalledCount }, () => stalled(s.port, `${head(200, 'authorization: Bearer k\r\n')}{"messages": [`))
      let answered = 0
      for (const c of conns) c.answer.then(() => answered++)
      await arrived // every stalled request is in the handler, reading its body
      // More stalled bodies than slots, and a whole request still gets through.
      const r = await s.client.chat.completions.create({ model: 'tiny', messages: SQL_ASK, max_tokens: 1 })
      assert.equal(r.choices.length, 1)
      assert.equal(answered, 0, 'the request ran while the stalled bodies were still stalled')
      for (const c of conns) {
        const a = parseAnswer(await c.answer) // resolves once the server closed the connection
        assert.equal(a.status, 408, a.headers)
        assert.match(a.headers, /connection: close/i)
        assert.deepEqual([a.body.error.type, a.body.error.code], ['invalid_request_error', 'request_timeout'])
      }
    } finally {
      await s.server.close()
    }
  })

  it('the vLLM-spelled endpoints bound their bodies too: stalled 408, oversized 413', { timeout: 30_000 }, async () => {
    const s = await start(rt, { bodyTimeoutMs: 300, maxBodyBytes: 1024, expertsDir: ADAPTERS })
    try {
      for (const p of ['/tokenize', '/detokenize', '/v1/load_lora_adapter', '/v1/unload_lora_adapter']) {
        const c = stalled(s.port, `POST ${p} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"prompt":`)
        const a = parseAnswer(await c.answer)
        assert.equal(a.status, 408, `${p}: ${a.headers}`)
        const big = await fetch(`${s.base}${p}`, { method: 'POST', body: JSON.stringify({ prompt: 'x'.repeat(4096) }) })
        assert.equal(big.status, 413, p)
        const notJson = await fetch(`${s.base}${p}`, { method: 'POST', body: '{"prompt": ' })
        assert.equal(notJson.status, 400, p)
      }
    } finally {
      await s.server.close()
    }
  })

  it('the handler bounds a body by itself where it is mounted, a trickling one too; OpenAIServer bounds headers', { timeout: 30_000 }, async () => {
    // A server of the user's with node's own limits off: only the handler can end these.
    const handler = openaiHandler(rt, { modelName: 'tiny', bodyTimeoutMs: 300 })
    const http = createHttpServer({ requestTimeout: 0, headersTimeout: 0 }, handler)
    await new Promise((r) => http.listen(0, '127.0.0.1', r))
    try {
      const { port } = http.address()
      const trickle = stalled(port, `${head(100)}{"messages":`)
      // One byte at a time, each soon after the last: the limit is on the whole body.
      const drip = setInterval(() => trickle.sock.write(' '), 20)
      trickle.sock.on('data', () => clearInterval(drip))
      const a = parseAnswer(await trickle.answer)
      clearInterval(drip)
      assert.equal(a.status, 408)
      assert.equal(a.body.error.code, 'request_timeout')
      // A whole request on the same server is served.
      assert.equal((await post(`http://127.0.0.1:${port}`, '/v1/chat/completions', { messages: SQL_ASK, max_tokens: 1 })).status, 200)
    } finally {
      await handler.close()
      http.closeAllConnections()
      await new Promise((r) => http.close(r))
    }

    const s = await start(rt, { headersTimeoutMs: 300 })
    try {
      const slow = stalled(s.port, 'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n')
      assert.match(await slow.answer, /^HTTP\/1\.1 408 /)
    } finally {
      await s.server.close()
    }
    assert.throws(() => createServer(rt, { bodyTimeoutMs: -1 }), /bodyTimeoutMs/)
    assert.throws(() => createServer(rt, { headersTimeoutMs: 1.5 }), /headersTimeoutMs/)
  })

  it('answers malformed percent-encoding in a path with 400, not 500', async () => {
    const s = await start(rt, { expertsDir: ADAPTERS })
    try {
      for (const name of ['%ZZ', '%E0%A4%A', 'lo%ra%', '%']) {
        const res = await fetch(`${s.base}/v1/experts/${name}`, { method: 'DELETE' })
        assert.equal(res.status, 400, name)
        const j = await res.json()
        assert.equal(j.error.type, 'invalid_request_error')
        assert.match(j.error.message, /percent-encoding/)
      }
      // Well-formed encoding still decodes: an expert that is not loaded is a 404.
      assert.equal((await fetch(`${s.base}/v1/experts/no%20such`, { method: 'DELETE' })).status, 404)
      assert.equal((await fetch(`${s.base}/v1/%ZZ`)).status, 404)
    } finally {
      await s.server.close()
    }
  })

  it('counts failed requests in /metrics under the endpoint they hit and their model', async () => {
    const s = await start(rt, { expertsDir: ADAPTERS, apiKey: 'k' })
    try {
      const auth = { authorization: 'Bearer k', 'content-type': 'application/json' }
      const read = async () => parsePrometheus(await (await fetch(`${s.base}/metrics`)).text()).find((m) => m.name === 'expert_runtime_http_requests_total')?.metrics ?? []
      const count = (series, labels) => series.filter((x) => Object.entries(labels).every(([k, v]) => x.labels[k] === v)).reduce((a, x) => a + Number(x.value), 0)
      const before = await read()
      const send = (route, body, method = 'POST', headers = auth) => fetch(`${s.base}${route}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) })
      assert.equal((await send('/v1/chat/completions', { model: 'tiny', messages: SQL_ASK, temperature: 'hot' })).status, 400)
      assert.equal((await send('/v1/completions', { model: 'lora', prompt: 'x', max_tokens: -1 })).status, 400)
      assert.equal((await send('/v1/chat/completions', { model: 'nope-4c1d', messages: SQL_ASK })).status, 404)
      assert.equal((await send('/v1/embeddings', { model: 'auto', input: 'x' })).status, 400)
      assert.equal((await send('/v1/experts/%ZZ', undefined, 'DELETE')).status, 400)
      assert.equal((await send('/v1/models', undefined, 'GET', {})).status, 401)
      const after = await read()
      const moved = (labels) => count(after, labels) - count(before, labels)
      assert.equal(moved({ endpoint: '/v1/chat/completions', model: 'tiny', status: '400' }), 1)
      assert.equal(moved({ endpoint: '/v1/completions', model: 'lora', status: '400' }), 1)
      // A model the server does not serve is not a label of its own (clients cannot grow the series).
      assert.equal(moved({ endpoint: '/v1/chat/completions', model: 'other', status: '404' }), 1)
      assert.ok(after.every((x) => x.labels.model !== 'nope-4c1d'))
      assert.equal(moved({ endpoint: '/v1/embeddings', model: 'auto', status: '400' }), 1)
      assert.equal(moved({ endpoint: '/v1/experts/:name', status: '400' }), 1)
      assert.equal(moved({ endpoint: '/v1/models', status: '401' }), 1)
      assert.equal(moved({ endpoint: 'other' }), 0)
    } finally {
      await s.server.close()
    }
  })

  it('streamed answers name their experts in the first chunk and a header: routed (auto) and named', async () => {
    const s = await start(rt, { cors: true })
    try {
      const decision = await rt.route(SQL_ASK)
      assert.deepEqual(decision.experts, ['lora'], 'premise: the router picks the lora fixture for an SQL question')
      // model "auto": the router's choice, before the first token.
      const autoRes = await post(s.base, '/v1/chat/completions', { model: 'auto', messages: SQL_ASK, max_tokens: 6, temperature: 0, stream: true })
      // A browser script may read the header (and the stream at all: CORS headers on SSE too).
      assert.equal(autoRes.headers.get('access-control-allow-origin'), '*')
      assert.match(autoRes.headers.get('access-control-expose-headers'), /x-expert-runtime-experts/)
      const auto = await sse(autoRes)
      assert.equal(auto.header, 'lora')
      assert.deepEqual(auto.events[0].expert_runtime.experts, ['lora'])
      assert.deepEqual(auto.events[0].expert_runtime.routing.experts, ['lora'])
      assert.ok(auto.events[0].expert_runtime.routing.reason.length > 0)
      assert.ok(auto.events.slice(1).every((e) => e.expert_runtime === undefined), 'only the first chunk carries it')
      // ... and that is what ran: the same text as the in-process API routing the same request.
      const mine = await rt.createSession().complete(SQL_ASK, { ...GREEDY, maxTokens: 6, experts: 'auto' })
      assert.deepEqual(mine.experts, ['lora'])
      assert.equal(auto.events.map((e) => e.choices[0]?.delta?.content ?? '').join(''), mine.text)
      // The same request unstreamed says the same, in its body and the header.
      const whole = await post(s.base, '/v1/chat/completions', { model: 'auto', messages: SQL_ASK, max_tokens: 6, temperature: 0 })
      assert.equal(whole.headers.get('x-expert-runtime-experts'), 'lora')
      const body = await whole.json()
      assert.deepEqual(body.expert_runtime.experts, ['lora'])
      assert.equal(body.choices[0].message.content, mine.text)
      // A generic question goes to the base model: no experts, an empty header.
      const hello = await sse(await post(s.base, '/v1/chat/completions', { model: 'auto', messages: [{ role: 'user', content: 'hello' }], max_tokens: 2, stream: true }))
      assert.equal(hello.header, '')
      assert.deepEqual(hello.events[0].expert_runtime.experts, [])
      assert.equal(hello.events[0].expert_runtime.routing.generic, true)

      // Named experts, through the openai client: the first chunk says so, no routing.
      const stream = await s.client.chat.completions.create({ model: 'lora+dora', messages: SQL_ASK, max_tokens: 3, stream: true })
      const chunks = []
      for await (const c of stream) chunks.push(c)
      assert.deepEqual(chunks[0].expert_runtime, { experts: ['lora', 'dora'], routing: null })
      // Text completions too, with the header.
      const text = await sse(await post(s.base, '/v1/completions', { model: 'dora', prompt: 'The sea is', max_tokens: 3, stream: true }))
      assert.equal(text.header, 'dora')
      assert.deepEqual(text.events[0].expert_runtime, { experts: ['dora'], routing: null })
      const routedText = await sse(await post(s.base, '/v1/completions', { model: 'auto', prompt: 'select from the sql table', max_tokens: 2, stream: true }))
      assert.equal(routedText.header, 'lora')
      assert.deepEqual(routedText.events[0].expert_runtime.experts, ['lora'])
    } finally {
      await s.server.close()
    }
  })
})

// ---- the `serve` command: signals, and a launcher that goes away ----

/** The environment without what an enclosing `npm test` put in it (npm's settings and script names). */
const CLEAN_ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith('npm_')))

/** Whether `pid` has exited (gone, or a zombie nobody reaped yet). */
/**
 * Whether `pid` is gone within `ms`: a process closes its files before the kernel marks it a
 * zombie, so the end of its pipes can be seen a moment before `exited` says so.
 */
async function exitsWithin(pid, ms = 5000) {
  for (const until = Date.now() + ms; Date.now() < until; await new Promise((r) => setTimeout(r, 20))) if (exited(pid)) return true
  return exited(pid)
}

function exited(pid) {
  try {
    process.kill(pid, 0)
  } catch (e) {
    return e.code === 'ESRCH'
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')
  } catch {
    return true
  }
}

const parentOf = (pid) => {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
}

/**
 * Runs `command args` and collects its output: `ready` resolves once stdout says the server is
 * ready (with its URL), `closed` once nothing holds its stdout and stderr any more: every
 * process that inherited them (the server's included) has exited.
 */
function launch(command, args, options = {}) {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], ...options })
  const out = { stdout: '', stderr: '' }
  child.stdout.setEncoding('utf8').on('data', (d) => (out.stdout += d))
  child.stderr.setEncoding('utf8').on('data', (d) => (out.stderr += d))
  const ready = new Promise((resolve, reject) => {
    child.stdout.on('data', () => {
      const url = /listening on (http:\/\/\S+)\/v1/.exec(out.stdout)?.[1]
      if (url && out.stdout.includes('ready')) resolve(url)
    })
    child.on('exit', (code) => reject(new Error(`exited ${code} before it was ready: ${out.stderr}`)))
  })
  const closed = Promise.all([new Promise((r) => child.stdout.on('close', r)), new Promise((r) => child.stderr.on('close', r))])
  return { child, out, ready, closed }
}

describe('expert-runtime serve: shutdown', () => {
  const leftovers = []
  after(() => {
    for (const pid of leftovers) if (!exited(pid)) process.kill(pid, 'SIGKILL')
  })

  it('bounds the KV cache with --kv-max-bytes and gives its memory back after --kv-idle-release-ms', { timeout: 60_000 }, async () => {
    const run = launch(process.execPath, [CLI, 'serve', MODEL, '--port', '0', '--threads', '2', '--kv-max-bytes', String(1 << 20), '--kv-idle-release-ms', '200'])
    leftovers.push(run.child.pid)
    const url = await run.ready
    const metric = async (name) => {
      const text = await (await fetch(`${url}/metrics`)).text()
      return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1])
    }
    // qwen3-tiny: 3 layers × K and V × 2 heads × 32 × 4 bytes = 1536 bytes a token; 1 MiB holds
    // 682 positions, 42 blocks of 16.
    assert.equal(await metric('expert_runtime_kv_bytes_per_token'), 1536)
    assert.equal(await metric('expert_runtime_kv_blocks_total'), 42)
    const r = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 40, temperature: 0 }) })
    assert.equal(r.status, 200)
    let released = 0
    for (let i = 0; i < 200 && !released; i++) {
      await new Promise((res) => setTimeout(res, 50))
      released = await metric('expert_runtime_kv_blocks_released')
    }
    assert.ok(released > 0, 'idle, the pool released its blocks')
    assert.equal(await metric('expert_runtime_kv_blocks_touched'), 0)
    const exit = new Promise((res) => run.child.on('exit', (code, signal) => res({ code, signal })))
    run.child.kill('SIGTERM')
    assert.deepEqual(await exit, { code: 0, signal: null })
  })

  it('takes the body and headers limits as flags, and shuts down gracefully on SIGINT (exit 0)', { timeout: 60_000 }, async () => {
    const run = launch(process.execPath, [CLI, 'serve', MODEL, '--port', '0', '--threads', '2', '--body-timeout-ms', '300', '--headers-timeout-ms', '300'])
    leftovers.push(run.child.pid)
    const url = await run.ready
    const port = Number(new URL(url).port)
    const body = stalled(port, `${head(100)}{"messages":`)
    assert.equal(parseAnswer(await body.answer).status, 408)
    assert.match(await stalled(port, 'GET /health HTTP/1.1\r\n').answer, /^HTTP\/1\.1 408 /)
    const exit = new Promise((r) => run.child.on('exit', (code, signal) => r({ code, signal })))
    run.child.kill('SIGINT')
    assert.deepEqual(await exit, { code: 0, signal: null })
    assert.match(run.out.stderr, /SIGINT, shutting down/)
  })

  const npx = spawnable('npx')
  const linuxNpx = process.platform !== 'linux' ? 'reads /proc' : npx ? false : 'npx is not on PATH'

  /** A project with `expert-runtime` in node_modules/.bin (as npm installs it), which notes its pid. */
  function project() {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'er-npx-'))
    mkdirSync(path.join(dir, 'node_modules', '.bin'), { recursive: true })
    writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'npx-test', version: '1.0.0', private: true }))
    const pidFile = path.join(dir, 'server.pid')
    writeFileSync(
      path.join(dir, 'node_modules', '.bin', 'expert-runtime'),
      `#!/usr/bin/env node\nrequire('node:fs').writeFileSync(${JSON.stringify(pidFile)}, String(process.pid))\nrequire(${JSON.stringify(CLI)})\n`,
      { mode: 0o755 },
    )
    return { dir, pidFile }
  }

  for (const signal of ['SIGTERM', 'SIGKILL']) {
    it(`leaves no server behind when npx gets ${signal}`, { skip: linuxNpx, timeout: 60_000 }, async () => {
      const { dir, pidFile } = project()
      try {
        const run = launch('npx', ['--no-install', 'expert-runtime', 'serve', MODEL, '--port', '0', '--threads', '2'], { cwd: dir, env: CLEAN_ENV })
        leftovers.push(run.child.pid)
        const url = await run.ready
        const server = Number(readFileSync(pidFile, 'utf8'))
        leftovers.push(server)
        const shell = parentOf(server) // npm's `sh -c`, between npm and the server
        assert.notEqual(shell, run.child.pid, 'premise: npm runs the command through a shell')
        run.child.kill(signal)
        await run.closed // every holder of npx's stdout and stderr is gone: the server too
        assert.ok(await exitsWithin(server), 'the server exited')
        assert.ok(await exitsWithin(shell), "npm's shell exited")
        assert.match(run.out.stderr, /exited, shutting down/)
        await assert.rejects(fetch(`${url}/health`))
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    })
  }

  it('--exit-with-parent: a server whose parent is killed shuts down', { skip: process.platform === 'win32' && 'POSIX signals', timeout: 60_000 }, async () => {
    // A parent that starts the server with the parent's own stdout and stderr, then is killed.
    const script = `const c = require('node:child_process').spawn(process.execPath, ${JSON.stringify([CLI, 'serve', MODEL, '--port', '0', '--threads', '2', '--exit-with-parent'])}, { stdio: 'inherit' }); console.log('server pid', c.pid)`
    // Not launched by npm: only the flag turns the watch on.
    const run = launch(process.execPath, ['-e', script], { env: CLEAN_ENV })
    leftovers.push(run.child.pid)
    await run.ready
    const server = Number(/server pid (\d+)/.exec(run.out.stdout)[1])
    leftovers.push(server)
    run.child.kill('SIGKILL')
    await run.closed
    assert.ok(await exitsWithin(server))
    assert.match(run.out.stderr, /the parent process \(\d+\) exited, shutting down/)
  })
})

/** Whether `command` is on PATH. */
function spawnable(command) {
  return (process.env.PATH ?? '').split(path.delimiter).some((d) => d && existsSync(path.join(d, command)))
}
