// Helpers shared by the benchmarks (cpu.mjs, experts.mjs, batch.mjs): each measurement runs in a fresh
// child process, after waiting for an idle machine, on files already in the page cache.
import { spawnSync } from 'node:child_process'
import { closeSync, createReadStream, existsSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync, writeSync } from 'node:fs'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { Writable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { fileURLToPath } from 'node:url'

const MB = 1024 * 1024
/** The repository root. */
export const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')

function cpuTimes() {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number)
  return { idle: f[3] + (f[4] || 0), total: f.reduce((a, b) => a + b, 0) }
}

/** Waits (up to `maxS`) for a second in which the machine is at least 90% idle; returns that fraction. */
async function waitIdle(maxS) {
  if (process.platform !== 'linux' || maxS <= 0) return null
  const t0 = Date.now()
  let idle = 0
  for (;;) {
    const a = cpuTimes()
    await new Promise((r) => setTimeout(r, 1000))
    const b = cpuTimes()
    idle = (b.idle - a.idle) / Math.max(1, b.total - a.total)
    if (idle >= 0.9 || Date.now() - t0 > maxS * 1000) return idle
  }
}

/**
 * Runs `script --child <spec as JSON>` and returns the object it printed on its
 * `BENCH_RESULT ` line; `label` names the child in the error when it fails.
 */
export function runChild(script, spec, label) {
  const r = spawnSync(process.execPath, [script, '--child', JSON.stringify(spec)], {
    encoding: 'utf8',
    maxBuffer: 64 * MB,
    timeout: 30 * 60 * 1000,
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const line = (r.stdout || '').split('\n').find((l) => l.startsWith('BENCH_RESULT '))
  if (r.status !== 0 || !line) {
    throw new Error(`child ${label} failed (status ${r.status}, signal ${r.signal}):\n${r.stderr}\n${r.stdout}`)
  }
  return JSON.parse(line.slice('BENCH_RESULT '.length))
}

/** Reads every file (of a directory, not recursing) once so the engines load from a warm page cache. */
export async function warmPageCache(path) {
  const files = statSync(path).isDirectory() ? readdirSync(path).map((f) => join(path, f)).filter((f) => statSync(f).isFile()) : [path]
  for (const f of files) {
    await pipeline(createReadStream(f, { highWaterMark: 8 * MB }), new Writable({ write: (_c, _e, cb) => cb() }))
  }
}

/** The short commit, `+dirty` when engine sources differ from it. */
export function gitRev() {
  const r = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' })
  const d = spawnSync('git', ['status', '--porcelain', '--', 'src', 'lib', 'Cargo.toml', 'Cargo.lock'], { cwd: root, encoding: 'utf8' })
  return r.status === 0 ? r.stdout.trim() + (d.stdout.trim() ? '+dirty' : '') : null
}

/**
 * Parses the options every benchmark takes (--quick, --threads, --repeat, --out, --wait-idle,
 * --child, --help) and checks them. `extra(k, next, a)` handles a benchmark's own options and
 * returns true when it consumed `k` (`next()` reads its value); `defaults` seeds them.
 */
export function parseBenchArgs(argv, { usage, help = [], defaults = {}, extra = () => false }) {
  const a = { quick: false, threads: os.availableParallelism(), repeat: 1, child: null, out: null, waitIdle: 120, ...defaults }
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i]
    const next = () => argv[++i]
    if (k === '--quick') a.quick = true
    else if (k === '--threads') a.threads = Number(next())
    else if (k === '--repeat') a.repeat = Number(next())
    else if (k === '--out') a.out = next()
    else if (k === '--wait-idle') a.waitIdle = Number(next())
    else if (k === '--child') a.child = next()
    else if (k === '--help' || k === '-h') {
      console.log(`usage: ${usage}`)
      for (const line of help) console.log(line)
      process.exit(0)
    } else if (!extra(k, next, a)) throw new Error(`unknown argument ${k}`)
  }
  if (!(Number.isInteger(a.threads) && a.threads > 0)) throw new Error('--threads must be a positive integer')
  if (!(Number.isInteger(a.repeat) && a.repeat > 0)) throw new Error('--repeat must be a positive integer')
  if (!(Number.isFinite(a.waitIdle) && a.waitIdle >= 0)) throw new Error('--wait-idle must be a number of seconds >= 0')
  return a
}

