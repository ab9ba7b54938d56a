// llama.cpp's greedy decode of given token ids on a GGUF file, through node-llama-cpp on the CPU:
// prints {"engine", "tokens", "logprobs"} as JSON. Fixture generators call it to check that a GGUF
// they wrote runs in llama.cpp as in HF (scripts/gen_gemma3_gguf_fixture.py).
//   node scripts/llamacpp_greedy.mjs MODEL.gguf '[400, 12, 13]' 16
import { createRequire } from 'node:module'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const [modelPath, idsJson, nText] = process.argv.slice(2)
const ids = JSON.parse(idsJson ?? 'null')
const n = Number(nText)
if (!modelPath || !Array.isArray(ids) || !Number.isInteger(n) || n < 1) {
  console.error('usage: node scripts/llamacpp_greedy.mjs MODEL.gguf \'[ids]\' N')
  process.exit(2)
}
const root = fileURLToPath(new URL('..', import.meta.url))
const require = createRequire(join(root, 'package.json'))
const { getLlama } = await import(require.resolve('node-llama-cpp'))
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error', maxThreads: 1 })
const model = await llama.loadModel({ modelPath })
const ctx = await model.createContext({ contextSize: Math.max(64, ids.length + n), batchSize: 64, threads: { ideal: 1, min: 1 } })
const seq = ctx.getSequence()
const tokens = []
const logprobs = []
const options = { temperature: 0, yieldEogToken: true }
for await (const out of seq.evaluateWithMetadata(ids, { confidence: true }, options)) {
  tokens.push(out.token)
  logprobs.push(Math.log(out.confidence))
  if (tokens.length >= n) break
}
const version = JSON.parse(readFileSync(join(root, 'node_modules/node-llama-cpp/package.json'), 'utf8')).version
console.log(JSON.stringify({ engine: `node-llama-cpp ${version}, CPU, 1 thread`, tokens, logprobs }))
seq.dispose()
await ctx.dispose()
await model.dispose()
