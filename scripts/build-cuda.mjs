// `npm run build:cuda`: builds the CUDA variant of the addon on a machine with no GPU and no
// CUDA install, with the PyPI toolchain from cuda-toolchain.mjs. The result is
// `expert-runtime.linux-x64-gnu-cuda.node` beside the CPU one; the JS loader picks between them.
//
//   node scripts/build-cuda.mjs            release build of the CUDA `.node` (≈15 min on 2 cores)
//   node scripts/build-cuda.mjs --check    `cargo check --features cuda` only (CI: keeps it compiling)
//
// A separate target folder keeps the CPU build's artifacts intact.
import { copyFileSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { ensureCudaToolchain } from './cuda-toolchain.mjs'
import { CUDA_NATIVE, ensureInstalled, root, run } from './setup.mjs'
const check = process.argv.includes('--check')
const targetDir = join(root, 'target', 'cuda')

run('cargo', ['fetch', '--quiet'])
const { env } = ensureCudaToolchain({ check })
const opts = { env: { ...process.env, ...env } }
if (check) {
  run('cargo', ['check', '--release', '--features', 'cuda', '--all-targets', '--target-dir', targetDir], opts)
} else {
  ensureInstalled()
  const out = join(targetDir, 'napi-out')
  mkdirSync(out, { recursive: true })
  run(process.platform === 'win32' ? 'npx.cmd' : 'npx', ['napi', 'build', '--platform', '--release', '--features', 'cuda',
    '--target-dir', targetDir, '--output-dir', out, '--no-js', '--dts', 'native.d.ts'], opts)
  copyFileSync(join(out, 'expert-runtime.linux-x64-gnu.node'), join(root, CUDA_NATIVE))
  console.error(`built ${CUDA_NATIVE}`)
}
