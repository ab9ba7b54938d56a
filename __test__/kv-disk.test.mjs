// The prefix cache's disk tier (issue 52, part 2): a runtime started later on the same model
// finds a prompt's blocks on disk and answers exactly as a runtime that found them in RAM, bit
// for bit; damaged files are skipped and the answer is the cold one; another model sharing the
// directory finds nothing of the first; the directory stays within maxBytes; bad options and
// models it cannot serve are refused with a code.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fixture, GREEDY } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const ids = (seed, n) => Array.from({ length: n }, (_, i) => 5 + ((seed * 31 + i * 17) % 90))
// 70 tokens: 4 full blocks of 16 before the last token (which is always evaluated).
const PROMPT = { tokens: ids(1, 70) }

let root
before(() => {
  root = mkdtempSync(path.join(tmpdir(), 'er-kv-disk-'))
})
after(() => rmSync(root, { recursive: true, force: true }))

async function turn(rt, input = PROMPT) {
  const stream = rt.createSession().generate(input, { ...GREEDY, maxTokens: 6 })
  const tokens = []
  for await (const c of stream) tokens.push([c.tokenId, c.logprob])
  return { tokens, cached: stream.result.usage.cachedTokens }
}

/** Waits (bounded) until the writer has written `n` blocks. */
async function written(rt, n) {
  for (let i = 0; i < 1000 && rt.stats().kvDisk.writtenBlocks < n; i++) await new Promise((r) => setTimeout(r, 10))
  assert.ok(rt.stats().kvDisk.writtenBlocks >= n, `written ${rt.stats().kvDisk.writtenBlocks} of ${n}`)
}

