// `npm run bench:python [-- --repeat N]`: decode speed through the Python binding against the
// Node binding, same engine, same model, same process layout (one fresh process per run,
// alternating Node and Python). Issue: the Python binding adds no per-token cost worth noticing.
//
// Model: SmolLM2-135M-Instruct Q4_1 GGUF. Each run: load, an 8-token warm-up request, then one
// session, a fixed 64-token prompt (seeded random ids), 129 greedy tokens. tok/s is measured
// on the consumer's side, from the arrival of the first chunk to that of the last (so it
// includes everything the binding does per token), and the engine's own `tokens_per_second`.
import { execFileSync } from 'node:child_process'
import { ensureSmolLM2 } from '../scripts/assets.mjs'
import { ensureBuilt, root } from '../scripts/setup.mjs'
import { ensurePython } from '../scripts/python.mjs'

const repeat = Number(process.argv[process.argv.indexOf('--repeat') + 1]) || 3
const PROMPT = Array.from({ length: 64 }, (_, i) => 1000 + ((i * 7919) % 29000))
const DECODE = 129

const NODE_CHILD = `
const { Runtime } = require(${JSON.stringify(root + '/dist/index.js')})
;(async () => {
  const rt = await Runtime.load(process.argv[1])
  await rt.createSession().complete({ tokens: [1, 2, 3] }, { maxTokens: 8, temperature: 0 })
  const s = rt.createSession()
  const stream = s.generate({ tokens: ${JSON.stringify(PROMPT)} }, { maxTokens: ${DECODE}, temperature: 0 })
  let first = 0, last = 0, n = 0
  for await (const c of stream) { last = performance.now(); if (n++ === 0) first = last }
  console.log(JSON.stringify({ consumer: (n - 1) / ((last - first) / 1000), engine: stream.result.timings.tokensPerSecond, n }))
  await rt.dispose()
})()`

const PY_CHILD = `
import json, sys, time
from expert_runtime import Runtime
with Runtime.load(sys.argv[1]) as rt:
    rt.create_session().complete({"tokens": [1, 2, 3]}, max_tokens=8, temperature=0)
    s = rt.create_session()
    stream = s.generate({"tokens": ${JSON.stringify(PROMPT)}}, max_tokens=${DECODE}, temperature=0)
    n = 0
    for c in stream:
        last = time.perf_counter()
        if n == 0:
            first = last
        n += 1
    print(json.dumps({"consumer": (n - 1) / (last - first), "engine": stream.result.timings.tokens_per_second, "n": n}))
`

ensureBuilt()
const python = ensurePython()
const model = ensureSmolLM2()
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]
const runs = { node: [], python: [] }
for (let i = 0; i < repeat; i++) {
  runs.node.push(JSON.parse(execFileSync(process.execPath, ['-e', NODE_CHILD, model], { encoding: 'utf8' })))
  runs.python.push(JSON.parse(execFileSync(python, ['-c', PY_CHILD, model], { encoding: 'utf8' })))
}
const row = (k) => ({ consumer: median(runs[k].map((r) => r.consumer)), engine: median(runs[k].map((r) => r.engine)) })
const node = row('node')
const py = row('python')
console.log(`SmolLM2 Q4_1, batch 1, ${DECODE} greedy tokens, median of ${repeat} fresh processes each`)
console.log(`  node   : ${node.consumer.toFixed(1)} tok/s at the consumer (engine ${node.engine.toFixed(1)})`)
console.log(`  python : ${py.consumer.toFixed(1)} tok/s at the consumer (engine ${py.engine.toFixed(1)})`)
console.log(`  python / node = ${(py.consumer / node.consumer).toFixed(3)} (consumer), ${(py.engine / node.engine).toFixed(3)} (engine)`)
console.log(`  runs: ${JSON.stringify(runs)}`)
