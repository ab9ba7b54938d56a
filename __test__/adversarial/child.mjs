// Runs the given cases of buildCases() in this process (started by adversarial.test.mjs
// under an address-space limit) and prints one JSON line per event, synchronously (stdout is a
// pipe), so the parent knows which case was running if this process dies or hangs:
//   {"hello": count, "hash": …}                   the case list this process built
//   {"s": i}                                      case i starts
//   {"d": i, "ok": true, "ms": …}                 case i succeeded
//   {"d": i, "stage": …, "err": {…}, "ms": …}     case i failed (the parent judges the code)
//   {"final": {…}}                                the end-of-process checks
// Usage: node child.mjs <tmpdir> <indices>, indices as ranges: `0-99,140,200-210`.
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { createRequire } from 'node:module'
import fs from 'node:fs'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { FIXTURES, GREEDY, fixture, reference } from '../helpers.mjs'
import { buildCases } from './cases.mjs'

const require = createRequire(import.meta.url)
const { Runtime, ExpertRuntimeError } = require('../../dist/index.js')

const TMP = path.resolve(process.argv[2])
const INDICES = process.argv[3].split(',').flatMap((r) => {
  const [a, b = a] = r.split('-').map(Number)
  return Array.from({ length: b - a + 1 }, (_, k) => a + k)
})
const MODEL = fixture('qwen3-tiny')
const REF = reference('qwen3-tiny')
const PROMPT = REF.prompt_ids

const print = (o) => fs.writeSync(1, JSON.stringify(o) + '\n')

/** What the parent needs of an error. */
function describe(e) {
  if (e === null || (typeof e !== 'object' && typeof e !== 'function')) return { name: typeof e, message: String(e) }
  return { name: e.constructor?.name ?? 'Object', code: e instanceof ExpertRuntimeError ? e.code : undefined, plainCode: e instanceof ExpertRuntimeError ? undefined : e.code, message: String(e.message).slice(0, 400) }
}

let shared
let sharedPromise
/** The qwen3-tiny runtime that API and adapter cases share. */
async function getShared() {
  sharedPromise ??= Runtime.load(MODEL).then((rt) => (shared = rt))
  return sharedPromise
}

async function makeSpecial(p, kind) {
  switch (kind) {
    case 'fifo':
      execFileSync('mkfifo', [p])
      break
    case 'dir':
      await fs.promises.mkdir(p)
      break
    case 'zero':
    case 'null':
    case 'urandom':
      await fs.promises.symlink(`/dev/${kind}`, p)
      break
    case 'dangling':
      await fs.promises.symlink(path.join(path.dirname(p), 'does-not-exist'), p)
      break
    case 'loop':
      await fs.promises.symlink(p, p)
      break
    case 'proc':
      await fs.promises.symlink('/proc/self/status', p)
      break
    case 'sparse-1g': {
      const fd = fs.openSync(p, 'w')
      fs.ftruncateSync(fd, 1 << 30)
      fs.closeSync(fd)
      break
    }
    default:
      throw new Error(`unknown special ${kind}`)
  }
  return p
}

class Ctx {
  constructor(i) {
    this.dir = path.join(TMP, `c${i}`)
    this.stage = 'call'
    this.runtimes = []
    this.sessions = []
    this.experts = []
    this.usedShared = false
  }

  async caseDir() {
    await fs.promises.mkdir(this.dir, { recursive: true })
    return this.dir
  }

  fail(msg) {
    throw Object.assign(new Error(msg), { assertion: true })
  }

  async shared() {
    this.usedShared = true
    const stage = this.stage
    this.stage = 'setup'
    const rt = await getShared()
    this.stage = stage
    return rt
  }

  async session(options) {
    const rt = await this.shared()
    this.stage = 'call'
    const s = arguments.length === 0 ? rt.createSession() : rt.createSession(options)
    this.sessions.push(s)
    return s
  }

  async load(p, options) {
    // Runtime.estimate reads what a load reads before the weights: on every hostile model and
    // option it must answer or fail with a typed error, and it never decides the case.
    const plain = options === undefined || (options !== null && typeof options === 'object' && !Array.isArray(options))
    if (typeof p === 'string' && plain) {
      this.stage = 'estimate'
      const { onProgress, hub, onDownloadProgress, ...engineOptions } = options ?? {}
      try {
        await Runtime.estimate(p, engineOptions)
      } catch (e) {
        if (!(e instanceof ExpertRuntimeError) || e.code === 'INTERNAL') throw e
      }
    }
    this.stage = 'load'
    const rt = await (arguments.length < 2 ? Runtime.load(p) : Runtime.load(p, options))
    this.runtimes.push(rt)
    return rt
  }

