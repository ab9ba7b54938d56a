// `npm run demo [-- "your question"]`: streams a chat answer from SmolLM2-135M-Instruct.
import { createRequire } from 'node:module'
import { ensureSmolLM2 } from './assets.mjs'
import { ensureBuilt, root } from './setup.mjs'

ensureBuilt()
const modelPath = ensureSmolLM2()
const { Runtime } = createRequire(import.meta.url)(`${root}/dist/index.js`)

const question = process.argv.slice(2).join(' ').trim() || 'What is the capital of France? Answer in one sentence.'
const rt = await Runtime.load(modelPath)
const chat = rt.createSession({ system: 'You are a helpful assistant.' })
const ac = new AbortController()
process.once('SIGINT', () => ac.abort())

console.log(`> ${question}\n`)
const stream = chat.generate(question, { temperature: 0, maxTokens: 256, signal: ac.signal })
for await (const t of stream) process.stdout.write(t.text)
const r = stream.result
console.log(`\n\n[${r.usage.completionTokens} tokens, ${r.timings.tokensPerSecond.toFixed(1)} tok/s, first token after ${r.timings.ttftMs.toFixed(0)} ms, ${rt.info.architecture} on ${rt.info.device}]`)
await rt.dispose()
