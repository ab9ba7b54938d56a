// Real-model check across platforms: loads the package at argv[2] (as check.mjs does), runs the
// GGUF model at argv[3] greedily for 24 tokens on one chat prompt, and prints one JSON line
// {arch, ms, text, tokens, logprobs}. Run it natively and under emulation with the same model
// and compare the lines (docs/platforms.md): our integer kernels give the same bits on every
// CPU path, so tokens and logprobs are expected to be identical, not just close.
//
//   node scripts/cross/real.mjs <packageDir> <model.gguf>
import { createRequire } from 'node:module'
import path from 'node:path'

const pkgDir = path.resolve(process.argv[2] ?? '.')
const model = process.argv[3]
if (!model) {
  console.error('usage: node scripts/cross/real.mjs <packageDir> <model.gguf>')
  process.exit(2)
}
const require = createRequire(path.join(pkgDir, 'package.json'))
const { Runtime } = require(path.join(pkgDir, 'dist', 'index.js'))
const t0 = Date.now()
const rt = await Runtime.load(model, { device: 'cpu' })
const chunks = []
for await (const ch of rt.createSession().generate('Write a Python function that adds two numbers.', { temperature: 0, maxTokens: 24 })) {
  chunks.push(ch)
}
await rt.dispose()
console.log(
  JSON.stringify({
    arch: process.arch,
    ms: Date.now() - t0,
    text: chunks.map((c) => c.text).join(''),
    tokens: chunks.map((c) => c.tokenId),
    logprobs: chunks.map((c) => c.logprob),
  }),
)
