// Set-up shared by `npm run demo` and `npm test`: install dependencies, build the native
// addon and the TypeScript layer when their sources changed. Each step is a no-op when done.
import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync, statSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const root = join(dirname(fileURLToPath(import.meta.url)), '..')
export const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm'

export function run(cmd, args, opts = {}) {
  execFileSync(cmd, args, { cwd: root, stdio: 'inherit', ...opts })
}

/** The host's Rust target triple (builds pass it as `--target` so they share compiled dependencies). */
export function rustHost() {
  return /^host: (\S+)$/m.exec(execFileSync('rustc', ['-vV'], { encoding: 'utf8' }))[1]
}

/** The newest modification time of any file under `paths` (relative to the root). */
export function newest(paths) {
  let t = 0
  const walk = (p) => {
    if (!existsSync(p)) return
    const s = statSync(p)
    if (s.isDirectory()) for (const e of readdirSync(p)) walk(join(p, e))
    else t = Math.max(t, s.mtimeMs)
  }
  paths.forEach((p) => walk(join(root, p)))
  return t
}

function mtime(p) {
  const f = join(root, p)
  return existsSync(f) ? statSync(f).mtimeMs : 0
}

export function ensureInstalled() {
  if (existsSync(join(root, 'node_modules', '@napi-rs', 'cli'))) return
  console.error('installing npm dependencies ...')
  // `npm install`, not `npm ci`: it follows package-lock.json just the same, but npm 11 leaves
  // other platforms' optional packages (node-llama-cpp's, @napi-rs/cli's) out of the lock
  // and `npm ci` then refuses it as out of sync.
  run(npm, ['install', '--no-audit', '--no-fund'])
}

/** The CPU addon `npm run build` writes, and the CUDA one `npm run build:cuda` writes. */
export const NATIVE = 'expert-runtime.linux-x64-gnu.node'
export const CUDA_NATIVE = 'expert-runtime.linux-x64-gnu-cuda.node'

export function ensureBuilt({ force = false } = {}) {
  ensureInstalled()
  if (force || mtime(NATIVE) < newest(['src', 'Cargo.toml', 'Cargo.lock', 'build.rs'])) {
    console.error('building the native addon (first build takes several minutes) ...')
    run(npm, ['run', 'build:native'])
  }
  if (force || mtime('dist/index.js') < Math.max(newest(['lib', 'tsconfig.json']), mtime('native.d.ts'))) {
    run(npm, ['run', 'build:ts'])
  }
}