function blockFiles(dir) {
  return readdirSync(dir, { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .flatMap((d) => readdirSync(path.join(dir, d.name)).filter((f) => f.endsWith('.kvb')).map((f) => path.join(dir, d.name, f)))
}

const rejects = async (p, code, re) => {
  await assert.rejects(p, (e) => {
    assert.equal(e.code, code, e.message)
    if (re) assert.match(e.message, re)
    return true
  })
}

describe('kvCache.disk', () => {
  const disk = () => ({ dir: path.join(root, 'tier'), maxBytes: 64 << 20 })
  let cold
  let warm

  it('a later runtime reads the blocks back and answers as a RAM hit does, bit for bit', async () => {
    const a = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: disk() } })
    try {
      cold = await turn(a)
      assert.equal(cold.cached, 0)
      warm = await turn(a)
      assert.equal(warm.cached, 64, 'the second session shares the first one\'s blocks in RAM')
      await written(a, 4)
      assert.deepEqual(a.stats().kvDisk, { ...a.stats().kvDisk, droppedBlocks: 0, failedBlocks: 0, readBlocks: 0, rejectedBlocks: 0 })
    } finally {
      await a.dispose()
    }
    assert.equal(blockFiles(disk().dir).length, 4)
    const b = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: disk() } })
    try {
      const got = await turn(b)
      assert.equal(got.cached, 64, 'the prompt\'s full blocks come from disk')
      assert.deepEqual(got.tokens, warm.tokens)
      assert.equal(b.stats().kvDisk.readBlocks, 4)
      assert.equal(b.stats().prefixCacheHitTokens, 64)
      // Nothing is written again: the files are there.
      assert.equal(b.stats().kvDisk.writtenBlocks, 0)
    } finally {
      await b.dispose()
    }
  })

  it('damaged files are skipped, removed and recomputed: the answer is the cold one', async () => {
    const files = blockFiles(disk().dir)
    assert.equal(files.length, 4)
    for (const f of files) {
      const bytes = readFileSync(f)
      bytes[bytes.length >> 1] ^= 0x10
      writeFileSync(f, bytes)
    }
    const c = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: disk() } })
    try {
      const got = await turn(c)
      assert.equal(got.cached, 0)
      assert.deepEqual(got.tokens, cold.tokens)
      const s = c.stats().kvDisk
      assert.equal(s.readBlocks, 0)
      assert.equal(s.rejectedBlocks, 1, 'the chain stops at its first block')
      await written(c, 4)
    } finally {
      await c.dispose()
    }
    // Rewritten whole.
    const d = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: disk() } })
    try {
      assert.equal((await turn(d)).cached, 64)
    } finally {
      await d.dispose()
    }
  })

  it('blocks computed under an expert come back under the same adapter files only', async () => {
    const dir = path.join(root, 'experts')
    const adapters = fixture('adapters')
    const open = async () => Runtime.load(fixture('llama-tiny'), { kvCache: { disk: { dir, maxBytes: 64 << 20 } } })
    const under = async (rt, expert) => {
      const stream = rt.createSession().generate(PROMPT, { ...GREEDY, maxTokens: 6, experts: [expert] })
      const tokens = []
      for await (const c of stream) tokens.push([c.tokenId, c.logprob])
      return { tokens, cached: stream.result.usage.cachedTokens }
    }
    let ramHit
    const a = await open()
    try {
      await a.loadExpert(path.join(adapters, 'lora_llama'), { name: 'x' })
      assert.equal((await under(a, 'x')).cached, 0)
      ramHit = await under(a, 'x')
      assert.equal(ramHit.cached, 64)
      await written(a, 4)
    } finally {
      await a.dispose()
    }
    const b = await open()
    try {
      // The same files under another name: the same blocks.
      await b.loadExpert(path.join(adapters, 'lora_llama'), { name: 'y' })
      const got = await under(b, 'y')
      assert.equal(got.cached, 64)
      assert.deepEqual(got.tokens, ramHit.tokens)
      // Another scale, another adapter, or none: nothing of those blocks.
      await b.loadExpert(path.join(adapters, 'lora_llama'), { name: 'z', scale: 0.5 })
      assert.equal((await under(b, 'z')).cached, 0)
      await b.loadExpert(path.join(adapters, 'dora_llama'), { name: 'd' })
      assert.equal((await under(b, 'd')).cached, 0)
      assert.equal((await turn(b)).cached, 0)
      assert.equal(b.stats().kvDisk.readBlocks, 4)
    } finally {
      await b.dispose()
    }
  })

  it('the model\'s fingerprint is remembered; changed weights under the same name find nothing', async () => {
    const remembered = readdirSync(disk().dir).filter((f) => f.startsWith('.fingerprint-'))
    assert.equal(remembered.length, 1, remembered.join(', '))
    // A remembered value that is not a fingerprint is computed again: the blocks are still found.
    writeFileSync(path.join(disk().dir, remembered[0]), 'not a fingerprint')
    const a = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: disk() } })
    try {
      assert.equal((await turn(a)).cached, 64)
    } finally {
      await a.dispose()
    }
    assert.match(readFileSync(path.join(disk().dir, remembered[0]), 'utf8'), /^sha256:[0-9a-f]{64}$/)
    // The same model files, one weight changed: another fingerprint, nothing found.
    const copy = path.join(root, 'llama-copy')
    cpSync(fixture('llama-tiny'), copy, { recursive: true })
    const weights = path.join(copy, 'model.safetensors')
    const bytes = readFileSync(weights)
    bytes[bytes.length - 3] ^= 0x01
    writeFileSync(weights, bytes)
    const b = await Runtime.load(copy, { kvCache: { disk: disk() } })
    try {
      const got = await turn(b)
      assert.equal(got.cached, 0)
      assert.equal(b.stats().kvDisk.rejectedBlocks, 0, 'not rejected: never even looked up under this model')
    } finally {
      await b.dispose()
    }
  })

  it('another model sharing the directory finds nothing of the first', async () => {
    const q = await Runtime.load(fixture('qwen3-tiny'), { kvCache: { disk: disk() } })
    try {
      const got = await turn(q)
      assert.equal(got.cached, 0)
      assert.equal(q.stats().kvDisk.readBlocks, 0)
      assert.equal(q.stats().kvDisk.rejectedBlocks, 0)
      await written(q, 4)
    } finally {
      await q.dispose()
    }
    assert.equal(blockFiles(disk().dir).length, 12, 'the changed llama\'s 4, qwen3\'s 4, the first 4')
  })

  it('the directory stays within maxBytes, least recently used first', async () => {
    const dir = path.join(root, 'small')
    // Room for 6 block files: 3 prompts of 4 blocks each overflow it.
    const probe = await Runtime.load(fixture('llama-tiny'), { kvCache: { maxTokens: 4096 } })
    const s = probe.stats()
    await probe.dispose()
    const fileBytes = s.kvBytesPerToken * s.kvBlockSize + 80
    const rt = await Runtime.load(fixture('llama-tiny'), { kvCache: { disk: { dir, maxBytes: fileBytes * 6 } } })
    try {
      for (const seed of [2, 3, 4]) {
        await turn(rt, { tokens: ids(seed, 70) })
        await written(rt, (seed - 1) * 4)
      }
      const total = blockFiles(dir).reduce((n, f) => n + statSync(f).size, 0)
      assert.ok(total <= fileBytes * 6, `${total} bytes of files`)
      assert.ok(rt.stats().kvDisk.evictedBlocks >= 6)
      assert.equal(rt.stats().kvDisk.bytes, total)
    } finally {
      await rt.dispose()
    }
  })

  it('refuses bad options and models whose blocks it cannot keep, with a code', async () => {
    const load = (model, d) => Runtime.load(fixture(model), { kvCache: { disk: d } })
    const dir = path.join(root, 'opts')
    for (const bad of [null, 'dir', [], { dir }, { maxBytes: 1 << 20 }, { dir: '', maxBytes: 1 << 20 }, { dir, maxBytes: -1 },
      { dir, maxBytes: 1.5 }, { dir, maxBytes: Number.NaN }, { dir, maxBytes: 2 ** 60 }, { dir: 'a\0b', maxBytes: 1 << 20 },
      { dir, maxBytes: 1 << 20, extra: true }]) {
      await rejects(load('llama-tiny', bad), 'INVALID_ARGUMENT')
    }
    await rejects(load('llama-tiny', { dir, maxBytes: 10 }), 'INVALID_ARGUMENT', /smaller than one block/)
    const file = path.join(root, 'a-file')
    writeFileSync(file, 'x')
    await assert.rejects(load('llama-tiny', { dir: file, maxBytes: 1 << 20 }), (e) => ['IO_ERROR', 'INVALID_ARGUMENT'].includes(e.code))
    await rejects(load('gemma3-tiny', { dir, maxBytes: 1 << 20 }), 'INVALID_ARGUMENT', /sliding window|several shapes/)
    await rejects(load('qwen35-tiny', { dir, maxBytes: 1 << 20 }), 'INVALID_ARGUMENT', /recurrent/)
    await rejects(Runtime.load(fixture('llama-tiny'), { kvCache: { prefixCache: false, disk: { dir, maxBytes: 1 << 20 } } }), 'INVALID_ARGUMENT', /prefix/)
    // Without a disk tier the stats say so.
    const rt = await Runtime.load(fixture('llama-tiny'))
    assert.equal(rt.stats().kvDisk, null)
    await rt.dispose()
  })
})