// ------------------------------------------------------------------------------------------
// A run from start to results (cpu.mjs, experts.mjs, batch.mjs)
// ------------------------------------------------------------------------------------------

/**
 * A benchmark's entry point. With `--child SPEC`: `child(spec)` in this process, its result
 * printed on the `BENCH_RESULT ` line that `runChild` reads; otherwise `parent(args)`.
 */
export async function benchMain(args, parent, child) {
  if (args.child) {
    const res = await child(JSON.parse(args.child))
    process.stdout.write('BENCH_RESULT ' + JSON.stringify(res) + '\n')
    process.exit(0)
  } else {
    await parent(args)
  }
}

/** Throws unless the JS layer is built (the children load dist/index.js). */
export function assertBuilt() {
  if (!existsSync(join(root, 'dist', 'index.js'))) throw new Error('dist/index.js is missing: run `npm run build` first')
}

/** The installed node-llama-cpp version. */
export const nodeLlamaCppVersion = () => JSON.parse(readFileSync(join(root, 'node_modules', 'node-llama-cpp', 'package.json'), 'utf8')).version

const loadavgText = (load) => load.map((x) => x.toFixed(2)).join(' ')

/** The load average before the run, with a warning on stderr when other work would skew CPU timings. */
export function loadAtStart() {
  const load = os.loadavg()
  if (load[0] > 0.5) console.error(`warning: load average ${loadavgText(load)}; other work skews CPU timings`)
  return load
}

/** `load average: start …, end …` for the summary. */
export const loadSummary = (load0, load1) => `load average: start ${loadavgText(load0)}, end ${loadavgText(load1)}`

/** Waits for an idle machine (--wait-idle), then says on stderr which measurement of repeat `rep` starts; returns the idle fraction. */
export async function waitIdleThenSay(args, rep, what) {
  const idle = await waitIdle(args.waitIdle)
  console.error(`[${rep + 1}/${args.repeat}] ${what}${idle == null ? '' : ` (machine ${(idle * 100).toFixed(0)}% idle before)`}`)
  return idle
}

/** `<CPU model> x<cores>`, for the summary line. */
export const machineName = () => `${os.cpus()[0]?.model} x${os.availableParallelism()}`

/** A figure with `d` decimals, or `—` when there is none. */
export const fmt = (x, d = 1) => (x == null || !Number.isFinite(x) ? '—' : x.toFixed(d))

/** The fields every results file starts with: when, which commit, threads and repeats. */
export const runInfo = (args) => ({ date: new Date().toISOString(), git: gitRev(), threads: args.threads, repeat: args.repeat })

/** The machine a run measured, with the load average at its start and end. */
export const machineInfo = (load0, load1) => ({
  cpu: os.cpus()[0]?.model, cores: os.availableParallelism(), memGB: os.totalmem() / 2 ** 30, loadavgStart: load0, loadavgEnd: load1,
})

/** The default results file of a `kind` run: <cacheDir>/bench-results/<kind>-<date>.json. */
export function resultsPath(cacheDir, kind) {
  const date = new Date().toISOString().replace(/[:]/g, '-').replace(/\..*/, '')
  return join(cacheDir, 'bench-results', `${kind}-${date}.json`)
}

/** Writes the results as JSON and prints where. */
export function writeResults(outFile, results) {
  mkdirSync(dirname(outFile), { recursive: true })
  writeFileSync(outFile, JSON.stringify(results, null, 2) + '\n')
  console.log(`\nJSON: ${outFile}`)
}

/** Runs `run` over `items`, `width` at a time (each worker takes the next item when it is done). */
export async function pool(items, width, run) {
  let next = 0
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < items.length) await run(items[next++])
  }))
}

/** `n` deterministic token ids in `[range[0], range[1])` from `seed` (mulberry32). */
export function randomTokens(seed, n, range) {
  const r = mulberry32(seed)
  return Array.from({ length: n }, () => range[0] + Math.floor(r() * (range[1] - range[0])))
}

// ------------------------------------------------------------------------------------------
// Concurrent streams (batch.mjs, gpu.mjs)
// ------------------------------------------------------------------------------------------

/** Cores busy between two `process.cpuUsage()` marks `ms` apart. */
const busy = (a, b, ms) => (a && b && ms > 0 ? ((b.user - a.user + b.system - a.system) / 1000) / ms : null)

