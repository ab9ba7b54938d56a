// The npm packages as a user gets them: the tarballs a release publishes for linux-x64-gnu
// (scripts/pack.mjs: `npm pack` of the main package and of each platform package with its
// binary) installed offline into a fresh Node project, then used from a process whose PATH has
// no Rust toolchain and whose working directory is outside this repository.
//   - CPU package: streams the demo answer (SmolLM2) token by token.
//   - The demo experts' package: the README's expert examples run from it, outside this
//     repository (no experts/ directory at hand).
//   - CUDA package as well (when `npm run build:cuda` has built it; scripts/before-resolve.sh does): on a machine
//     without the NVIDIA driver the CUDA addon cannot load, so `auto` falls back to the CPU
//     build, `cuda` rejects with NO_CUDA_DEVICE naming the missing library, and the process
//     lives on and exits normally. With a driver and a GPU, `auto` takes the GPU.
//   - The README's quick start, compiled by TypeScript with `skipLibCheck: false` in a fresh
//     ES-module project (so every shipped declaration file is checked), then run on SmolLM2.
//     The declarations alone also compile with `types: []` (TypeScript 7's default: no @types
//     package is read unless named), on TypeScript 5 and on TypeScript 7 (the dev dependency
//     `typescript7`, run from this repository's node_modules).
// The main package's own dependencies (prom-client and what it needs), and TypeScript with
// @types/node for the TypeScript project, are packed from this repository's node_modules and
// installed beside it: an offline install finds no registry metadata for them in a fresh
// machine's npm cache.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join } from 'node:path'
import { packPackages } from '../scripts/pack.mjs'
import { smolLM2OrSkip } from '../scripts/assets.mjs'
import { NATIVE, npm, root } from '../scripts/setup.mjs'

const { modelPath, skip } = smolLM2OrSkip()

// PATH for the consumer: Node and the system, nothing with cargo or rustc in it.
const nodeDir = dirname(process.execPath)
const cleanPath = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin', nodeDir]
  .filter((d) => existsSync(d) && !existsSync(join(d, 'cargo')) && !existsSync(join(d, 'rustc')))
if (!cleanPath.includes(nodeDir)) cleanPath.push(nodeDir)

const CONSUMER = `
const { Runtime } = require('expert-runtime')
const [model, device] = process.argv.slice(2)
;(async () => {
  const report = { device }
  try {
    const rt = await Runtime.load(model, { device })
    report.info = rt.info
    const chunks = []
    const s = rt.createSession({ system: 'You are a helpful assistant.' })
    for await (const t of s.generate('What is the capital of France? Answer in one sentence.', { temperature: 0, maxTokens: 24 })) chunks.push(t.text)
    report.chunks = chunks
    await rt.dispose()
  } catch (e) {
    report.error = { code: e.code, message: e.message }
  }
  console.log('REPORT ' + JSON.stringify(report))
})()
`

function consumerRun(dir, device) {
  const r = spawnSync(process.execPath, ['use.js', modelPath, device], {
    cwd: dir,
    encoding: 'utf8',
    env: { PATH: cleanPath.join(delimiter), HOME: dir },
    timeout: 120_000,
  })
  assert.equal(r.signal, null, `the consumer was killed by ${r.signal}:\n${r.stderr}`)
  assert.equal(r.status, 0, `the consumer exited with ${r.status}:\n${r.stderr}`)
  const line = r.stdout.split('\n').find((l) => l.startsWith('REPORT '))
  assert.ok(line, r.stdout + r.stderr)
  return JSON.parse(line.slice(7))
}

/**
 * Tarballs of the packages `names` and of what they depend on, as installed here (a nested
 * node_modules first, then the hoisted one).
 */
