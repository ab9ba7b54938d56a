// Helpers shared by the benchmarks (cpu.mjs, experts.mjs): each measurement runs in a fresh
// child process, after waiting for an idle machine, on files already in the page cache.
import { spawnSync } from 'node:child_process'
import { createReadStream, readdirSync, readFileSync, statSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { Writable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { fileURLToPath } from 'node:url'

const MB = 1024 * 1024
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')

function cpuTimes() {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number)
  return { idle: f[3] + (f[4] || 0), total: f.reduce((a, b) => a + b, 0) }
}

/** Waits (up to `maxS`) for a second in which the machine is at least 90% idle; returns that fraction. */
export async function waitIdle(maxS) {
  if (process.platform !== 'linux' || maxS <= 0) return null
  const t0 = Date.now()
  let idle = 0
  for (;;) {
    const a = cpuTimes()
    await new Promise((r) => setTimeout(r, 1000))
    const b = cpuTimes()
    idle = (b.idle - a.idle) / Math.max(1, b.total - a.total)
    if (idle >= 0.9 || Date.now() - t0 > maxS * 1000) return idle
  }
}

/**
 * Runs `script --child <spec as JSON>` and returns the object it printed on its
 * `BENCH_RESULT ` line; `label` names the child in the error when it fails.
 */
export function runChild(script, spec, label) {
  const r = spawnSync(process.execPath, [script, '--child', JSON.stringify(spec)], {
    encoding: 'utf8',
    maxBuffer: 64 * MB,
    timeout: 30 * 60 * 1000,
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const line = (r.stdout || '').split('\n').find((l) => l.startsWith('BENCH_RESULT '))
  if (r.status !== 0 || !line) {
    throw new Error(`child ${label} failed (status ${r.status}, signal ${r.signal}):\n${r.stderr}\n${r.stdout}`)
  }
  return JSON.parse(line.slice('BENCH_RESULT '.length))
}

/** Reads every file (of a directory, not recursing) once so the engines load from a warm page cache. */
export async function warmPageCache(path) {
  const files = statSync(path).isDirectory() ? readdirSync(path).map((f) => join(path, f)).filter((f) => statSync(f).isFile()) : [path]
  for (const f of files) {
    await pipeline(createReadStream(f, { highWaterMark: 8 * MB }), new Writable({ write: (_c, _e, cb) => cb() }))
  }
}

/** The short commit, `+dirty` when engine sources differ from it. */
export function gitRev() {
  const r = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' })
  const d = spawnSync('git', ['status', '--porcelain', '--', 'src', 'lib', 'Cargo.toml', 'Cargo.lock'], { cwd: root, encoding: 'utf8' })
  return r.status === 0 ? r.stdout.trim() + (d.stdout.trim() ? '+dirty' : '') : null
}
