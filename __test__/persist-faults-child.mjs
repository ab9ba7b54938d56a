// The child of persist-faults.test.mjs: a session taking turn after turn, saving after each to
// the same file and announcing each save on stdout, until it is killed. Run:
// node persist-faults-child.mjs <file>. Also exports the turns both sides replay.
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { fixture, GREEDY } from './helpers.mjs'

const ids = (seed, n) => Array.from({ length: n }, (_, i) => 5 + ((seed * 31 + i * 17) % 90))
/** The input of turn `i`. */
export const input = (i) => ({ tokens: ids(i + 1, i === 0 ? 40 : 9) })

/** Greedy tokens and logprobs of one turn. */
export async function turn(session, inp) {
  const stream = session.generate(inp, { ...GREEDY, maxTokens: 5 })
  const tokens = []
  for await (const c of stream) tokens.push([c.tokenId, c.logprob])
  return { tokens, usage: stream.result.usage }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { Runtime } = createRequire(import.meta.url)('../dist/index.js')
  const file = process.argv[2]
  const rt = await Runtime.load(fixture('llama-tiny'), { kvCache: { prefixCache: false } })
  const s = rt.createSession()
  for (let i = 0; ; i++) {
    await turn(s, input(i))
    process.stdout.write(`saving ${i + 1}\n`)
    await s.save(file)
    process.stdout.write(`saved ${i + 1}\n`)
  }
}