function packClosure(names, dest) {
  const packed = new Map()
  const visit = (name, from) => {
    const dir = [join(from, 'node_modules', name), join(root, 'node_modules', name)].find((d) => existsSync(join(d, 'package.json')))
    assert.ok(dir, `${name} is not installed (npm install)`)
    if (packed.has(dir)) return
    const out = execFileSync(npm, ['pack', '--ignore-scripts', '--pack-destination', dest, dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
    packed.set(dir, join(dest, out.trim().split('\n').pop()))
    for (const dep of Object.keys(JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')).dependencies ?? {})) visit(dep, dir)
  }
  for (const name of names) visit(name, root)
  return [...packed.values()]
}

/** Tarballs of the main package's runtime dependencies (the closure of its `dependencies`). */
function packDependencies(dest) {
  return packClosure(Object.keys(JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).dependencies ?? {}), dest)
}

/**
 * A program using the API's types without any of Node's globals (which need @types/node): it
 * compiles where `types` is `[]` only if the package's declarations need nothing outside
 * TypeScript's own libraries (`Symbol.asyncDispose`, `Symbol.dispose` included).
 */
const TYPES_ONLY = `
import { Runtime, ExpertRuntimeError, type GenerateOptions, type CompletionResult } from 'expert-runtime'

export async function answer(model: string, question: string, signal: AbortSignal): Promise<CompletionResult> {
  await using rt = await Runtime.load(model, { kvCache: { maxTokens: 4096 } })
  using session = rt.createSession({ system: 'Be brief.' })
  const options: GenerateOptions = { maxTokens: 64, temperature: 0, signal }
  for await (const chunk of session.generate(question, options)) void chunk.text
  try {
    return await session.complete('Again, shorter.', options)
  } catch (e) {
    if (e instanceof ExpertRuntimeError && e.code === 'CONTEXT_OVERFLOW') session.reset()
    throw e
  }
}
`

/** The TypeScript compilers the declarations are checked with: the consumer's own (5.x) and TypeScript 7. */
const compilers = (dir) => [
  ['TypeScript 5', join(dir, 'node_modules', 'typescript', 'bin', 'tsc')],
  ['TypeScript 7', join(root, 'node_modules', 'typescript7', 'bin', 'tsc')],
]

/**
 * The README's quick start: the first ```ts block after the comment that names this test,
 * loading `model` instead of the model it names.
 */
function readmeQuickStart(model) {
  const readme = readFileSync(join(root, 'README.md'), 'utf8')
  const at = readme.indexOf('<!-- __test__/package.test.mjs')
  assert.ok(at >= 0, 'the README marks its quick start for this test')
  const block = /```ts\n([\s\S]*?)```/.exec(readme.slice(at))
  assert.ok(block, 'a ```ts block follows the marker')
  const loads = block[1].match(/Runtime\.load\('[^']*'/g) ?? []
  assert.equal(loads.length, 1, 'the quick start loads one model')
  return block[1].replace(/Runtime\.load\('[^']*'/, `Runtime.load(${JSON.stringify(model)}`)
}

describe('npm packages installed into a fresh project', { skip }, () => {
  let work
  let tarballs
  let dependencies
  before(() => {
    work = mkdtempSync(join(tmpdir(), 'expert-runtime-pkg-'))
    tarballs = packPackages(join(work, 'tarballs'))
    dependencies = packDependencies(join(work, 'tarballs'))
  })
  after(() => work && rmSync(work, { recursive: true, force: true }))

  function install(name, files) {
    const dir = join(work, name)
    mkdirSync(dir, { recursive: true })
    writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: `consumer-${name}`, version: '1.0.0', private: true }))
    writeFileSync(join(dir, 'use.js'), CONSUMER)
    // --offline: nothing comes from the registry; the other platforms' optional packages are left out.
    execFileSync(npm, ['install', '--offline', '--no-audit', '--no-fund', '--omit=optional', ...files, ...dependencies], { cwd: dir, stdio: 'pipe' })
    return dir
  }

  it('the packed addon carries no symbol tables', () => {
    const dir = join(work, 'unpacked')
    mkdirSync(dir, { recursive: true })
    execFileSync('tar', ['-xzf', tarballs.cpu, '-C', dir])
    const packed = readFileSync(join(dir, 'package', NATIVE))
    const built = statSync(join(root, NATIVE)).size
    assert.ok(packed.length < built, `packed ${packed.length} bytes, built ${built}`)
    // The section-name table of an unstripped ELF file names .symtab; a stripped one does not.
    assert.ok(!packed.includes(Buffer.from('.symtab\0')), 'the packed addon still has .symtab')
  })

  it('the CPU package streams the demo answer with no Rust toolchain on PATH', () => {
    assert.ok(!spawnSync('cargo', ['--version'], { env: { PATH: cleanPath.join(delimiter) } }).stdout, 'cargo must not be reachable')
    const dir = install('cpu', [tarballs.main, tarballs.cpu])
    const r = consumerRun(dir, 'auto')
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.equal(r.info.device, 'cpu')
    assert.equal(r.info.binary, 'cpu')
    assert.ok(r.chunks.length >= 5, `streamed ${r.chunks.length} chunks`)
    assert.match(r.chunks.join(''), /Paris/)
    const cuda = consumerRun(dir, 'cuda')
    assert.equal(cuda.error?.code, 'NO_CUDA_DEVICE')
  })

  it("the README's quick start compiles (TypeScript 5 and 7, skipLibCheck: false) and runs; the declarations need no @types (types: [])", () => {
    const dir = install('typescript', [tarballs.main, tarballs.cpu, ...packClosure(['typescript', '@types/node'], join(work, 'tarballs'))])
    const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'))
    writeFileSync(join(dir, 'package.json'), JSON.stringify({ ...pkg, type: 'module' }, null, 2))
    // What `tsc --init` gives a Node project, made strict about declaration files.
    writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
      compilerOptions: { target: 'ES2022', module: 'nodenext', moduleResolution: 'nodenext', strict: true, skipLibCheck: false, types: ['node'], outDir: 'out' },
      files: ['quickstart.ts'],
    }))
    // The demo model: a real chat model ends its answers, and its context holds both turns.
    writeFileSync(join(dir, 'quickstart.ts'), readmeQuickStart(modelPath))
    const env = { PATH: cleanPath.join(delimiter), HOME: dir }
    const tsc = (name, compiler, project, ...args) => {
      const r = spawnSync(process.execPath, [compiler, '-p', project, ...args], { cwd: dir, encoding: 'utf8', env, timeout: 120_000 })
      assert.equal(r.status, 0, `${name} (${project}) failed:\n${r.stdout}${r.stderr}`)
      return r
    }
    // The declarations on their own, where no @types package is read (TypeScript 7's default).
    writeFileSync(join(dir, 'types-only.ts'), TYPES_ONLY)
    writeFileSync(join(dir, 'tsconfig.types-only.json'), JSON.stringify({
      compilerOptions: { target: 'ES2022', module: 'nodenext', moduleResolution: 'nodenext', strict: true, skipLibCheck: false, types: [], noEmit: true },
      files: ['types-only.ts'],
    }))
    const versions = compilers(dir).map(([name, compiler]) => {
      tsc(name, compiler, 'tsconfig.types-only.json')
      // The quick start (it writes to process.stdout: @types/node, as the README says); what
      // runs below is TypeScript 5's output.
      tsc(name, compiler, '.', ...(name === 'TypeScript 5' ? [] : ['--noEmit']))
      return spawnSync(process.execPath, [compiler, '--version'], { encoding: 'utf8', env }).stdout.trim()
    })
    assert.match(versions[0], /^Version 5\./)
    assert.match(versions[1], /^Version 7\./)
    const run = spawnSync(process.execPath, ['out/quickstart.js'], { cwd: dir, encoding: 'utf8', env, timeout: 120_000 })
    assert.equal(run.status, 0, `the quick start exited with ${run.status}:\n${run.stderr}`)
    assert.match(run.stdout, /\(\d+ tokens, [\d.]+ tokens\/s\)/)
  })

  it("the demo experts' package: the README's expert example runs from an installed project", () => {
    const dir = install('demo-experts', [tarballs.main, tarballs.cpu, tarballs.demoExperts])
    writeFileSync(join(dir, 'experts.js'), `
      const { Runtime } = require('expert-runtime')
      const experts = require('expert-runtime-demo-experts')
      ;(async () => {
        const rt = await Runtime.load(process.argv[2])
        const sql = await rt.loadExpert(experts.sql)
        await rt.loadExpert(experts.shell)
        const s = rt.createSession({ experts: ['sql'] })
        const r = await s.complete('How many orders have shipped?', { temperature: 0, maxTokens: 48 })
        const d = await rt.route('Show the disk usage of my home directory.')
        console.log('REPORT ' + JSON.stringify({ name: sql.name, rank: sql.rank, answer: r.text, routed: d.experts, baseModel: experts.baseModel }))
        await rt.dispose()
      })()`)
    const r = spawnSync(process.execPath, ['experts.js', modelPath], { cwd: dir, encoding: 'utf8', env: { PATH: cleanPath.join(delimiter), HOME: dir }, timeout: 120_000 })
    assert.equal(r.status, 0, r.stderr)
    const report = JSON.parse(r.stdout.split('\n').find((l) => l.startsWith('REPORT ')).slice(7))
    assert.equal(report.name, 'sql')
    assert.equal(report.rank, 8)
    assert.match(report.answer, /^\s*SELECT\b[^;]*\bFROM\s+orders\b/i)
    assert.deepEqual(report.routed, ['shell'])
    assert.match(report.baseModel, /SmolLM2-135M-Instruct/)
  })

  it('without its platform package: NO_NATIVE_BINARY naming the package to install', () => {
    const dir = install('bare', [tarballs.main])
    const r = consumerRun(dir, 'auto')
    assert.equal(r.error?.code, 'NO_NATIVE_BINARY', JSON.stringify(r.error))
    assert.match(r.error.message, /expert-runtime-linux-x64-gnu/)
  })

  it('with the CUDA package too: auto falls back (or takes the GPU), cuda explains, nothing aborts', (t) => {
    if (!tarballs.cuda) return t.skip('the CUDA build is absent (npm run build:cuda)')
    const dir = install('cuda', [tarballs.main, tarballs.cpu, tarballs.cuda])
    const auto = consumerRun(dir, 'auto')
    assert.equal(auto.error, undefined, JSON.stringify(auto.error))
    assert.match(auto.chunks.join(''), /Paris/)
    const cuda = consumerRun(dir, 'cuda')
    if (auto.info.device === 'cuda') {
      assert.equal(auto.info.binary, 'cuda')
      assert.equal(cuda.error, undefined)
    } else {
      assert.equal(cuda.error?.code, 'NO_CUDA_DEVICE')
      // No driver: the CUDA addon does not load and the message names what is missing. A driver
      // without a GPU: the CUDA addon loads and runs on the CPU.
      if (auto.info.binary === 'cpu') assert.match(cuda.error.message, /lib[a-zA-Z]+\.so/)
    }
  })
})