  /** Exercises a loaded model (or expert): raw tokens greedy, a chat turn sampled, tokenizer round trips. */
  async probe(rt, { experts, defaults } = {}) {
    this.stage = 'probe'
    const x = experts ? { experts } : {}
    const s = rt.createSession()
    try {
      await s.complete({ tokens: PROMPT }, { ...GREEDY, maxTokens: 2, ...x })
      s.reset()
      await s.complete({ text: 'Once upon a time' }, { ...GREEDY, maxTokens: 2, ...x })
      s.reset()
      await s.complete('Hi there', defaults ? { maxTokens: 2, ...x } : { temperature: 0.8, topK: 0, topP: 0.9, seed: 3, maxTokens: 2, ...x })
      for (const text of ['Hello 日本 🤖 <|im_end|> aaaa', `${'x'.repeat(40)}z`]) rt.detokenize(rt.tokenize(text))
    } finally {
      s.dispose()
    }
  }

  async loadAndProbe(p, ...rest) {
    const [options, probeOptions] = rest
    const rt = await (rest.length === 0 ? this.load(p) : this.load(p, options))
    await this.probe(rt, probeOptions)
    this.stage = 'dispose'
    await rt.dispose()
  }

  async loadExpert(p, ...rest) {
    const rt = await this.shared()
    this.stage = 'load'
    const e = await (rest.length === 0 ? rt.loadExpert(p) : rt.loadExpert(p, rest[0]))
    this.experts.push(e)
    return e
  }

  async loadExpertAndProbe(p, ...rest) {
    const e = await this.loadExpert(p, ...rest)
    await this.probe(shared, { experts: [e.name] })
    this.stage = 'unload'
    await e.unload()
  }

  async drain(stream) {
    for await (const _ of stream) {
      /* drain */
    }
    return stream.result
  }

  /** A copy of a fixture model directory: unchanged files linked, `edits` written (null: absent). */
  async modelDir(base, edits) {
    return this.#copyDir(fixture(base), base, edits)
  }

  async adapterDir(name, edits) {
    return this.#copyDir(fixture('adapters', name), name, edits)
  }

  async #copyDir(src, name, edits) {
    const dir = path.join(await this.caseDir(), name)
    await fs.promises.mkdir(dir)
    const names = new Set([...(await fs.promises.readdir(src)), ...Object.keys(edits)])
    for (const f of names) {
      const p = path.join(dir, f)
      // An edit: null (absent), { special }, or the content (a string, a Buffer, or a function making one).
      const e = typeof edits[f] === 'function' ? edits[f]() : edits[f]
      if (!(f in edits)) await fs.promises.symlink(path.join(src, f), p)
      else if (e === null) continue
      else if (typeof e === 'object' && !Buffer.isBuffer(e)) await makeSpecial(p, e.special)
      else await fs.promises.writeFile(p, e)
    }
    return dir
  }

  async special(name, kind) {
    return makeSpecial(path.join(await this.caseDir(), name), kind)
  }

  async emptyDir(name) {
    const p = path.join(await this.caseDir(), name)
    await fs.promises.mkdir(p)
    return p
  }

  async file(name, content) {
    const p = path.join(await this.caseDir(), name)
    await fs.promises.writeFile(p, content)
    return p
  }

  /** Frees what the case left; a failure here is the case's failure. */
  async cleanup() {
    const errors = []
    for (const s of this.sessions) {
      try {
        s.dispose()
      } catch (e) {
        errors.push(e)
      }
    }
    for (const e of this.experts) {
      try {
        if (e.loaded) await e.unload()
      } catch (err) {
        // An expert of a runtime disposed since is gone with it.
        if (err?.code !== 'DISPOSED') errors.push(err)
      }
    }
    for (const rt of this.runtimes) {
      try {
        await rt.dispose()
      } catch (e) {
        errors.push(e)
      }
    }
    await fs.promises.rm(this.dir, { recursive: true, force: true })
    if (errors.length) throw errors[0]
  }
}

/** The shared runtime holds no session, request or expert once a case has cleaned up. */
async function sharedLeak() {
  if (!shared) return undefined
  let last
  for (let i = 0; i < 100; i++) {
    const s = shared.stats()
    const experts = shared.experts.length
    if (s.sessions === 0 && s.activeRequests === 0 && s.queuedRequests === 0 && experts === 0) return undefined
    last = `sessions ${s.sessions}, activeRequests ${s.activeRequests}, queuedRequests ${s.queuedRequests}, experts ${experts}`
    await sleep(20)
  }
  return `the shared runtime still holds ${last} after the case`
}

