// The child of kv-disk-faults.test.mjs, with the prefix cache's disk tier in <dir>:
//   node kv-disk-faults-child.mjs <dir> kill          generates a 70-token prompt's answer,
//                                                     announcing its first token, until killed;
//   node kv-disk-faults-child.mjs <dir> share <seed>  answers 3 prompts (seeds seed..seed+2),
//                                                     maxBytes 8 block files, then exits.
import { createRequire } from 'node:module'
import { fixture, GREEDY } from './helpers.mjs'

const { Runtime } = createRequire(import.meta.url)('../dist/index.js')
const ids = (seed, n) => Array.from({ length: n }, (_, i) => 5 + ((seed * 31 + i * 17) % 90))
const [dir, mode, seed] = process.argv.slice(2)
if (mode === 'kill') {
  const rt = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: { dir, maxBytes: 1 << 30 } } })
  const stream = rt.createSession().generate({ tokens: ids(1, 70) }, { ...GREEDY, maxTokens: 200 })
  for await (const _ of stream) process.stdout.write('first token\n')
} else {
  const probe = await Runtime.load(fixture('llama-tiny'))
  const s = probe.stats()
  await probe.dispose()
  const fileBytes = s.kvBytesPerToken * s.kvBlockSize + 80
  const rt = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: { dir, maxBytes: fileBytes * 8 } } })
  for (let i = 0; i < 3; i++) await rt.createSession().complete({ tokens: ids(Number(seed) + i, 70) }, { ...GREEDY, maxTokens: 2 })
  process.stdout.write(JSON.stringify({ fileBytes, disk: rt.stats().kvDisk }) + '\n')
  await rt.dispose()
}
