// `npm run bench:load [-- --modes mapped,copy,q8_0,q4_0,q4_k] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`:
// how fast the Qwen3-0.6B-shaped random model loads from its f32 safetensors
// (scripts/bench-model.mjs), and how much memory it holds, per way of holding the weights:
//
//   mapped  the default: f32 weights read in place from the memory map (zero-copy)
//   copy    `mmap: false`: f32 weights copied into memory
//   q8_0 / q4_0 / q4_k   `quantize`: quantized on load, streaming from the map
//
// Each (mode, cache state) runs in a fresh child process. "cold": the model file is evicted
// from the page cache first (posix_fadvise DONTNEED, through python3; clean pages of a file
// nobody maps are dropped), so the load reads the disk; "warm": the file was just read. Per
// run: load ms (`Runtime.load` until ready), RSS added by the load, then one request (a
// seeded 128-token prompt, 33 greedy tokens) that touches every weight: prefill and decode
// tok/s, and the peak RSS of the process over its RSS before the load (VmHWM; for mapped
// weights the file's pages count once they are touched). Reported with `rt.info.weightBytes`
// and `rt.info.quantization`, the file size, and peak RSS as a multiple of the file size.
//
// Results: a table on stdout, JSON under <cacheDir>/bench-results/load-<date>.json.
import { execFileSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { cacheDir } from '../scripts/assets.mjs'
import { ensureQwen3Bench } from '../scripts/bench-model.mjs'
import {
  assertBuilt, benchMain, fmt, loadAtStart, loadSummary, machineInfo, machineName, parseBenchArgs, randomTokens, resultsPath, root,
  runChild, runInfo, waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)
const self = fileURLToPath(import.meta.url)
const MB = 2 ** 20
const MODES = { mapped: {}, copy: { mmap: false }, q8_0: { quantize: 'q8_0' }, q4_0: { quantize: 'q4_0' }, q4_k: { quantize: 'q4_k' } }

const args = parseBenchArgs(process.argv.slice(2), {
  usage: 'node benches/load.mjs [--modes mapped,copy,q8_0,q4_0,q4_k] [--threads N] [--repeat N] [--wait-idle S] [--out FILE]',
  defaults: { modes: Object.keys(MODES) },
  extra: (k, next, a) => {
    if (k !== '--modes') return false
    a.modes = next().split(',')
    for (const m of a.modes) if (!(m in MODES)) throw new Error(`--modes: one of ${Object.keys(MODES).join(', ')}, not ${m}`)
    return true
  },
})

/** kB fields of /proc/self/status, in bytes. */
function status() {
  const s = readFileSync('/proc/self/status', 'utf8')
  const kb = (k) => Number(s.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN) * 1024
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') }
}

async function child({ model, mode, threads }) {
  const { Runtime } = require(`${root}/dist/index.js`)
  const before = status()
  const t0 = performance.now()
  const rt = await Runtime.load(model, { ...MODES[mode], threads, contextLength: 1024 })
  const loadMs = performance.now() - t0
  const loaded = status()
  const s = rt.createSession()
  const ids = [1000, 100000]
  const r = await s.complete({ tokens: randomTokens(11, 128, ids) }, { temperature: 0, maxTokens: 33 })
  const after = status()
  const out = {
    mode,
    loadMs,
    quantization: rt.info.quantization,
    weightBytes: rt.info.weightBytes,
    loadRssMB: (loaded.rss - before.rss) / MB,
    peakRssMB: (after.hwm - before.rss) / MB,
    prefillTokS: r.timings.prefillTokensPerSecond,
    decodeTokS: r.timings.tokensPerSecond,
    tokens: r.tokens ?? null,
  }
  await rt.dispose()
  return out
}

/** Drops `dir`'s files from the page cache. */
function evict(dir) {
  const files = readdirSync(dir).map((f) => join(dir, f))
  const code = 'import os,sys\nfor p in sys.argv[1:]:\n  fd=os.open(p,os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)'
  execFileSync('python3', ['-c', code, ...files])
}

async function parent(a) {
  assertBuilt()
  const model = ensureQwen3Bench().f32
  const fileBytes = readdirSync(model).filter((f) => f.endsWith('.safetensors')).reduce((n, f) => n + statSync(join(model, f)).size, 0)
  const load0 = loadAtStart()
  const runs = []
  for (let rep = 0; rep < a.repeat; rep++) {
    for (const mode of a.modes) {
      for (const cache of ['cold', 'warm']) {
        if (cache === 'cold') evict(model)
        else await warmPageCache(model)
        await waitIdleThenSay(a, rep, `${mode}, ${cache} page cache`)
        runs.push({ cache, rep, ...runChild(self, { model, mode, threads: a.threads }, `${mode} ${cache}`) })
      }
    }
  }
  const load1 = loadAtStart()
  const best = (mode, cache, k, f) => f(...runs.filter((r) => r.mode === mode && r.cache === cache).map((r) => r[k]))
  console.log(`\n## Load: Qwen3-0.6B-shaped f32 safetensors (${fmt(fileBytes / 2 ** 30, 2)} GiB), ${machineName()}, ${a.threads} threads, best of ${a.repeat}\n`)
  console.log('| weights | runs as | weightBytes | load cold | load warm | RSS after load | peak RSS (run) | peak / file | prefill tok/s | decode tok/s |')
  console.log('|---|---|---|---|---|---|---|---|---|---|')
  const rows = a.modes.map((mode) => {
    const r = runs.find((x) => x.mode === mode)
    const row = {
      mode,
      quantization: r.quantization,
      weightBytes: r.weightBytes,
      loadColdMs: best(mode, 'cold', 'loadMs', Math.min),
      loadWarmMs: best(mode, 'warm', 'loadMs', Math.min),
      loadRssMB: best(mode, 'warm', 'loadRssMB', Math.min),
      peakRssMB: best(mode, 'warm', 'peakRssMB', Math.min),
      prefillTokS: best(mode, 'warm', 'prefillTokS', Math.max),
      decodeTokS: best(mode, 'warm', 'decodeTokS', Math.max),
    }
    console.log(`| ${mode} | ${row.quantization} | ${fmt(row.weightBytes / 2 ** 30, 3)} GiB | ${fmt(row.loadColdMs, 0)} ms | ${fmt(row.loadWarmMs, 0)} ms | ` +
      `${fmt(row.loadRssMB, 0)} MB | ${fmt(row.peakRssMB, 0)} MB | ${fmt((row.peakRssMB * MB) / fileBytes, 2)}× | ${fmt(row.prefillTokS)} | ${fmt(row.decodeTokS, 2)} |`)
    return row
  })
  console.log(`\n${loadSummary(load0, load1)}`)
  writeResults(a.out ?? resultsPath(cacheDir, 'load'), { ...runInfo(a), machine: machineInfo(load0, load1), fileBytes, rows, runs })
}

await benchMain(args, parent, child)
