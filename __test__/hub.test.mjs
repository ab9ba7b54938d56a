// Models from the Hugging Face Hub (lib/hub, `hf:` paths, `expert-runtime pull`) against a fake
// Hub on 127.0.0.1 that serves the tiny fixture models in the Hub's URL layout: the revision API
// (`siblings`, `sha`), `resolve/` with a redirect to a "CDN" on another host name carrying
// X-Linked-Etag / X-Linked-Size, and Range requests. Faults (a cut connection, corrupt bytes,
// a stall, hostile listings) are switched on per file. No sleeps, no network beyond loopback.
import { describe, it, before, after, beforeEach } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import fs from 'node:fs'
import http from 'node:http'
import os from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'
import { collect, fixture, GREEDY, reference, runCli } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const { fetchModel, parsePullSpec, parseHfRef } = require('../dist/hub/index.js')

const sha256 = (b) => createHash('sha256').update(b).digest('hex')
const gitSha1 = (b) => createHash('sha1').update(`blob ${b.length}\0`).update(b).digest('hex')
const isLfs = (name) => /\.(safetensors|gguf)$/.test(name)
const COMMIT = 'c0ffee'.padEnd(40, '0')

/** A repository: file name → bytes, optionally with listings that omit sizes and hashes. */
function repoFromDir(dir, { exclude = [], extra = {}, blobs = true, token } = {}) {
  const files = new Map()
  for (const name of fs.readdirSync(dir)) if (!exclude.includes(name)) files.set(name, fs.readFileSync(path.join(dir, name)))
  for (const [name, bytes] of Object.entries(extra)) files.set(name, Buffer.from(bytes))
  return { commit: COMMIT, files, blobs, token }
}

/**
 * The fake Hub. `hubUrl` (host `localhost`) answers the API and `resolve/`; LFS files redirect
 * to `cdnOrigin` (host `127.0.0.1`, the same server): two hosts as far as a client can tell.
 */
class FakeHub {
  repos = new Map()
  /** Every request: { host, path, headers }. */
  requests = []
  /** file name → { times, cutAfter?, stall?, slow?, corrupt?: 'flip' | 'extra', absurdSize? } */
  faults = new Map()
  /** repo → (req, res) => handled: a hostile API answer. */
  apiOverride = new Map()

  async start() {
    this.server = http.createServer((req, res) => this.#handle(req, res))
    await new Promise((r) => this.server.listen(0, '127.0.0.1', r))
    this.port = this.server.address().port
    this.hubUrl = `http://localhost:${this.port}`
    this.cdnOrigin = `http://127.0.0.1:${this.port}`
  }

  async stop() {
    this.server.closeAllConnections()
    await new Promise((r) => this.server.close(r))
  }

  requestsTo(pathPart) {
    return this.requests.filter((r) => r.path.includes(pathPart))
  }

  #fault(file) {
    const f = this.faults.get(file)
    if (!f || f.times <= 0) return undefined
    f.times--
    return f
  }

