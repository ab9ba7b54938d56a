// `node benches/decode-at.mjs <model> [promptTokens=512] [kvDtype=f32] [decodeTokens=65]`: decode
// speed of one session after a prompt of the given length, with the KV pool in the given dtype
// (how much a decode step's attention costs at that position, and what the pool type changes).
// One warm-up request, then greedy decoding (an end-of-sequence token ends it early; the line
// says over how many tokens); prints one line. No peer: it is a probe for where the time goes
// (BENCHMARKS.md, CPU), not a comparison; run it on an idle machine.
import { Runtime } from '../dist/index.js'

const [model, promptLen = '512', kv = 'f32', decode = '65'] = process.argv.slice(2)
if (!model) {
  console.error('usage: node benches/decode-at.mjs <model> [promptTokens] [f32|f16|bf16|q8_0|q4_0] [decodeTokens]')
  process.exit(2)
}
const ids = (n, salt) => Array.from({ length: n }, (_, i) => 1000 + ((i * 7919 + salt) % 29000))
const rt = await Runtime.load(model, { device: 'cpu', contextLength: 4096, kvCache: { dtype: kv } })
for await (const _ of rt.createSession().generate({ tokens: ids(64, 5) }, { temperature: 0, maxTokens: 4 })) {
  // warm-up
}
let n = 0
let first = 0
for await (const _ of rt.createSession().generate({ tokens: ids(Number(promptLen), 1) }, { temperature: 0, maxTokens: Number(decode) })) {
  if (n++ === 0) first = performance.now()
}
const s = (performance.now() - first) / 1000
console.log(`prompt ${promptLen} kv ${kv}: decode ${((n - 1) / s).toFixed(1)} tok/s over ${n - 1} tokens`)
await rt.dispose()