/**
 * Opens n streams in one tick (`open(i)` returns an async iterable) and consumes them
 * concurrently, timestamping every chunk. `isEnd(chunk)` ends a stream before counting the chunk,
 * `limit` after that many chunks; `onChunk(i, t, times)` sees every chunk.
 */
export async function concurrent(n, open, { isEnd, limit, onChunk } = {}) {
  const times = Array.from({ length: n }, () => [])
  const marks = { withFirst: 0, cpuT0: null, cpuT1: null, ends: [] }
  const tStart = performance.now()
  const cpuStart = process.cpuUsage()
  await Promise.all(Array.from({ length: n }, async (_, i) => {
    const it = open(i)
    for await (const c of it) {
      const t = performance.now()
      if (isEnd && isEnd(c)) break
      times[i].push(t)
      if (times[i].length === 1 && ++marks.withFirst === n) marks.cpuT0 = process.cpuUsage()
      onChunk?.(i, t, times)
      if (limit && times[i].length >= limit) break
    }
    if (!marks.cpuT1) marks.cpuT1 = process.cpuUsage()
    marks.ends[i] = it.result?.finishReason ?? null
  }))
  return { times, tStart, cpuStart, marks, cpuEnd: process.cpuUsage() }
}

/**
 * Aggregate decode tok/s of a `concurrent` run. T0 = when every stream has its first token,
 * T1 = when the first stream gets its last one; tok/s = chunks stamped in (T0, T1] / (T1 − T0)
 * (`method: 'window'`). With fewer than 2n chunks in that window (a stream ended early), it is
 * every chunk after each stream's first / (last chunk − T0) (`method: 'fallback'`).
 */
export function aggregate({ times, tStart, marks }) {
  const n = times.length
  const started = times.filter((t) => t.length > 0)
  const total = times.reduce((a, t) => a + t.length, 0)
  const res = { n, totalTokens: total, sessionsWithTokens: started.length }
  if (!started.length) return { ...res, tps: null, method: 'none' }
  const T0 = Math.max(...started.map((t) => t[0]))
  const T1 = Math.min(...started.map((t) => t[t.length - 1]))
  const inWindow = times.reduce((a, t) => a + t.filter((x) => x > T0 && x <= T1).length, 0)
  Object.assign(res, { prefillMs: T0 - tStart, windowMs: T1 - T0, windowTokens: inWindow })
  if (T1 > T0 && inWindow >= 2 * n && started.length === n) {
    res.tps = inWindow / ((T1 - T0) / 1000)
    res.method = 'window'
    res.busyCores = busy(marks.cpuT0, marks.cpuT1, T1 - T0)
  } else {
    const after = started.reduce((a, t) => a + t.length - 1, 0)
    const last = Math.max(...started.map((t) => t[t.length - 1]))
    res.tps = last > T0 ? after / ((last - T0) / 1000) : null
    res.method = 'fallback'
    res.fallbackTokens = after
  }
  return res
}

// ------------------------------------------------------------------------------------------
// Random PEFT LoRA adapters (experts.mjs, batch.mjs)
// ------------------------------------------------------------------------------------------

