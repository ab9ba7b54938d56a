// The random benchmark models, made on first use into the cache directory and never committed:
// Qwen3-0.6B-shaped (scripts/make_bench_model.py) and Qwen3.5-0.8B-shaped hybrid
// (scripts/make_hybrid_bench_model.py).
import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { cacheDir } from './assets.mjs'

const here = dirname(fileURLToPath(import.meta.url))
export const qwen3BenchDir = join(cacheDir, 'qwen3-0.6b-random')
export const qwen35BenchDir = join(cacheDir, 'qwen35-0.8b-random')
const PY_PACKAGES = ['torch', 'transformers', 'gguf', 'safetensors']

/** The files make_bench_model.py (HF dirs f32, f16) or make_hybrid_bench_model.py (f32) writes (their `complete()` checks the same list). */
function benchModelComplete(dir, hfDirs = ['f32', 'f16']) {
  const hf = ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'generation_config.json']
  return existsSync(join(dir, 'q8_0.gguf')) && hfDirs.every((d) => hf.every((f) => existsSync(join(dir, d, f))))
}

function hasPackages(python) {
  try {
    execFileSync(python, ['-c', `import ${PY_PACKAGES.join(', ')}`], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
}

/** `$PYTHON` when set, else a venv under the cache directory (created and filled from PyPI once). */
function benchPython({ quiet }) {
  if (process.env.PYTHON) return process.env.PYTHON
  const venv = join(cacheDir, 'bench-venv')
  const python = join(venv, 'bin', 'python')
  if (!existsSync(python)) {
    if (!quiet) console.error(`creating a Python venv in ${venv} ...`)
    execFileSync('python3', ['-m', 'venv', venv], { stdio: ['ignore', 'inherit', 'inherit'] })
  }
  if (!hasPackages(python)) {
    if (!quiet) console.error(`installing ${PY_PACKAGES.join(' ')} into ${venv} (several GB, a few minutes) ...`)
    execFileSync(python, ['-m', 'pip', 'install', '--quiet', ...PY_PACKAGES], { stdio: ['ignore', 'inherit', 'inherit'] })
  }
  return python
}

/**
 * Paths of the Qwen3-0.6B-shaped random model: `{ dir, f32, f16, q8_0 }` (two HF directories
 * and a GGUF file). Generates them when missing (~4.2 GB on disk, ~2 GB RAM, under a minute
 * plus the one-time venv).
 */
export function ensureQwen3Bench({ quiet = false } = {}) {
  const dir = qwen3BenchDir
  if (!benchModelComplete(dir)) {
    if (!quiet) console.error(`generating the Qwen3-0.6B-shaped random model into ${dir} ...`)
    const python = benchPython({ quiet })
    execFileSync(python, [join(here, 'make_bench_model.py'), '--out', dir], { stdio: ['ignore', 'ignore', 'inherit'] })
    if (!benchModelComplete(dir)) throw new Error(`make_bench_model.py did not produce ${dir}`)
  }
  return { dir, f32: join(dir, 'f32'), f16: join(dir, 'f16'), q8_0: join(dir, 'q8_0.gguf') }
}

/**
 * Paths of the Qwen3.5-0.8B-shaped random hybrid model (Gated DeltaNet + gated attention):
 * `{ dir, f32, q8_0 }` (an HF directory and a llama.cpp `qwen35` GGUF). Generates them when
 * missing (~3.8 GB on disk, ~1.5 GB RAM, a few minutes plus the one-time venv).
 */
export function ensureQwen35Bench({ quiet = false } = {}) {
  const dir = qwen35BenchDir
  if (!benchModelComplete(dir, ['f32'])) {
    if (!quiet) console.error(`generating the Qwen3.5-0.8B-shaped random model into ${dir} ...`)
    const python = benchPython({ quiet })
    execFileSync(python, [join(here, 'make_hybrid_bench_model.py'), '--out', dir], { stdio: ['ignore', 'ignore', 'inherit'] })
    if (!benchModelComplete(dir, ['f32'])) throw new Error(`make_hybrid_bench_model.py did not produce ${dir}`)
  }
  return { dir, f32: join(dir, 'f32'), q8_0: join(dir, 'q8_0.gguf') }
}
