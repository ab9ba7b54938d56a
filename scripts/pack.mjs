// `npm run pack:packages [-- DIR]`: the npm tarballs a release publishes for linux-x64-gnu,
// from what is built here: `expert-runtime-<version>.tgz` (the JS layer and loader),
// `expert-runtime-linux-x64-gnu-<version>.tgz` (the CPU addon) and, when `npm run build:cuda`
// has run, `expert-runtime-linux-x64-gnu-cuda-<version>.tgz`, and the README's demo experts
// (`expert-runtime-demo-experts-<version>.tgz`: npm/demo-experts with experts/sql-smollm2 and
// experts/shell-smollm2). The packages in npm/ stay untouched: each is staged in DIR with its
// binary (stripped of its symbol tables) or its experts.
import { execFileSync } from 'node:child_process'
import { copyFileSync, cpSync, existsSync, mkdirSync, rmSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { CUDA_NATIVE, NATIVE, npm, root } from './setup.mjs'

function pack(dir, dest) {
  const out = execFileSync(npm, ['pack', dir, '--pack-destination', dest, '--ignore-scripts', '--json'],
    { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] })
  return join(dest, JSON.parse(out)[0].filename)
}

/**
 * Copies an addon without its symbol tables (`strip --strip-unneeded`: what a loader and a
 * panic message need stays; the CPU addon goes from about 19 to 15 MB). Where `strip` is
 * missing the binary is copied as it is.
 */
function stripInto(src, dest) {
  try {
    execFileSync('strip', ['--strip-unneeded', '-o', dest, src], { stdio: ['ignore', 'ignore', 'pipe'] })
  } catch (e) {
    if (e.code !== 'ENOENT') throw e
    copyFileSync(src, dest)
  }
}

/** Packs into `dest`; returns the tarball paths (`cuda` is null when that build is absent). */
export function packPackages(dest) {
  mkdirSync(dest, { recursive: true })
  const platform = (name, file) => {
    if (!existsSync(join(root, file))) return null
    const stage = join(dest, 'stage', name)
    rmSync(stage, { recursive: true, force: true })
    cpSync(join(root, 'npm', name), stage, { recursive: true })
    // Each package carries the license (npm includes LICENSE whatever `files` says).
    copyFileSync(join(root, 'LICENSE'), join(stage, 'LICENSE'))
    stripInto(join(root, file), join(stage, file))
    return pack(stage, dest)
  }
  for (const f of ['dist/index.js', 'native.js', 'native.d.ts']) {
    if (!existsSync(join(root, f))) throw new Error(`${f} is missing: run \`npm run build\` first`)
  }
  const cpu = platform('linux-x64-gnu', NATIVE)
  if (!cpu) throw new Error(`${NATIVE} is missing: run \`npm run build\` first`)
  return { main: pack(root, dest), cpu, cuda: platform('linux-x64-gnu-cuda', CUDA_NATIVE), demoExperts: packDemoExperts(dest) }
}

/** The demo experts' package: the adapters, their manifests and evaluations, and the license. */
function packDemoExperts(dest) {
  const stage = join(dest, 'stage', 'demo-experts')
  rmSync(stage, { recursive: true, force: true })
  cpSync(join(root, 'npm', 'demo-experts'), stage, { recursive: true })
  copyFileSync(join(root, 'LICENSE'), join(stage, 'LICENSE'))
  for (const name of ['sql-smollm2', 'shell-smollm2']) cpSync(join(root, 'experts', name), join(stage, name), { recursive: true })
  return pack(stage, dest)
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const dest = resolve(process.argv[2] || join(root, 'target', 'packages'))
  const t = packPackages(dest)
  for (const [k, v] of Object.entries(t)) console.log(`${k}: ${v ?? '(not built)'}`)
}