  #handle(req, res) {
    res.on('error', () => {})
    const u = new URL(req.url, 'http://x')
    this.requests.push({ host: req.headers.host.split(':')[0], path: u.pathname, headers: req.headers })
    const api = /^\/api\/models\/([^/]+)\/([^/]+)\/revision\/([^/]+)$/.exec(u.pathname)
    const resolve = /^\/([^/]+)\/([^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(u.pathname)
    const cdn = /^\/cdn\/([^/]+)\/([^/]+)\/(.+)$/.exec(u.pathname)
    if (u.pathname.startsWith('/loop/')) return this.#redirect(res, `/loop/${Number(u.pathname.slice(6)) + 1}`)
    const repoId = api ? `${api[1]}/${api[2]}` : resolve ? `${resolve[1]}/${resolve[2]}` : undefined
    const repo = repoId && this.repos.get(repoId)
    if (repoId && !repo) return this.#error(res, 401, 'RepoNotFound', 'Repository not found')
    if (repo?.token && req.headers.authorization !== `Bearer ${repo.token}`) return this.#error(res, 401, 'GatedRepo', 'Access to this model is restricted')
    if (api) {
      if (this.apiOverride.has(repoId)) return this.apiOverride.get(repoId)(req, res)
      const rev = decodeURIComponent(api[3])
      if (rev !== 'main' && rev !== repo.commit) return this.#error(res, 404, 'RevisionNotFound', 'Invalid rev id')
      const blobs = repo.blobs && u.searchParams.get('blobs') === 'true'
      const siblings = [...repo.files].map(([rfilename, b]) =>
        blobs ? { rfilename, size: b.length, ...(isLfs(rfilename) ? { lfs: { sha256: sha256(b), size: b.length, pointerSize: 134 } } : {}) } : { rfilename },
      )
      for (const name of repo.listOnly ?? []) siblings.push({ rfilename: name })
      return this.#json(res, { id: repoId, sha: repo.commit, siblings })
    }
    if (resolve) {
      const file = resolve[4].split('/').map(decodeURIComponent).join('/')
      const bytes = repo.files.get(file)
      if (resolve[3] !== repo.commit || !bytes) return this.#error(res, 404, 'EntryNotFound', 'Entry not found')
      if (repo.redirectLoop) return this.#redirect(res, '/loop/0')
      if (!isLfs(file)) return this.#send(req, res, file, bytes, { etag: `"${gitSha1(bytes)}"`, 'x-repo-commit': repo.commit })
      const fault = this.faults.get(file)
      return this.#redirect(res, `${this.cdnOrigin}/cdn/${resolve[1]}/${resolve[2]}/${encodeURIComponent(file)}`, {
        'x-linked-etag': `"${sha256(bytes)}"`,
        'x-linked-size': fault?.absurdSize ?? String(bytes.length),
        'x-repo-commit': repo.commit,
        etag: `"${gitSha1(bytes)}"`,
      })
    }
    if (cdn) {
      const repo = this.repos.get(`${cdn[1]}/${cdn[2]}`)
      const file = decodeURIComponent(cdn[3])
      return this.#send(req, res, file, repo.files.get(file), {})
    }
    this.#error(res, 404, 'NotFound', 'no route')
  }

  #redirect(res, location, headers = {}) {
    res.writeHead(302, { location, ...headers })
    res.end()
  }

  #error(res, status, code, message) {
    res.writeHead(status, { 'x-error-code': code, 'x-error-message': message, 'content-type': 'application/json' })
    res.end(JSON.stringify({ error: message }))
  }

  #json(res, value) {
    const body = JSON.stringify(value)
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
    res.end(body)
  }

  /** The bytes of a file, honouring `Range: bytes=N-`, with the file's fault if one is armed. */
  #send(req, res, file, bytes, headers) {
    const fault = this.#fault(file)
    let start = 0
    const range = /^bytes=(\d+)-$/.exec(req.headers.range ?? '')
    if (range) {
      start = Number(range[1])
      if (start >= bytes.length) {
        res.writeHead(416, { 'content-range': `bytes */${bytes.length}` })
        return res.end()
      }
    }
    let body = bytes.subarray(start)
    if (fault?.corrupt === 'flip') {
      body = Buffer.from(body)
      body[body.length >> 1] ^= 0xff
    }
    if (fault?.corrupt === 'extra') {
      // More bytes than announced, chunked (no Content-Length to stop the client).
      res.writeHead(200, headers)
      return res.end(Buffer.concat([body, Buffer.alloc(4096, 7)]))
    }
    res.writeHead(range ? 206 : 200, {
      ...headers,
      'accept-ranges': 'bytes',
      'content-length': body.length,
      ...(range ? { 'content-range': `bytes ${start}-${bytes.length - 1}/${bytes.length}` } : {}),
    })
    if (fault?.cutAfter !== undefined) {
      // Part of the body, then the connection drops.
      res.write(body.subarray(0, fault.cutAfter), () => res.socket.destroy())
      return
    }
    if (fault?.stall !== undefined) {
      res.write(body.subarray(0, fault.stall)) // and never another byte
      return
    }
    if (fault?.slow !== undefined) {
      // In 8 pieces, `slow` ms apart.
      const step = Math.ceil(body.length / 8)
      let at = 0
      const next = () => {
        if (res.destroyed) return
        const piece = body.subarray(at, at + step)
        at += step
        if (at >= body.length) return res.end(piece)
        res.write(piece)
        setTimeout(next, fault.slow)
      }
      return next()
    }
    res.end(body)
  }
}

/** Every file under `dir`, relative, sorted. */
function walk(dir, base = dir) {
  if (!fs.existsSync(dir)) return []
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .flatMap((e) => (e.isDirectory() ? walk(path.join(dir, e.name), base) : [path.relative(base, path.join(dir, e.name))]))
    .sort()
}

/** The CLI with `env` as its environment (run asynchronously: the fake Hub lives in this process). */
const cli = (args, env) => runCli(args, { env })

const QWEN3 = fixture('qwen3-tiny')
const ref = reference('qwen3-tiny')
const HUB_ENV = ['HF_ENDPOINT', 'HF_TOKEN', 'HUGGING_FACE_HUB_TOKEN', 'HF_HUB_OFFLINE', 'EXPERT_RUNTIME_OFFLINE', 'EXPERT_RUNTIME_CACHE']

