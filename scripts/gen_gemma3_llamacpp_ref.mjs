// The llama.cpp reference for Gemma 3 270M (base) Q4_K_M (DESIGN's PyPI asset, scripts/assets.mjs):
// node-llama-cpp's greedy decode of completion prompts on the CPU, 2 threads, with the prompt ids
// and each step's top-5 logprobs: a short question, and the start of LICENSE (661 tokens, past the
// 512-position window of the sliding layers). Writes __test__/fixtures/gemma3-270m-llamacpp.json
// and gemma3-270m-llamacpp-long.json, which __test__/gemma3-270m.test.mjs holds our tokenizer and
// decoder to.
//   node scripts/gen_gemma3_llamacpp_ref.mjs
import { createRequire } from 'node:module'
import { readFileSync, writeFileSync } from 'node:fs'
import { basename, join } from 'node:path'
import { fileURLToPath } from 'node:url'
const root = fileURLToPath(new URL('..', import.meta.url))
const require = createRequire(join(root, 'package.json'))
const { getLlama } = await import(require.resolve('node-llama-cpp'))
const { ensureGemma3 } = await import(join(root, 'scripts', 'assets.mjs'))

const CASES = [
  { prompt: 'Question: What is the capital of France?\nAnswer:', n: 16, out: 'gemma3-270m-llamacpp.json' },
  { prompt: readFileSync(join(root, 'LICENSE'), 'utf8').slice(0, 3200), n: 24, out: 'gemma3-270m-llamacpp-long.json' },
]
const modelPath = await ensureGemma3()
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error', maxThreads: 2 })
const model = await llama.loadModel({ modelPath })
const ctx = await model.createContext({ contextSize: 2048, batchSize: 512, threads: { ideal: 2, min: 2 } })

const bosAdded = model.tokens.shouldPrependBosToken
async function run({ prompt: PROMPT, n: N, out }) {
  const seq = ctx.getSequence()
  const body = model.tokenize(PROMPT, false)
  const promptIds = bosAdded && body[0] !== model.tokens.bos ? [model.tokens.bos, ...body] : body

  const ids = []
  const steps = []
  for await (const out of seq.evaluateWithMetadata(promptIds, { confidence: true, probabilities: true }, { temperature: 0, yieldEogToken: true })) {
    const top = [...out.probabilities.entries()].sort((a, b) => b[1] - a[1]).slice(0, 5)
    ids.push(out.token)
    steps.push({
      token: out.token,
      piece: model.detokenize([out.token], true),
      prob: out.confidence,
      logprob: Math.log(out.confidence),
      top5: top.map(([t, p]) => ({ id: t, piece: model.detokenize([t], true), prob: p, logprob: Math.log(p) })),
    })
    if (ids.length >= N) break
}
const result = {
  model: basename(modelPath),
  engine: `node-llama-cpp ${JSON.parse(readFileSync(join(root, 'node_modules/node-llama-cpp/package.json'), 'utf8')).version}, CPU, threads=${ctx.currentThreads}`,
  prompt: PROMPT,
  addBos: bosAdded,
  promptIds,
  generatedIds: ids,
  generatedText: model.detokenize(ids),
  eogAt: ids.findIndex((t) => model.isEogToken(t)),
  note: 'probabilities: node-llama-cpp evaluateWithMetadata({probabilities}) at temperature 0 (softmax over the full vocab of the raw logits, as reported by node-llama-cpp)',
  steps,
}
writeFileSync(join(root, '__test__/fixtures', out), JSON.stringify(result, null, 2) + '\n')
console.log(JSON.stringify({ promptIds, generatedIds: ids, generatedText: result.generatedText, top1: steps.map((s) => [s.token, +s.logprob.toFixed(4)]) }))
seq.dispose()
}
for (const c of CASES) await run(c)
await ctx.dispose(); await model.dispose(); await llama.dispose()
