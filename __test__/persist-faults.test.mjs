// Saved sessions under faults (issue 52): a process killed while saving, a full disk (a small
// tmpfs), a read-only directory. Each gives a typed error (IO_ERROR) or leaves the last
// complete file, which restores to a state the session really had: never a torn file, never
// a wrong state, never a crash. (Files from another model, truncated or bit-flipped ones:
// persist.test.mjs, the adversarial suite and the `session_file` fuzz target.)
//
// The disk faults mount a tmpfs, which needs root (CAP_SYS_ADMIN): elsewhere they are skipped,
// saying so.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { mkdtempSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { mountTmpfs as mountTmpfsIn, umount, fixture } from './helpers.mjs'
import { input, turn } from './persist-faults-child.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const MODEL = fixture('llama-tiny')
// Without prefix sharing every session evaluates its own tokens in the same passes, so a
// restored state and one rebuilt afresh agree bit for bit. (With sharing, a session that
// reuses another's blocks holds values computed in other chunks: equal to rounding.)
const NO_SHARING = { kvCache: { prefixCache: false } }
/** Turn after turn, saving after each to one file (./persist-faults-child.mjs). */
const CHILD = fileURLToPath(new URL('./persist-faults-child.mjs', import.meta.url))

/** A session that has taken turns 0..n-1. */
async function sessionAfter(rt, n) {
  const s = rt.createSession()
  for (let i = 0; i < n; i++) await turn(s, input(i))
  return s
}

let dir
let rt
before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'er-persist-faults-'))
  rt = await Runtime.load(MODEL, NO_SHARING)
})
after(async () => {
  await rt?.dispose()
  rmSync(dir, { recursive: true, force: true })
})

// ---------------------------------------------------------------- a kill during save

describe('a process killed while saving', () => {
  it('leaves the last complete file, which restores to a state the session had', async () => {
    const file = path.join(dir, 'killed.session')
    for (const delay of [0, 1, 3, 7]) {
      const p = spawn(process.execPath, [CHILD, file], { stdio: ['ignore', 'pipe', 'inherit'] })
      let out = ''
      await new Promise((resolve, reject) => {
        p.stdout.on('data', (d) => {
          out += d
          // Killed in the middle of its third save (or just before or after it).
          if (out.includes('saving 3')) setTimeout(() => p.kill('SIGKILL'), delay)
        })
        p.on('exit', resolve)
        p.on('error', reject)
      })
      const lines = out.trim().split('\n')
      assert.ok(lines.includes('saved 2'), `the child saved twice before it was killed: ${out}`)
      // The file is one of the complete saves: restored, its next turn equals that of the
      // session after those turns, computed afresh.
      const restored = await rt.restoreSession(file)
      const got = await turn(restored, input(99))
      // The last save that finished, or the one in flight when the kill came.
      const last = Math.max(...lines.filter((l) => l.startsWith('saved ')).map((l) => Number(l.slice(6))))
      const turns = [last, last + 1]
      let match
      for (const n of turns) {
        const s = await sessionAfter(rt, n)
        const want = await turn(s, input(99))
        s.dispose()
        if (JSON.stringify(want.tokens) === JSON.stringify(got.tokens)) match = n
      }
      assert.ok(match !== undefined, `the restored session is none of the saved states (${turns})`)
      restored.dispose()
    }
    // A killed save leaves at most its own temporary file, which nothing reads.
    const left = readdirSync(dir).filter((f) => f.endsWith('.tmp'))
    assert.ok(left.every((f) => f.startsWith('.killed.session.')), left.join(', '))
  })
})

// ---------------------------------------------------------------- disk faults, on a tmpfs

const mountTmpfs = (size, name) => mountTmpfsIn(dir, size, name)

describe('disk faults', () => {
  it('a full disk: IO_ERROR, no partial file, and the previous save still restores', async (t) => {
    const at = mountTmpfs('96k', 'full')
    if (!at) return t.skip('mounting a tmpfs needs root')
    try {
      const file = path.join(at, 'chat.session')
      const small = await sessionAfter(rt, 1)
      await small.save(file)
      const size = statSync(file).size
      assert.ok(size < 48 * 1024, `one turn's file fits: ${size}`)
      const want = await turn(small, input(99))
      // Enough turns that the file (117 KB) is larger than what is left.
      const big = await sessionAfter(rt, 30)
      await assert.rejects(big.save(file), (e) => {
        assert.equal(e.code, 'IO_ERROR', e.message)
        assert.match(e.message, /No space left on device|os error 28/)
        return true
      })
      assert.deepEqual(readdirSync(at), ['chat.session'], 'no temporary file is left')
      assert.equal(statSync(file).size, size)
      const restored = await rt.restoreSession(file)
      assert.deepEqual((await turn(restored, input(99))).tokens, want.tokens)
      for (const s of [small, big, restored]) s.dispose()
    } finally {
      umount(at)
    }
  })

  it('a read-only directory: IO_ERROR on save; its files still restore', async (t) => {
    const at = mountTmpfs('1m', 'ro')
    if (!at) return t.skip('mounting a tmpfs needs root')
    try {
      const file = path.join(at, 'chat.session')
      const s = await sessionAfter(rt, 2)
      await s.save(file)
      const want = await turn(s, input(99))
      assert.equal(spawnSync('mount', ['-o', 'remount,ro', at]).status, 0)
      await assert.rejects(s.save(file), (e) => {
        assert.equal(e.code, 'IO_ERROR', e.message)
        assert.match(e.message, /Read-only file system|os error 30/)
        return true
      })
      await assert.rejects(s.save(path.join(at, 'other.session')), { code: 'IO_ERROR' })
      const restored = await rt.restoreSession(file)
      assert.deepEqual((await turn(restored, input(99))).tokens, want.tokens)
      s.dispose()
      restored.dispose()
    } finally {
      umount(at)
    }
  })
})
