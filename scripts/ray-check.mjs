// `node scripts/ray-check.mjs`: the Ray Serve test (python/ray_tests), outside `npm test`
// because Ray is heavy (a few hundred MB, a cluster started per run). Builds the Python wheel
// as `npm test` does (scripts/python.mjs), installs it with `ray[serve]` into a venv of its own
// under the cache directory, and runs pytest there. Issue 53 asks for it before resolving.
import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { cacheDir } from './assets.mjs'
import { builtWheel, ensurePython } from './python.mjs'
import { root, run } from './setup.mjs'

const RAY = 'ray[serve]==2.60.*'
const venv = join(cacheDir, 'ray-venv')
const python = join(venv, 'bin', 'python')
if (!existsSync(python)) run('python3', ['-m', 'venv', venv])
try {
  execFileSync(python, ['-c', 'import ray.serve, pytest'], { stdio: 'ignore' })
} catch {
  console.error(`installing ${RAY} into ${venv} ...`)
  run(python, ['-m', 'pip', 'install', '-q', RAY, 'pytest'])
}
// The wheel `npm test` builds (target/wheels; rebuilt when the sources are newer).
ensurePython()
run(python, ['-m', 'pip', 'install', '-q', '--force-reinstall', '--no-deps', builtWheel()])
run(python, ['-m', 'pytest', '-q', '-s', '-p', 'no:cacheprovider', join(root, 'python', 'ray_tests'), ...process.argv.slice(2)])
