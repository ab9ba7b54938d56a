// Platform smoke check, run by scripts/cross/build.sh under emulation (qemu-aarch64, wine) and
// natively on linux-x64 for comparison: loads the package at argv[2] (its dist/index.js, which
// picks the `.node` through native.js exactly as an installed package would), runs the tiny
// fixture qwen3-tiny greedily for 16 tokens from the reference prompt ids (f32 safetensors and
// Q8_0 GGUF), and compares the tokens with __test__/fixtures/qwen3-tiny/reference.json (HF
// transformers: `f32` and `q8_0_dequant`).
//
//   node scripts/cross/check.mjs [packageDir=repo root] [fixtureDir=__test__/fixtures/qwen3-tiny]
//
// Prints one JSON line {platform, arch, binary, equal, ms, results: {f32, q8_0}: {tokens, equal,
// maxLogprobDiff}} and exits 0 when every run's tokens equal the reference, 1 otherwise.
import { createRequire } from 'node:module'
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const here = path.dirname(fileURLToPath(import.meta.url))
const repo = path.resolve(here, '..', '..')
const pkgDir = path.resolve(process.argv[2] ?? repo)
const fixtureDir = path.resolve(process.argv[3] ?? path.join(repo, '__test__', 'fixtures', 'qwen3-tiny'))

const ref = JSON.parse(readFileSync(path.join(fixtureDir, 'reference.json'), 'utf8'))
// Two runs: f32 safetensors (the f32 / AVX2-or-scalar matmul path) against reference.f32, and
// Q8_0 GGUF (the q8 kernels) against reference.q8_0_dequant (tokens only, as in generate.test.mjs).
const CASES = [
  { name: 'f32', file: '', steps: ref.f32.steps },
  { name: 'q8_0', file: 'model-q8_0.gguf', steps: ref.q8_0_dequant.steps },
]

const require = createRequire(path.join(pkgDir, 'package.json'))
const t0 = Date.now()
let out
try {
  const { Runtime } = require(path.join(pkgDir, 'dist', 'index.js'))
  const results = {}
  for (const c of CASES) {
    const expected = c.steps.map((s) => s.token)
    const rt = await Runtime.load(path.join(fixtureDir, c.file), { device: 'cpu' })
    const stream = rt.createSession().generate({ tokens: ref.prompt_ids }, { temperature: 0, maxTokens: expected.length })
    const chunks = []
    for await (const ch of stream) chunks.push(ch)
    await rt.dispose()
    const tokens = chunks.map((ch) => ch.tokenId)
    const maxLogprobDiff = Math.max(...chunks.map((ch, i) => Math.abs(ch.logprob - (c.steps[i]?.logprob ?? NaN))))
    results[c.name] = { tokens, equal: JSON.stringify(tokens) === JSON.stringify(expected), maxLogprobDiff: Number(maxLogprobDiff.toPrecision(3)) }
  }
  // Which .node file native.js actually loaded.
  const binary = Object.keys(require.cache).find((k) => k.endsWith('.node')) ?? null
  const equal = Object.values(results).every((r) => r.equal)
  out = { platform: process.platform, arch: process.arch, binary: binary && path.basename(binary), equal, ms: Date.now() - t0, results }
} catch (e) {
  out = { platform: process.platform, arch: process.arch, error: String(e?.stack ?? e), equal: false, ms: Date.now() - t0 }
}
console.log(JSON.stringify(out))
process.exit(out.equal ? 0 : 1)
