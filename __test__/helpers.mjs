// Helpers shared by the Node suites (__test__/*.test.mjs). Holds no tests: `node --test __test__/`
// runs only the files named like tests (*.test.mjs), so this one runs only when a suite imports it.
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { mkdirSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

/** The tiny fixture models, adapters and references (fixtures/README.md). */
export const FIXTURES = fileURLToPath(new URL('./fixtures/', import.meta.url))

/** A path under FIXTURES. */
export const fixture = (...p) => path.join(FIXTURES, ...p)

/** A JSON file under FIXTURES, parsed. */
export const fixtureJson = (...p) => JSON.parse(readFileSync(fixture(...p), 'utf8'))

/** The reference.json (HF transformers runs) of the fixture model `name`. */
export const reference = (name) => fixtureJson(name, 'reference.json')

export const GREEDY = { temperature: 0 }

/** How far a logprob may be from the f32 reference (or from the same request run otherwise). */
export const LOGPROB_TOL = 1e-4

/** Consumes a generation stream: every chunk, and the summary the stream ends with. */
export async function collect(stream) {
  const chunks = []
  for await (const c of stream) chunks.push(c)
  return { chunks, result: stream.result }
}

/** `assert.rejects` / `assert.throws` matcher: an ExpertRuntimeError with this code. */
export const coded = (code) => (e) => {
  const { ExpertRuntimeError } = createRequire(import.meta.url)('../dist/index.js')
  assert.ok(e instanceof ExpertRuntimeError, `expected ExpertRuntimeError, got ${e?.name}: ${e?.message}`)
  assert.equal(e.code, code, e.message)
  return true
}

/** The command-line entry point (`expert-runtime`), as built into dist/. */
export const CLI = fileURLToPath(new URL('../dist/cli.js', import.meta.url))

/** Runs the CLI to its end: `{ code, stdout, stderr }`; `input` goes to its stdin, `env` replaces the environment. */
export function runCli(args, { input = '', env } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { env, stdio: ['pipe', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d))
    child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d))
    child.on('error', reject)
    child.on('close', (code) => resolve({ code, stdout, stderr }))
    child.stdin.end(input)
  })
}

/**
 * The first member name that appears twice in one object of the JSON `text` (already known to
 * parse), or null. JSON.parse keeps the last of duplicates silently, so ajv never sees them;
 * other parsers keep the first, so an answer with duplicates means different things to each.
 */
export function duplicateKey(text) {
  const stack = [] // a Set of the names seen per open object, null per open array
  for (let i = 0; i < text.length; i++) {
    const c = text[i]
    if (c === '{') stack.push(new Set())
    else if (c === '[') stack.push(null)
    else if (c === '}' || c === ']') stack.pop()
    else if (c === '"') {
      let j = i + 1
      while (text[j] !== '"') j += text[j] === '\\' ? 2 : 1
      const raw = text.slice(i, j + 1)
      i = j
      while (/\s/.test(text[j + 1] ?? '')) j++
      const keys = stack.at(-1)
      if (text[j + 1] === ':' && keys) {
        const name = JSON.parse(raw)
        if (keys.has(name)) return name
        keys.add(name)
      }
    }
  }
  return null
}

/** Runs `fn` over `items`, at most `n` at a time, and returns the results in order. */
export async function pool(items, n, fn) {
  const out = new Array(items.length)
  let next = 0
  const worker = async () => {
    while (next < items.length) {
      const i = next++
      out[i] = await fn(items[i], i)
    }
  }
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker))
  return out
}

/**
 * Mounts a tmpfs of `size` at `dir/name` (created); `null` where mounting is not allowed
 * (it needs root: CAP_SYS_ADMIN). Tests of a full or read-only disk use it.
 */
export function mountTmpfs(dir, size, name) {
  const at = path.join(dir, name)
  mkdirSync(at)
  const r = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', at])
  return r.status === 0 ? at : null
}

/** Unmounts what `mountTmpfs` mounted. */
export const umount = (at) => spawnSync('umount', [at])
