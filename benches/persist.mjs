// `npm run bench:persist [-- --quick] [-- --tokens N] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`:
// what a saved session buys at the next start (issue 52).
//
// Models: SmolLM2-135M-Instruct Q4_1 GGUF and, unless --quick, the Qwen3-0.6B-shaped random
// model's Q8_0 GGUF (scripts/bench-model.mjs); the KV pool in its default format (f32 on CPU).
//
// Per model, each step in a fresh child process:
//   1. save: a session evaluates a history of N seeded random tokens (default 4096) as one raw
//      prompt, then `session.save(file)`: save ms and the file's size.
//   2. restore: a fresh runtime, `rt.restoreSession(file)` (restore ms), then the next turn (16
//      more tokens, one token out): its time to first token. "resume" = restore + that TTFT.
//   3. re-prefill: a fresh runtime, a session given as many tokens as one prompt (the history,
//      one token for the one the saved session generated, the 16), one token out: the time to
//      first token an app pays without a saved session.
// The ratio is re-prefill TTFT / resume; the target is ≥ 10×.
// Then the prefix cache's disk tier (kvCache.disk), each step in a fresh child process:
//   4. disk-fill: a chat with a ~2k-token system prompt, with an empty disk tier; its blocks are
//      written as they fill (the load's extra cost, fingerprinting the model, is reported).
//   5. disk-warm: a fresh runtime, the same tier: the first chat's time to first token.
//   6. disk-cold: a fresh runtime without one: the same chat's time to first token.
//
// Results: a table on stdout, JSON under <cacheDir>/bench-results/persist-<date>.json.
import { createRequire } from 'node:module'
import { mkdtempSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  assertBuilt, benchMain, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, parseBenchArgs, randomTokens, resultsPath,
  root, runChild, runInfo, waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)
const self = fileURLToPath(import.meta.url)
const NEXT = 16
const TOKEN_RANGE = [1000, 30000]

const args = parseBenchArgs(process.argv.slice(2), {
  usage: 'node benches/persist.mjs [--quick] [--tokens N] [--threads N] [--repeat N] [--wait-idle S] [--out FILE]',
  defaults: { tokens: 4096 },
  extra: (k, next, a) => {
    if (k !== '--tokens') return false
    a.tokens = Number(next())
    if (!Number.isInteger(a.tokens) || a.tokens < 64) throw new Error('--tokens: an integer of at least 64')
    return true
  },
})

/** A system prompt of about 2k tokens: seeded words. */
function systemPrompt() {
  const words = ['the', 'model', 'answers', 'questions', 'about', 'invoices', 'customers', 'orders', 'and', 'refunds',
    'politely', 'with', 'short', 'sentences', 'never', 'guessing', 'numbers', 'it', 'cannot', 'see', 'in', 'context']
  const ids = randomTokens(3, 1700, [0, words.length])
  return `You are a support assistant. ${ids.map((i) => words[i]).join(' ')}.`
}

async function diskChild({ step, model, dir, threads }) {
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const t0 = performance.now()
  const kvCache = step === 'disk-cold' ? {} : { disk: { dir, maxBytes: 2 ** 30 } }
  const rt = await Runtime.load(model, { threads, contextLength: 4096, kvCache })
  const out = { loadMs: performance.now() - t0 }
  const s = rt.createSession({ system: systemPrompt() })
  const t1 = performance.now()
  const stream = s.generate('Hello', { temperature: 0, maxTokens: 1 })
  for await (const _ of stream) out.ttftMs ??= performance.now() - t1
  out.promptTokens = stream.result.usage.promptTokens
  out.cachedTokens = stream.result.usage.cachedTokens
  out.disk = rt.stats().kvDisk
  await rt.dispose()
  return out
}

async function child(spec) {
  if (spec.step.startsWith('disk-')) return diskChild(spec)
  const { step, model, file, tokens, threads } = spec
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const rt = await Runtime.load(model, { threads, contextLength: tokens + 256 })
  const history = randomTokens(1, tokens, TOKEN_RANGE)
  const next = randomTokens(2, NEXT, TOKEN_RANGE)
  /** Time to the first token of a one-token answer to `input`. */
  const firstToken = async (s, input) => {
    const t0 = performance.now()
    for await (const _ of s.generate(input, { temperature: 0, maxTokens: 1 })) break
    return performance.now() - t0
  }
  const out = {}
  if (step === 'save') {
    const s = rt.createSession()
    out.prefillMs = await firstToken(s, { tokens: history })
    const t0 = performance.now()
    await s.save(file)
    out.saveMs = performance.now() - t0
    out.fileBytes = statSync(file).size
  } else if (step === 'restore') {
    const t0 = performance.now()
    const s = await rt.restoreSession(file)
    out.restoreMs = performance.now() - t0
    const t1 = performance.now()
    const stream = s.generate({ tokens: next }, { temperature: 0, maxTokens: 1 })
    for await (const _ of stream) out.ttftMs ??= performance.now() - t1
    out.cachedTokens = stream.result.usage.cachedTokens
  } else {
    const s = rt.createSession()
    out.ttftMs = await firstToken(s, { tokens: [...history, 0, ...next] })
  }
  await rt.dispose()
  return out
}

