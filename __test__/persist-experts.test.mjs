// Sessions saved under experts (issue 52): the file names each expert and its fingerprint (a
// SHA-256 over the adapter's files and scale); restored in a fresh runtime that loaded the
// same adapters under the same names, the next turn equals the uninterrupted one bit for bit,
// for a LoRA on llama and prompt tuning (virtual positions) on qwen3. Another adapter under
// the name, another scale, or a missing expert are refused with a code naming it.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fixture, GREEDY } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const ids = (seed, n) => Array.from({ length: n }, (_, i) => 5 + ((seed * 31 + i * 17) % 90))

let dir
before(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'er-persist-experts-'))
})
after(() => rmSync(dir, { recursive: true, force: true }))

async function turn(session, tokens) {
  const stream = session.generate({ tokens }, { ...GREEDY, maxTokens: 6 })
  const out = []
  for await (const c of stream) out.push([c.tokenId, c.logprob])
  return { tokens: out, usage: stream.result.usage }
}

const rejects = async (p, code, re) => {
  await assert.rejects(p, (e) => {
    assert.equal(e.code, code, e.message)
    if (re) assert.match(e.message, re)
    return true
  })
}

for (const [model, adapter, other] of [['llama-tiny', 'lora_llama', 'dora_llama'], ['qwen3-tiny', 'prompt', 'lora']]) {
  describe(`save and restore under an expert: ${model} + ${adapter}`, () => {
    const file = () => path.join(dir, `${model}.session`)
    const load = async (experts) => {
      const rt = await Runtime.load(fixture(model))
      for (const [name, a, options] of experts) await rt.loadExpert(fixture('adapters', a), { name, ...options })
      return rt
    }
    let want

    it('the next turn after a restore equals the uninterrupted one, bit for bit', async () => {
      const rt = await load([['x', adapter]])
      try {
        const s = rt.createSession({ experts: ['x'] })
        await turn(s, ids(1, 40))
        await turn(s, ids(2, 9))
        await s.save(file())
        want = await turn(s, ids(3, 7))
      } finally {
        await rt.dispose()
      }
      const fresh = await load([['x', adapter]])
      try {
        const r = await fresh.restoreSession(file())
        assert.deepEqual(r.experts, ['x'])
        const got = await turn(r, ids(3, 7))
        assert.deepEqual(got.tokens, want.tokens)
        assert.ok(got.usage.cachedTokens >= 55, `cached ${got.usage.cachedTokens}`)
      } finally {
        await fresh.dispose()
      }
    })

    it('another adapter or scale under the name, or none, is refused', async () => {
      for (const [experts, code, re] of [
        [[], 'EXPERT_NOT_FOUND', /no expert named 'x'/],
        [[['x', other]], 'INVALID_ARGUMENT', /another adapter/],
        [[['x', adapter, { scale: 0.5 }]], 'INVALID_ARGUMENT', /another adapter/],
      ]) {
        if (adapter === 'prompt' && experts[0]?.[2]) continue // prompt tuning takes no scale
        const rt = await load(experts)
        try {
          await rejects(rt.restoreSession(file()), code, re)
        } finally {
          await rt.dispose()
        }
      }
    })
  })
}

it('a session whose expert was unloaded since its last turn cannot be saved', async () => {
  const rt = await Runtime.load(fixture('llama-tiny'))
  try {
    const e = await rt.loadExpert(fixture('adapters', 'lora_llama'), { name: 'x' })
    const s = rt.createSession({ experts: ['x'] })
    await turn(s, ids(1, 20))
    await e.unload()
    await rejects(s.save(path.join(dir, 'unloaded.session')), 'INVALID_ARGUMENT', /unloaded/)
  } finally {
    await rt.dispose()
  }
})
