// The child of kv-disk-faults.test.mjs: generates a 70-token prompt's answer with the prefix
// cache's disk tier in <dir>, announcing its first token on stdout, until it is killed.
// Run: node kv-disk-faults-child.mjs <dir>.
import { createRequire } from 'node:module'
import { fixture, GREEDY } from './helpers.mjs'

const { Runtime } = createRequire(import.meta.url)('../dist/index.js')
const ids = (seed, n) => Array.from({ length: n }, (_, i) => 5 + ((seed * 31 + i * 17) % 90))
const rt = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: { dir: process.argv[2], maxBytes: 1 << 30 } } })
const stream = rt.createSession().generate({ tokens: ids(1, 70) }, { ...GREEDY, maxTokens: 200 })
for await (const _ of stream) process.stdout.write('first token\n')