/** Greedy tokens of the reference prompt equal the committed HF reference (of the runtime's dtype). */
async function referenceCheck(rt) {
  const s = rt.createSession()
  try {
    const ref = REF[rt.info.dtype] ?? REF.f32
    const r = await s.complete({ tokens: PROMPT }, { ...GREEDY, maxTokens: ref.steps.length })
    const want = ref.steps.map((x) => x.token)
    return JSON.stringify(r.tokens) === JSON.stringify(want) ? null : `greedy tokens ${JSON.stringify(r.tokens)}, reference ${JSON.stringify(want)}`
  } finally {
    s.dispose()
  }
}

/** Open files and mappings of anything under the case directories or the fixtures. */
function heldFiles() {
  const roots = [TMP, path.resolve(FIXTURES)].map((r) => r + path.sep)
  const fds = []
  for (const fd of fs.readdirSync('/proc/self/fd')) {
    let target
    try {
      target = fs.readlinkSync(`/proc/self/fd/${fd}`)
    } catch {
      continue
    }
    if (roots.some((r) => target.startsWith(r))) fds.push(`fd ${fd} -> ${target}`)
  }
  const maps = new Set()
  for (const line of fs.readFileSync('/proc/self/maps', 'utf8').split('\n')) {
    const file = line.split(/\s+/).slice(5).join(' ')
    if (roots.some((r) => file.startsWith(r))) maps.add(`mapped ${file}`)
  }
  return [...fds, ...maps]
}

/**
 * The process's threads, less the render threads of chat templates that were stopped
 * (bounded.rs: such a thread parks for good, holding at most its budget): `{ count, parked,
 * busy }`, where `busy` counts template threads still running (a stopped one should be asleep).
 */
const tasks = () => {
  let count = 0
  let parked = 0
  let busy = 0
  for (const t of fs.readdirSync('/proc/self/task')) {
    let stat = ''
    try {
      stat = fs.readFileSync(`/proc/self/task/${t}/stat`, 'utf8')
    } catch {
      continue // ended meanwhile
    }
    const close = stat.lastIndexOf(')')
    const name = stat.slice(stat.indexOf('(') + 1, close)
    if (name !== 'chat-template') count++
    else if (stat[close + 2] === 'S') parked++
    else busy++
  }
  return { count, parked, busy }
}
const threads = () => tasks().count

async function main() {
  const cases = buildCases()
  print({ hello: cases.length, hash: createHash('sha256').update(cases.map((c) => c.id).join('\n')).digest('hex') })
  await fs.promises.mkdir(TMP, { recursive: true })
  // Baseline after one load, request, expert loads and dispose: the process-wide thread pools
  // (the prompt preparation pool; rayon's global pool, first used by an expert load that
  // copies weights or an unload) exist from then on, and threads a case leaves behind are
  // counted against it.
  const warm = await Runtime.load(MODEL)
  await referenceCheck(warm)
  await (await warm.loadExpert(fixture('adapters', 'lora'))).unload()
  await (await warm.loadExpert(fixture('adapters', 'lora'), { mmap: false })).unload()
  await warm.dispose()
  for (let i = 0; i < 3; i++) await sleep(50)
  const baseThreads = threads()
  for (const i of INDICES) {
    const c = cases[i]
    print({ s: i })
    const t0 = performance.now()
    const ctx = new Ctx(i)
    let out
    try {
      await c.run(ctx)
      out = { ok: true }
    } catch (e) {
      out = { stage: e?.assertion ? 'assert' : ctx.stage, err: describe(e) }
    }
    try {
      await ctx.cleanup()
    } catch (e) {
      if (out.ok) out = { stage: 'cleanup', err: describe(e) }
    }
    if (ctx.usedShared) {
      const leak = await sharedLeak()
      if (leak) out.leak = leak
    }
    print({ d: i, ...out, ms: Math.round(performance.now() - t0) })
  }
  const final = {}
  if (shared) {
    final.shared = await referenceCheck(shared)
    await shared.dispose()
  }
  const fresh = await Runtime.load(MODEL)
  final.fresh = await referenceCheck(fresh)
  await fresh.dispose()
  for (let i = 0; i < 3; i++) {
    global.gc?.()
    await sleep(50)
  }
  final.held = heldFiles()
  // A disposed runtime's worker threads exit on their own after it resolves (a thread pool's
  // drop does not join them): give them a moment, more on a busy machine, before counting.
  for (let i = 0; i < 60 && threads() > baseThreads + 2; i++) await sleep(50)
  const { count, parked, busy } = tasks()
  final.threads = { base: baseThreads, end: count, parked, busy }
  final.resources = process.getActiveResourcesInfo()
  print({ final })
  process.exit(0)
}

main().catch((e) => {
  print({ fatal: describe(e) })
  process.exit(2)
})
