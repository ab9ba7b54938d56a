// The prefix cache's disk tier under faults (issue 52): a full disk and a read-only directory
// (tmpfs mounts, which need root: skipped elsewhere, saying so), a process killed while it
// writes, and two processes sharing the directory. Writes that fail are counted and generation goes on unchanged; what a later runtime
// reads is only ever whole files; nothing crashes.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { mountTmpfs as mountTmpfsIn, umount, fixture, GREEDY } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const MODEL = fixture('llama-tiny')
const ids = (seed, n) => Array.from({ length: n }, (_, i) => 5 + ((seed * 31 + i * 17) % 90))
const PROMPT = { tokens: ids(1, 70) }
/** Generates under a tier, says so at its first token, and is killed (./kv-disk-faults-child.mjs). */
const CHILD = fileURLToPath(new URL('./kv-disk-faults-child.mjs', import.meta.url))

async function turn(rt, input = PROMPT) {
  const stream = rt.createSession().generate(input, { ...GREEDY, maxTokens: 6 })
  const tokens = []
  for await (const c of stream) tokens.push([c.tokenId, c.logprob])
  return { tokens, cached: stream.result.usage.cachedTokens }
}

const withTier = (dir) => Runtime.load(MODEL, { kvCache: { disk: { dir, maxBytes: 1 << 30 } } })

/** Every file under `dir`, relative. */
const files = (dir) => readdirSync(dir, { recursive: true, withFileTypes: true }).filter((d) => d.isFile()).map((d) => d.name)

let dir
let cold
before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'er-kv-disk-faults-'))
  const rt = await Runtime.load(MODEL)
  cold = await turn(rt)
  await rt.dispose()
})
after(() => rmSync(dir, { recursive: true, force: true }))

const mountTmpfs = (size, name) => mountTmpfsIn(dir, size, name)

describe('disk tier faults', () => {
  it('a full disk: failed writes are counted, the answer is unchanged, no temp file is left', async (t) => {
    const at = mountTmpfs('16k', 'full')
    if (!at) return t.skip('mounting a tmpfs needs root')
    try {
      const rt = await withTier(at)
      try {
        assert.deepEqual((await turn(rt)).tokens, cold.tokens)
        const s = rt.stats().kvDisk
        for (let i = 0; i < 1000 && rt.stats().kvDisk.writtenBlocks + rt.stats().kvDisk.failedBlocks < 4; i++) {
          await new Promise((r) => setTimeout(r, 10))
        }
        const d = rt.stats().kvDisk
        assert.ok(d.failedBlocks >= 1, JSON.stringify(d))
        assert.equal(d.writtenBlocks + d.failedBlocks, 4, JSON.stringify(s))
      } finally {
        await rt.dispose()
      }
      assert.ok(files(at).every((f) => f.endsWith('.kvb') || /^\.fingerprint-[0-9a-f]{64}$/.test(f)), files(at).join(', '))
      // What was written is whole: a later runtime reads it and rejects nothing.
      const later = await withTier(at)
      try {
        const got = await turn(later)
        assert.equal(later.stats().kvDisk.rejectedBlocks, 0)
        assert.equal(got.cached, later.stats().kvDisk.readBlocks * 16)
      } finally {
        await later.dispose()
      }
    } finally {
      umount(at)
    }
  })

  it('a read-only directory: its blocks are read, new ones fail to write, answers unchanged', async (t) => {
    const at = mountTmpfs('1m', 'ro')
    if (!at) return t.skip('mounting a tmpfs needs root')
    try {
      const a = await withTier(at)
      await turn(a)
      const warm = await turn(a)
      await a.dispose()
      assert.equal(spawnSync('mount', ['-o', 'remount,ro', at]).status, 0)
      const b = await withTier(at)
      try {
        const got = await turn(b)
        assert.deepEqual(got, warm)
        const other = await turn(b, { tokens: ids(2, 40) })
        assert.equal(other.cached, 0)
        for (let i = 0; i < 1000 && b.stats().kvDisk.failedBlocks < 2; i++) await new Promise((r) => setTimeout(r, 10))
        assert.equal(b.stats().kvDisk.failedBlocks, 2)
        assert.equal(b.stats().kvDisk.writtenBlocks, 0)
      } finally {
        await b.dispose()
      }
    } finally {
      umount(at)
    }
  })

  it('a process killed while writing leaves only whole files, which a later runtime reads', async () => {
    const tier = path.join(dir, 'killed')
    const child = spawn(process.execPath, [CHILD, tier, 'kill'], { stdio: ['ignore', 'pipe', 'inherit'] })
    await new Promise((resolve, reject) => {
      child.stdout.on('data', (d) => {
        if (String(d).includes('first token')) {
          child.kill('SIGKILL')
          resolve()
        }
      })
      child.on('exit', () => resolve())
      child.on('error', reject)
    })
    await new Promise((r) => (child.exitCode !== null || child.signalCode !== null ? r() : child.on('exit', r)))
    const rt = await withTier(tier)
    try {
      const got = await turn(rt)
      const d = rt.stats().kvDisk
      assert.equal(d.rejectedBlocks, 0, 'a temp file is never read, a renamed one is whole')
      assert.equal(got.cached, d.readBlocks * 16)
      if (got.cached === 0) assert.deepEqual(got.tokens, cold.tokens)
    } finally {
      await rt.dispose()
    }
  })

  it('two processes sharing the directory leave only whole files, within the budget', async () => {
    const tier = path.join(dir, 'shared')
    // Overlapping prompts (seeds 10-12 and 11-13): both write blocks 11 and 12's files.
    const run = (seed) =>
      new Promise((resolve, reject) => {
        const c = spawn(process.execPath, [CHILD, tier, 'share', String(seed)], { stdio: ['ignore', 'pipe', 'inherit'] })
        let out = ''
        c.stdout.on('data', (d) => (out += d))
        c.on('error', reject)
        c.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(`child exited with ${code}`))))
      })
    const [a, b] = await Promise.all([run(10), run(11)])
    for (const r of [a, b]) assert.equal(r.disk.rejectedBlocks + r.disk.failedBlocks, 0, JSON.stringify(r.disk))
    const kvb = readdirSync(tier, { recursive: true }).filter((f) => String(f).endsWith('.kvb'))
    const total = kvb.reduce((n, f) => n + statSync(path.join(tier, String(f))).size, 0)
    // Each keeps within 8 files counting what it saw; the other's last writes may come on top.
    assert.ok(total <= a.fileBytes * 12, `${kvb.length} files`)
    assert.ok(!readdirSync(tier).includes('.evict.lock'), 'no lock is left')
    const rt = await withTier(tier)
    try {
      for (const seed of [10, 11, 12, 13]) await turn(rt, { tokens: ids(seed, 70) })
      assert.equal(rt.stats().kvDisk.rejectedBlocks, 0, 'every file left is whole')
    } finally {
      await rt.dispose()
    }
  })
})
