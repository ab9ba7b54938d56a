// `npm run build:cuda`: builds the CUDA variant of the addon on a machine with no GPU and no
// CUDA install, with the PyPI toolchain from cuda-toolchain.mjs. The result is
// `expert-runtime.linux-x64-gnu-cuda.node` beside the CPU one; the JS loader picks between them.
// 15–22 minutes on 2 cores the first time, most of it candle's CUDA kernels. A separate target
// folder keeps the CPU build's artifacts intact. CI runs it (.ci/run) so the feature cannot rot.
// It also compiles the GPU kernel harnesses (benches/cuda/kernels.cu and prefill.cu, run on a GPU
// machine by `scripts/gpu-check.sh --kernels`) with the same nvcc, so the harnesses and the kernel
// variants they check build before device time is spent on them.
import { copyFileSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { ensureCudaToolchain } from './cuda-toolchain.mjs'
import { CUDA_NATIVE, ensureInstalled, npm, root, run } from './setup.mjs'

const targetDir = join(root, 'target', 'cuda')

run('cargo', ['fetch', '--quiet'])
const { env } = ensureCudaToolchain()
ensureInstalled()
const out = join(targetDir, 'napi-out')
mkdirSync(out, { recursive: true })
run(npm, ['exec', '--', 'napi', 'build', '--platform', '--release', '--features', 'cuda',
  '--target-dir', targetDir, '--output-dir', out, '--no-js', '--dts', 'native.d.ts'], { env: { ...process.env, ...env } })
copyFileSync(join(out, 'expert-runtime.linux-x64-gnu.node'), join(root, CUDA_NATIVE))
console.error(`built ${CUDA_NATIVE}`)
const cap = env.CUDA_COMPUTE_CAP
for (const harness of ['kernels', 'prefill']) {
  run(join(env.CUDA_ROOT, 'bin', 'nvcc'), ['-O3', `-arch=sm_${cap}`, '-std=c++17', join('benches', 'cuda', `${harness}.cu`),
    '-o', join(targetDir, harness)], { env: { ...process.env, ...env } })
  console.error(`built the kernel harness benches/cuda/${harness}.cu`)
}