/** mulberry32: a seeded generator of uniform numbers in [0, 1). */
export function mulberry32(seed) {
  let s = seed >>> 0
  return () => {
    s = (s + 0x6d2b79f5) >>> 0
    let t = s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** [in, out] of each LoRA target module, from an HF config.json-like object. */
export function loraModuleShapes(cfg) {
  const h = cfg.hidden_size
  const hd = cfg.head_dim ?? h / cfg.num_attention_heads
  const q = cfg.num_attention_heads * hd
  const kv = (cfg.num_key_value_heads ?? cfg.num_attention_heads) * hd
  const ff = cfg.intermediate_size
  return {
    q_proj: [h, q], k_proj: [h, kv], v_proj: [h, kv], o_proj: [q, h],
    gate_proj: [h, ff], up_proj: [h, ff], down_proj: [ff, h],
  }
}

/** Minimal safetensors writer: F32 tensors, in the given order. `tensors`: [name, shape, fill(Float32Array)]. */
const f32Scratch = new Float32Array(1)
const u32Scratch = new Uint32Array(f32Scratch.buffer)

/** The IEEE half-precision bits of `v`, rounded to nearest even (as numpy / torch convert). */
export function toF16Bits(v) {
  f32Scratch[0] = v
  const x = u32Scratch[0]
  const sign = (x >>> 16) & 0x8000
  const exp = (x >>> 23) & 0xff
  const mant = x & 0x7fffff
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0)
  const e = exp - 127 + 15
  if (e >= 0x1f) return sign | 0x7c00
  if (e <= 0) {
    if (e < -10) return sign
    const m = mant | 0x800000
    const shift = 14 - e
    let h = m >>> shift
    const rem = m & ((1 << shift) - 1)
    const half = 1 << (shift - 1)
    if (rem > half || (rem === half && h & 1)) h++
    return sign | h
  }
  let h = (e << 10) | (mant >>> 13)
  const rem = mant & 0x1fff
  if (rem > 0x1000 || (rem === 0x1000 && h & 1)) h++
  return sign | h
}

/**
 * Writes a safetensors file of `tensors` ([name, shape, fill(Float32Array)]), stored as F32 or
 * (`dtype: 'F16'`) rounded to half precision.
 */
export function writeSafetensorsF32(file, tensors, dtype = 'F32') {
  const size = dtype === 'F16' ? 2 : 4
  const header = { __metadata__: { format: 'pt' } }
  let off = 0
  for (const [name, shape] of tensors) {
    const n = shape.reduce((a, b) => a * b, 1) * size
    header[name] = { dtype, shape, data_offsets: [off, off + n] }
    off += n
  }
  let json = JSON.stringify(header)
  json += ' '.repeat((8 - (Buffer.byteLength(json) % 8)) % 8)
  const len = Buffer.alloc(8)
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)))
  const fd = openSync(file, 'w')
  try {
    writeSync(fd, len)
    writeSync(fd, Buffer.from(json))
    for (const [, shape, fill] of tensors) {
      const a = new Float32Array(shape.reduce((x, y) => x * y, 1))
      fill(a)
      if (size === 4) {
        writeSync(fd, new Uint8Array(a.buffer))
      } else {
        const h = new Uint16Array(a.length)
        for (let i = 0; i < a.length; i++) h[i] = toF16Bits(a[i])
        writeSync(fd, new Uint8Array(h.buffer))
      }
    }
  } finally {
    closeSync(fd)
  }
}

const LORA_MLP = new Set(['gate_proj', 'up_proj', 'down_proj'])

/**
 * Writes a random PEFT LoRA directory (adapter_config.json + adapter_model.safetensors, F32
 * or `dtype: 'F16'`,
 * A and B ~ U(-init, init) from `seed`) for a llama/qwen-style model described by `cfg`
 * (hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
 * num_hidden_layers). Written to a temporary directory, then renamed into place.
 */
export function writeLoraDir(dir, cfg, { rank = 8, alpha = 16, seed = 1, init = 0.01, modules = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'], dtype = 'F32' } = {}) {
  const shapes = loraModuleShapes(cfg)
  const tmp = `${dir}.tmp-${process.pid}`
  rmSync(tmp, { recursive: true, force: true })
  mkdirSync(tmp, { recursive: true })
  writeFileSync(join(tmp, 'adapter_config.json'), JSON.stringify({
    peft_type: 'LORA', r: rank, lora_alpha: alpha, target_modules: modules, task_type: 'CAUSAL_LM',
    bias: 'none', use_rslora: false, use_dora: false, lora_dropout: 0.0, fan_in_fan_out: false,
  }, null, 2) + '\n')
  const r = mulberry32(seed)
  const fill = (a) => { for (let j = 0; j < a.length; j++) a[j] = (r() * 2 - 1) * init }
  const tensors = []
  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    for (const m of modules) {
      const [inF, outF] = shapes[m]
      const p = `base_model.model.model.layers.${l}.${LORA_MLP.has(m) ? 'mlp' : 'self_attn'}.${m}`
      tensors.push([`${p}.lora_A.weight`, [rank, inF], fill])
      tensors.push([`${p}.lora_B.weight`, [outF, rank], fill])
    }
  }
  writeSafetensorsF32(join(tmp, 'adapter_model.safetensors'), tensors, dtype)
  rmSync(dir, { recursive: true, force: true })
  mkdirSync(dirname(dir), { recursive: true })
  renameSync(tmp, dir)
}

/** What the process holds on the runtime's GPU (deviceMemoryTotal − deviceMemoryFree), in
 *  bytes; `null` on CPU (gpu.mjs, gpu-prefill.mjs). */
export function deviceMemoryUsed(rt) {
  const s = rt.stats()
  return s.deviceMemoryTotal === null ? null : s.deviceMemoryTotal - s.deviceMemoryFree
}