describe('models from the Hub', () => {
  const hub = new FakeHub()
  const savedEnv = {}
  let tmp
  let n = 0
  /** A fresh, empty cache directory. */
  const freshCache = () => path.join(tmp, `cache-${n++}`)

  before(async () => {
    for (const k of HUB_ENV) {
      savedEnv[k] = process.env[k]
      delete process.env[k]
    }
    tmp = await fs.promises.mkdtemp(path.join(os.tmpdir(), 'expert-runtime-hub-'))
    await hub.start()
    process.env.HF_ENDPOINT = hub.hubUrl
    hub.repos.set('test-org/qwen3-tiny', repoFromDir(QWEN3, { extra: { 'README.md': '# tiny', 'onnx/model.onnx': 'not weights we read' } }))
    hub.repos.set('test-org/no-blobs', repoFromDir(QWEN3, { blobs: false }))
    hub.repos.set('test-org/sharded', repoFromDir(fixture('qwen3-untied-mqa')))
    hub.repos.set('test-org/ggufs', repoFromDir(QWEN3, { exclude: ['model.safetensors', 'config.json'] }))
    hub.repos.set('test-org/gated', repoFromDir(QWEN3, { token: 'hf_secret' }))
  })
  after(async () => {
    await hub.stop()
    for (const k of HUB_ENV) {
      if (savedEnv[k] === undefined) delete process.env[k]
      else process.env[k] = savedEnv[k]
    }
    if (tmp) await fs.promises.rm(tmp, { recursive: true, force: true })
  })
  beforeEach(() => {
    hub.faults.clear()
    delete process.env.EXPERT_RUNTIME_OFFLINE
    delete process.env.HF_HUB_OFFLINE
    delete process.env.HF_TOKEN
  })

  describe('refs', () => {
    it('parses hf: paths and pull specs', () => {
      assert.deepEqual(parseHfRef('org/repo'), { repo: 'org/repo', revision: 'main', file: undefined })
      assert.deepEqual(parseHfRef('org/repo@v1.0/sub/m.gguf'), { repo: 'org/repo', revision: 'v1.0', file: 'sub/m.gguf' })
      assert.deepEqual(parseHfRef('org/repo@refs%2Fpr%2F3'), { repo: 'org/repo', revision: 'refs/pr/3', file: undefined })
      assert.deepEqual(parsePullSpec('org/repo:m.gguf'), { repo: 'org/repo', revision: 'main', file: 'm.gguf' })
      assert.deepEqual(parsePullSpec('hf:org/repo@dev:m.gguf'), { repo: 'org/repo', revision: 'dev', file: 'm.gguf' })
      assert.deepEqual(parsePullSpec('org/repo/m.gguf', 'v2'), { repo: 'org/repo', revision: 'v2', file: 'm.gguf' })
      assert.throws(() => parsePullSpec('org/repo@a', 'b'), { code: 'INVALID_ARGUMENT' })
      for (const bad of ['org', 'org/', '/repo', '../repo', 'org/..', 'org/repo/../x', 'org/repo/a//b', 'org/repo/a\\b', 'org/repo/x\u0000', 'org/re po', 'org/repo@', 'org/repo@..', 'org/repo/f.partial', 'x'.repeat(5000)]) {
        assert.throws(() => parseHfRef(bad), { code: 'INVALID_ARGUMENT' }, JSON.stringify(bad.slice(0, 40)))
      }
    })

    it('refuses bad hub options before any request', async () => {
      const before = hub.requests.length
      await assert.rejects(fetchModel('test-org/qwen3-tiny', { endpoint: 'ftp://x' }), { code: 'INVALID_ARGUMENT' })
      await assert.rejects(fetchModel('test-org/qwen3-tiny', { endpoint: 'http://user:pw@localhost' }), { code: 'INVALID_ARGUMENT' })
      await assert.rejects(fetchModel('test-org/qwen3-tiny', { token: 'a\r\nX-Evil: 1' }), { code: 'INVALID_ARGUMENT' })
      await assert.rejects(fetchModel('test-org/qwen3-tiny', { bogus: 1 }), { code: 'INVALID_ARGUMENT' })
      await assert.rejects(fetchModel('test-org/qwen3-tiny/../../x', { cacheDir: freshCache() }), { code: 'INVALID_ARGUMENT' })
      await assert.rejects(Runtime.load('hf:test-org/qwen3-tiny', { onDownloadProgress: 'no' }), { code: 'INVALID_ARGUMENT' })
      assert.equal(hub.requests.length, before)
    })
  })

  describe('download and load', () => {
    let cache

    it('hf:org/repo downloads the model files only, loads and generates as the local model does', async () => {
      cache = freshCache()
      const events = []
      const rt = await Runtime.load('hf:test-org/qwen3-tiny', { threads: 1, hub: { cacheDir: cache }, onDownloadProgress: (p) => events.push(p) })
      try {
        const { result } = await collect(rt.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.f32.steps.length }))
        assert.deepEqual(result.tokens, ref.f32.steps.map((s) => s.token))
      } finally {
        await rt.dispose()
      }
      const snap = `test-org/qwen3-tiny/snapshots/${COMMIT}`
      const wanted = ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']
      assert.deepEqual(walk(cache), [
        `test-org/qwen3-tiny/manifests/${COMMIT}.json`,
        'test-org/qwen3-tiny/refs/main',
        ...wanted.map((f) => `${snap}/${f}`),
      ])
      for (const f of wanted) assert.ok(fs.readFileSync(path.join(cache, snap, f)).equals(fs.readFileSync(path.join(QWEN3, f))), f)
      // Progress covers every byte fetched and never goes back.
      const total = wanted.reduce((s, f) => s + fs.statSync(path.join(QWEN3, f)).size, 0)
      assert.deepEqual(events.at(-1), { loadedBytes: total, totalBytes: total, file: 'model.safetensors' })
      for (let i = 1; i < events.length; i++) assert.ok(events[i].loadedBytes >= events[i - 1].loadedBytes)
      // The LFS file came from the "CDN" after the Hub's redirect.
      assert.equal(hub.requests.filter((r) => r.path === `/cdn/test-org/qwen3-tiny/model.safetensors`).length, 1)
    })

    it('a second load finds every file in the cache (one listing request, no downloads)', async () => {
      const before = hub.requests.length
      const events = []
      const rt = await Runtime.load('hf:test-org/qwen3-tiny', { threads: 1, hub: { cacheDir: cache }, onDownloadProgress: (p) => events.push(p) })
      await rt.dispose()
      assert.deepEqual(
        hub.requests.slice(before).map((r) => r.path),
        ['/api/models/test-org/qwen3-tiny/revision/main'],
      )
      assert.equal(events.length, 0)
    })

    it('offline mode loads from the cache without a single request', async () => {
      const before = hub.requests.length
      process.env.EXPERT_RUNTIME_OFFLINE = '1'
      const rt = await Runtime.load('hf:test-org/qwen3-tiny', { threads: 1, hub: { cacheDir: cache } })
      await rt.dispose()
      delete process.env.EXPERT_RUNTIME_OFFLINE
      process.env.HF_HUB_OFFLINE = 'true'
      assert.equal(await fetchModel('test-org/qwen3-tiny', { cacheDir: cache }), path.join(cache, `test-org/qwen3-tiny/snapshots/${COMMIT}`))
      delete process.env.HF_HUB_OFFLINE
      assert.equal(await fetchModel(`test-org/qwen3-tiny@${COMMIT}/config.json`, { cacheDir: cache, offline: true }), path.join(cache, `test-org/qwen3-tiny/snapshots/${COMMIT}/config.json`))
      // A commit the cache holds needs no Hub even online.
      await fetchModel(`test-org/qwen3-tiny@${COMMIT}`, { cacheDir: cache })
      assert.equal(hub.requests.length, before)
    })

    it('offline with what the cache lacks fails with MODEL_NOT_FOUND, without a request', async () => {
      const before = hub.requests.length
      await assert.rejects(fetchModel('test-org/qwen3-tiny', { cacheDir: freshCache(), offline: true }), (e) => e.code === 'MODEL_NOT_FOUND' && /offline/.test(e.message))
      process.env.HF_HUB_OFFLINE = '1'
      await assert.rejects(Runtime.load('hf:test-org/qwen3-tiny/model-f32.gguf', { hub: { cacheDir: cache } }), (e) => e.code === 'MODEL_NOT_FOUND' && /HF_HUB_OFFLINE/.test(e.message))
      assert.equal(hub.requests.length, before)
    })

    it('an unreachable Hub falls back to the cache for what it holds', async () => {
      const closed = http.createServer()
      await new Promise((r) => closed.listen(0, '127.0.0.1', r))
      const { port } = closed.address()
      await new Promise((r) => closed.close(r))
      const endpoint = `http://127.0.0.1:${port}`
      assert.equal(await fetchModel('test-org/qwen3-tiny', { cacheDir: cache, endpoint }), path.join(cache, `test-org/qwen3-tiny/snapshots/${COMMIT}`))
      await assert.rejects(fetchModel('test-org/qwen3-tiny', { cacheDir: freshCache(), endpoint }), (e) => e.code === 'DOWNLOAD_FAILED' && /ECONNREFUSED|cannot reach/.test(e.message))
    })

    it('hf:org/repo@rev/file.gguf loads one GGUF file', async () => {
      const c = freshCache()
      const rt = await Runtime.load(`hf:test-org/qwen3-tiny@${COMMIT}/model-q8_0.gguf`, { threads: 1, hub: { cacheDir: c } })
      try {
        const { result } = await collect(rt.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.q8_0_dequant.steps.length }))
        assert.deepEqual(result.tokens, ref.q8_0_dequant.steps.map((s) => s.token))
      } finally {
        await rt.dispose()
      }
      assert.deepEqual(walk(c), [`test-org/qwen3-tiny/snapshots/${COMMIT}/model-q8_0.gguf`])
    })

    it('a sharded repository brings the shards its index names', async () => {
      const c = freshCache()
      const sharded = reference('qwen3-untied-mqa')
      const rt = await Runtime.load('hf:test-org/sharded', { threads: 1, hub: { cacheDir: c } })
      try {
        const { result } = await collect(rt.createSession().generate({ tokens: sharded.prompt_ids }, { ...GREEDY, maxTokens: sharded.f32.steps.length }))
        assert.deepEqual(result.tokens, sharded.f32.steps.map((s) => s.token))
      } finally {
        await rt.dispose()
      }
      const files = walk(path.join(c, `test-org/sharded/snapshots/${COMMIT}`))
      assert.deepEqual(files.filter((f) => f.endsWith('.safetensors')), ['model-00001-of-00003.safetensors', 'model-00002-of-00003.safetensors', 'model-00003-of-00003.safetensors'])
      assert.ok(files.includes('model.safetensors.index.json'))
    })

    it('a repository of several GGUF files needs one named', async () => {
      await assert.rejects(fetchModel('test-org/ggufs', { cacheDir: freshCache() }), (e) => e.code === 'INVALID_ARGUMENT' && /model-f32\.gguf, model-q8_0\.gguf/.test(e.message))
    })

    it('404s are MODEL_NOT_FOUND: repository, revision, file', async () => {
      const c = freshCache()
      await assert.rejects(fetchModel('test-org/nope', { cacheDir: c }), (e) => e.code === 'MODEL_NOT_FOUND' && /HF_TOKEN/.test(e.message))
      await assert.rejects(fetchModel('test-org/qwen3-tiny@no-such-branch', { cacheDir: c }), { code: 'MODEL_NOT_FOUND' })
      await assert.rejects(Runtime.load('hf:test-org/qwen3-tiny/missing.gguf', { hub: { cacheDir: c } }), (e) => e.code === 'MODEL_NOT_FOUND' && /model-f32\.gguf/.test(e.message))
      assert.deepEqual(walk(c), [])
    })
  })

  describe('experts from the Hub', () => {
    it("loadExpert('hf:org/repo') fetches an adapter repository with the runtime's hub options and applies it as the local copy does", async () => {
      const cache = freshCache()
      const lora = fixture('adapters', 'lora')
      hub.repos.set('test-org/tiny-lora', repoFromDir(lora, { exclude: ['manifest.json'], extra: { 'README.md': '# an adapter' } }))
      hub.repos.set('test-org/named-lora', repoFromDir(lora))
      const rt = await Runtime.load(QWEN3, { threads: 1, hub: { cacheDir: cache } })
      try {
        const events = []
        const hubbed = await rt.loadExpert('hf:test-org/tiny-lora', { onDownloadProgress: (p) => events.push(p) })
        // No manifest: named after the repository, not the snapshot's commit directory.
        assert.equal(hubbed.name, 'tiny-lora')
        const snap = path.join(cache, `test-org/tiny-lora/snapshots/${COMMIT}`)
        assert.deepEqual(fs.readdirSync(snap).sort(), ['adapter_config.json', 'adapter_model.safetensors'])
        assert.equal(events.at(-1).loadedBytes, events.at(-1).totalBytes)
        // A manifest's name wins; an explicit name wins over both.
        assert.equal((await rt.loadExpert('hf:test-org/named-lora')).name, 'lora')
        assert.equal((await rt.loadExpert('hf:test-org/named-lora', { name: 'mine' })).name, 'mine')
        const local = await rt.loadExpert(lora, { name: 'local' })
        const run = async (name) =>
          (await collect(rt.createSession({ experts: [name] }).generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 8 }))).chunks
        const [a, b] = [await run(hubbed.name), await run(local.name)]
        // The first chunk names the experts that ran: each run's own name.
        assert.deepEqual([a[0].experts, b[0].experts], [['tiny-lora'], ['local']])
        const tokens = (chunks) => chunks.map(({ experts, ...rest }) => rest)
        assert.deepEqual(tokens(a), tokens(b))
        // Cached now: offline, the same path loads without a request.
        const before = hub.requests.length
        process.env.EXPERT_RUNTIME_OFFLINE = '1'
        await hubbed.unload()
        assert.equal((await rt.loadExpert('hf:test-org/tiny-lora')).name, 'tiny-lora')
        assert.equal(hub.requests.length, before)
      } finally {
        delete process.env.EXPERT_RUNTIME_OFFLINE
        await rt.dispose()
      }
    })

    it("loadExpert('hf:…') reports the Hub's errors with their codes", async () => {
      const rt = await Runtime.load(QWEN3, { threads: 1, hub: { cacheDir: freshCache() } })
      try {
        await assert.rejects(rt.loadExpert('hf:test-org/no-such-adapter'), { code: 'MODEL_NOT_FOUND' })
        await assert.rejects(rt.loadExpert('hf:not a repo'), { code: 'INVALID_ARGUMENT' })
        // A model repository is not an adapter: refused from its listing, nothing downloaded.
        const before = hub.requests.length
        await assert.rejects(rt.loadExpert('hf:test-org/qwen3-tiny'), { code: 'INVALID_ADAPTER', message: /not a PEFT adapter repository/ })
        assert.deepEqual(hub.requests.slice(before).map((r) => r.path), ['/api/models/test-org/qwen3-tiny/revision/main'])
      } finally {
        await rt.dispose()
      }
    })
  })

  describe('several processes, one cache', () => {
    const LFS = '/cdn/test-org/qwen3-tiny/model.safetensors'
    const locksAndPartials = (cache) => walk(cache).filter((f) => /\.partial(\.lock)?$/.test(f))

    it('download each file once: one process holds its lock, the others wait and share the result', async () => {
      const cache = freshCache()
      hub.faults.set('model.safetensors', { times: 3, slow: 100 })
      const hubIndex = path.resolve('dist/hub/index.js')
      const script = `require(${JSON.stringify(hubIndex)}).fetchModel('test-org/qwen3-tiny', { cacheDir: process.argv[1] })
        .then((p) => console.log(p), (e) => { console.error(e.code, e.message); process.exit(1) })`
      const run = () =>
        new Promise((resolve, reject) =>
          execFile(process.execPath, ['-e', script, cache], (err, stdout, stderr) => (err ? reject(new Error(stderr)) : resolve(stdout.trim()))),
        )
      const before = hub.requestsTo(LFS).length
      const paths = await Promise.all([run(), run(), run()])
      assert.deepEqual(paths, Array(3).fill(path.join(cache, `test-org/qwen3-tiny/snapshots/${COMMIT}`)))
      assert.equal(hub.requestsTo(LFS).length - before, 1)
      assert.ok(fs.readFileSync(path.join(paths[0], 'model.safetensors')).equals(fs.readFileSync(path.join(QWEN3, 'model.safetensors'))))
      assert.deepEqual(locksAndPartials(cache), [])
    })

    it('a lock whose owner is gone is taken over at once: a dead process of this host, or one not touched for a minute', async () => {
      const cache = freshCache()
      const snap = path.join(cache, `test-org/qwen3-tiny/snapshots/${COMMIT}`)
      fs.mkdirSync(snap, { recursive: true })
      const dead = spawnSync(process.execPath, ['-e', '0']).pid
      fs.writeFileSync(path.join(snap, 'model.safetensors.partial.lock'), `${dead}\n${os.hostname()}\n`)
      const foreign = path.join(snap, 'tokenizer.json.partial.lock')
      fs.writeFileSync(foreign, '1\nanother-host\n')
      const old = new Date(Date.now() - 2 * 60_000)
      fs.utimesSync(foreign, old, old)
      const t0 = performance.now()
      assert.equal(await fetchModel('test-org/qwen3-tiny', { cacheDir: cache }), snap)
      assert.ok(performance.now() - t0 < 20_000)
      assert.deepEqual(locksAndPartials(cache), [])
    })

    it('a repository file named like a lock is refused', () => {
      assert.throws(() => parseHfRef('org/repo/model.gguf.partial.lock'), { code: 'INVALID_ARGUMENT', message: /reserves/ })
    })
  })

  describe('resume and integrity', () => {
    for (const repo of ['test-org/qwen3-tiny', 'test-org/no-blobs']) {
      it(`a cut connection resumes with a Range request (${repo === 'test-org/no-blobs' ? 'sha256 from X-Linked-Etag' : 'sha256 from the listing'})`, async () => {
        const c = freshCache()
        hub.faults.set('model.safetensors', { times: 1, cutAfter: 200_000 })
        const before = hub.requests.length
        const p = await fetchModel(`${repo}/model.safetensors`, { cacheDir: c })
        assert.ok(fs.readFileSync(p).equals(fs.readFileSync(path.join(QWEN3, 'model.safetensors'))))
        const cdn = hub.requests.slice(before).filter((r) => r.path.startsWith('/cdn/'))
        assert.equal(cdn.length, 2)
        assert.equal(cdn[0].headers.range, undefined)
        // From what reached the disk: at most the bytes sent (a destroyed stream drops its buffer).
        const from = Number(/^bytes=(\d+)-$/.exec(cdn[1].headers.range)?.[1])
        assert.ok(from > 0 && from <= 200_000, cdn[1].headers.range)
        assert.deepEqual(walk(c).filter((f) => f.endsWith('.partial')), [])
      })
    }

    it('gives up after repeated cuts keeping the partial, and the next call resumes it', async () => {
      const c = freshCache()
      hub.faults.set('model-f32.gguf', { times: 5, cutAfter: 65_536 })
      await assert.rejects(fetchModel('test-org/qwen3-tiny/model-f32.gguf', { cacheDir: c }), (e) => e.code === 'DOWNLOAD_FAILED' && /gave up after 5 attempts/.test(e.message) && /resumes/.test(e.message))
      const partial = path.join(c, `test-org/qwen3-tiny/snapshots/${COMMIT}/model-f32.gguf.partial`)
      const kept = fs.statSync(partial).size
      assert.ok(kept > 0 && kept <= 5 * 65_536, String(kept))
      const before = hub.requests.length
      const p = await fetchModel('test-org/qwen3-tiny/model-f32.gguf', { cacheDir: c })
      assert.ok(fs.readFileSync(p).equals(fs.readFileSync(path.join(QWEN3, 'model-f32.gguf'))))
      assert.equal(hub.requests.slice(before).find((r) => r.path.startsWith('/cdn/')).headers.range, `bytes=${kept}-`)
      assert.equal(fs.existsSync(partial), false)
    })

    for (const [repo, corrupt, code] of [
      ['test-org/qwen3-tiny', 'flip', 'CHECKSUM_MISMATCH'],
      ['test-org/no-blobs', 'flip', 'CHECKSUM_MISMATCH'],
      ['test-org/no-blobs', 'extra', 'CHECKSUM_MISMATCH'],
    ]) {
      it(`corrupt bytes (${corrupt}, ${repo}) fail with ${code} and leave nothing in the cache`, async () => {
        const c = freshCache()
        hub.faults.set('model-q8_0.gguf', { times: 1, corrupt })
        await assert.rejects(Runtime.load(`hf:${repo}/model-q8_0.gguf`, { hub: { cacheDir: c } }), { code })
        assert.deepEqual(walk(c), [])
      })
    }

    it('two concurrent calls for one file share a single download', async () => {
      const c = freshCache()
      const before = hub.requests.length
      const events = []
      const [a, b] = await Promise.all([
        fetchModel('test-org/qwen3-tiny/model-f32.gguf', { cacheDir: c }),
        fetchModel('test-org/qwen3-tiny/model-f32.gguf', { cacheDir: c }, (p) => events.push(p)),
      ])
      assert.equal(a, b)
      assert.equal(hub.requests.slice(before).filter((r) => r.path.startsWith('/cdn/')).length, 1)
      const size = fs.statSync(path.join(QWEN3, 'model-f32.gguf')).size
      assert.deepEqual(events.at(-1), { loadedBytes: size, totalBytes: size, file: 'model-f32.gguf' })
    })

    it('a file cut mid-way by a stall times out and is retried', async () => {
      const c = freshCache()
      hub.faults.set('model-q8_0.gguf', { times: 2, stall: 50_000 })
      const p = await fetchModel('test-org/qwen3-tiny/model-q8_0.gguf', { cacheDir: c, timeoutMs: 300 })
      assert.ok(fs.readFileSync(p).equals(fs.readFileSync(path.join(QWEN3, 'model-q8_0.gguf'))))
    })
  })

  describe('tokens and hostile servers', () => {
    it('HF_TOKEN goes to the Hub host only, never to the redirect host', async () => {
      process.env.HF_TOKEN = 'hf_secret'
      const before = hub.requests.length
      await fetchModel('test-org/gated/model.safetensors', { cacheDir: freshCache() })
      const seen = hub.requests.slice(before)
      const hubSide = seen.filter((r) => r.host === 'localhost')
      const cdnSide = seen.filter((r) => r.host === '127.0.0.1')
      assert.ok(hubSide.length >= 2 && cdnSide.length === 1, JSON.stringify(seen.map((r) => r.host)))
      for (const r of hubSide) assert.equal(r.headers.authorization, 'Bearer hf_secret')
      for (const r of cdnSide) assert.equal(r.headers.authorization, undefined)
    })

    it('a gated repository without a token is ACCESS_DENIED, naming HF_TOKEN', async () => {
      await assert.rejects(fetchModel('test-org/gated', { cacheDir: freshCache() }), (e) => e.code === 'ACCESS_DENIED' && /HF_TOKEN/.test(e.message))
    })

    const evilNames = ['../../escape.json', '/abs/escape.json', 'a/../../escape.json', '..\\..\\escape.json', 'nul\u0000.json', 'csi\u009b2J.json', 'x'.repeat(2 * 1024 * 1024)]
    for (const [i, name] of evilNames.entries()) {
      it(`a file list naming an unsafe path is refused (${JSON.stringify(name.slice(0, 24))})`, async () => {
        const c = freshCache()
        const repo = `evil-org/traversal-${i}`
        hub.repos.set(repo, { ...repoFromDir(QWEN3), listOnly: [name] })
        await assert.rejects(fetchModel(repo, { cacheDir: c }), (e) => e.code === 'INVALID_MODEL' && /unsafe/.test(e.message) && e.message.length < 1000)
        assert.deepEqual(walk(c), [])
        assert.ok(!walk(tmp).some((f) => f.includes('escape')))
      })
    }

    it('a shard index naming a path outside the snapshot is refused', async () => {
      const c = freshCache()
      hub.repos.set('evil-org/shard-escape', {
        ...repoFromDir(QWEN3, { exclude: ['model.safetensors'] }),
        files: new Map([
          ['config.json', Buffer.from('{}')],
          ['tokenizer.json', Buffer.from('{}')],
          ['model.safetensors.index.json', Buffer.from(JSON.stringify({ weight_map: { 'a.weight': '../../../escape.safetensors' } }))],
        ]),
      })
      await assert.rejects(fetchModel('evil-org/shard-escape', { cacheDir: c }), (e) => e.code === 'INVALID_MODEL' && /unsafe/.test(e.message))
      assert.ok(!walk(tmp).some((f) => f.includes('escape.safetensors')))
    })

    it('a redirect loop stops at the cap', async () => {
      hub.repos.set('evil-org/loop', { ...repoFromDir(QWEN3), redirectLoop: true })
      await assert.rejects(fetchModel('evil-org/loop/model-q8_0.gguf', { cacheDir: freshCache() }), (e) => e.code === 'DOWNLOAD_FAILED' && /redirects/.test(e.message))
    })

    it('an absurd X-Linked-Size is refused', async () => {
      for (const absurdSize of ['99999999999999999999', '-5', '1e9']) {
        hub.faults.set('model-q8_0.gguf', { times: 1, absurdSize })
        await assert.rejects(fetchModel('test-org/no-blobs/model-q8_0.gguf', { cacheDir: freshCache() }), (e) => e.code === 'DOWNLOAD_FAILED' && /impossible/.test(e.message), absurdSize)
      }
    })

    it('an API answer past 16 MiB is cut off (declared or streamed)', async () => {
      hub.repos.set('evil-org/huge', repoFromDir(QWEN3))
      hub.apiOverride.set('evil-org/huge', (req, res) => {
        // Chunked, no Content-Length: only counting the bytes stops it.
        res.writeHead(200, { 'content-type': 'application/json' })
        res.write('{"sha":"')
        for (let i = 0; i < 20; i++) res.write(Buffer.alloc(1024 * 1024, 0x20))
        res.end()
      })
      await assert.rejects(fetchModel('evil-org/huge', { cacheDir: freshCache() }), (e) => e.code === 'DOWNLOAD_FAILED' && /larger than 16777216/.test(e.message))
      hub.apiOverride.set('evil-org/huge', (req, res) => {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(2 ** 39) })
        res.end()
      })
      await assert.rejects(fetchModel('evil-org/huge', { cacheDir: freshCache() }), (e) => e.code === 'DOWNLOAD_FAILED' && /larger than/.test(e.message))
    })
  })

  describe('expert-runtime pull', () => {
    const env = () => {
      const e = { ...process.env, HF_ENDPOINT: hub.hubUrl }
      for (const k of ['HF_TOKEN', 'HUGGING_FACE_HUB_TOKEN', 'HF_HUB_OFFLINE', 'EXPERT_RUNTIME_OFFLINE']) delete e[k]
      return e
    }

    it('prints the local path on stdout and progress on stderr', async () => {
      const c = freshCache()
      const one = await cli(['pull', 'test-org/qwen3-tiny:model-q8_0.gguf', '--cache', c], env())
      assert.equal(one.code, 0, one.stderr)
      const p = path.join(c, `test-org/qwen3-tiny/snapshots/${COMMIT}/model-q8_0.gguf`)
      assert.equal(one.stdout, p + '\n')
      assert.ok(fs.readFileSync(p).equals(fs.readFileSync(path.join(QWEN3, 'model-q8_0.gguf'))))
      assert.match(one.stderr, /100% \(/)
      // A whole repository, into $EXPERT_RUNTIME_CACHE/hub when --cache is not given.
      const all = await cli(['pull', `test-org/qwen3-tiny@${COMMIT}`, '--quiet'], { ...env(), EXPERT_RUNTIME_CACHE: c })
      assert.equal(all.code, 0, all.stderr)
      assert.equal(all.stdout, path.join(c, 'hub', `test-org/qwen3-tiny/snapshots/${COMMIT}`) + '\n')
      assert.equal(all.stderr, '')
      // Offline, from the cache.
      const offline = await cli(['pull', 'test-org/qwen3-tiny', '--revision', COMMIT, '--offline'], { ...env(), EXPERT_RUNTIME_CACHE: c, HF_ENDPOINT: 'http://127.0.0.1:1' })
      assert.equal(offline.stdout, all.stdout)
    })

    it('fails with the error code (exit 1) and refuses bad arguments (exit 2)', async () => {
      const missing = await cli(['pull', 'test-org/nope', '--cache', freshCache()], env())
      assert.equal(missing.code, 1)
      assert.match(missing.stderr, /MODEL_NOT_FOUND/)
      assert.equal(missing.stdout, '')
      for (const args of [['pull'], ['pull', 'just-a-name'], ['pull', 'a/b@x', '--revision', 'y'], ['pull', 'a/b', 'c'], ['pull', 'a/b', '--timeout-ms', '0']]) {
        const r = await cli(args, env())
        assert.equal(r.code, 2, args.join(' '))
        assert.match(r.stderr, /usage: expert-runtime pull/)
      }
    })
  })
})