async function parent() {
  assertBuilt()
  const load0 = loadAtStart()
  const { cacheDir, ensureSmolLM2 } = await import(join(root, 'scripts', 'assets.mjs'))
  const models = [{ key: 'smollm2', label: 'SmolLM2-135M Q4_1', path: ensureSmolLM2() }]
  if (!args.quick) {
    const { ensureQwen3Bench } = await import(join(root, 'scripts', 'bench-model.mjs'))
    models.push({ key: 'qwen3', label: 'Qwen3-0.6B-shape Q8_0', path: ensureQwen3Bench().q8_0 })
  }
  const dir = mkdtempSync(join(tmpdir(), 'er-bench-persist-'))
  const results = { ...runInfo(args), tokens: args.tokens, models: {} }
  try {
    for (const m of models) {
      await warmPageCache(m.path)
      const runs = []
      for (let rep = 0; rep < args.repeat; rep++) {
        const spec = (step) => ({ step, model: m.path, file: join(dir, `${m.key}.session`), tokens: args.tokens, threads: args.threads })
        const run = {}
        for (const step of ['save', 'restore', 'prefill']) {
          await waitIdleThenSay(args, rep, `${m.key} ${step}`)
          run[step] = runChild(self, spec(step), `${step} ${m.key}`)
        }
        const tier = join(dir, `${m.key}-tier-${rep}`)
        for (const step of ['disk-fill', 'disk-warm', 'disk-cold']) {
          await waitIdleThenSay(args, rep, `${m.key} ${step}`)
          run[step] = runChild(self, { step, model: m.path, dir: tier, threads: args.threads }, `${step} ${m.key}`)
        }
        runs.push(run)
      }
      results.models[m.key] = { label: m.label, runs }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  results.machine = machineInfo(load0, loadAtStart())
  const best = (runs, f) => Math.min(...runs.map(f))
  console.log(`\nexpert-runtime ${gitRev() ?? ''}, ${machineName()}, ${args.threads} threads, ${args.tokens}-token history, best of ${args.repeat}`)
  console.log('model                  | file MB | save ms | restore ms | TTFT after restore | resume ms | re-prefill TTFT ms | re-prefill / resume')
  for (const m of models) {
    const { runs } = results.models[m.key]
    const resume = best(runs, (r) => r.restore.restoreMs + r.restore.ttftMs)
    const prefill = best(runs, (r) => r.prefill.ttftMs)
    const cells = [
      m.label.padEnd(22),
      fmt(runs[0].save.fileBytes / 2 ** 20, 1).padStart(7),
      fmt(best(runs, (r) => r.save.saveMs)).padStart(7),
      fmt(best(runs, (r) => r.restore.restoreMs)).padStart(10),
      fmt(best(runs, (r) => r.restore.ttftMs)).padStart(18),
      fmt(resume).padStart(9),
      fmt(prefill).padStart(18),
      `${fmt(prefill / resume, 1)}x (cached ${runs[0].restore.cachedTokens})`,
    ]
    console.log(cells.join(' | '))
  }
  console.log('\nA fresh process\'s first chat with a ~2k-token system prompt: the disk tier warm (written by an earlier process) against none')
  console.log('model                  | prompt | from disk | load ms, tier / none | TTFT warm tier ms | TTFT no tier ms | no tier / warm')
  for (const m of models) {
    const { runs } = results.models[m.key]
    const warm = best(runs, (r) => r['disk-warm'].ttftMs)
    const cold = best(runs, (r) => r['disk-cold'].ttftMs)
    const cells = [
      m.label.padEnd(22),
      String(runs[0]['disk-warm'].promptTokens).padStart(6),
      String(runs[0]['disk-warm'].cachedTokens).padStart(9),
      `${fmt(best(runs, (r) => r['disk-warm'].loadMs))} / ${fmt(best(runs, (r) => r['disk-cold'].loadMs))}`.padStart(20),
      fmt(warm).padStart(17),
      fmt(cold).padStart(15),
      `${fmt(cold / warm, 1)}x`,
    ]
    console.log(cells.join(' | '))
  }
  console.log(loadSummary(load0, loadAtStart()))
  writeResults(args.out ?? resultsPath(cacheDir, 'persist'), results)
}

await benchMain(args, parent, child)
