// A repository revision's file list (`GET /api/models/{repo}/revision/{rev}?blobs=true`) and the
// choice of files a model needs from it: an HF directory (config, tokenizer, safetensors — a
// shard index brings its shards), a PEFT adapter directory, or a repository's only GGUF file.
// READMEs, images, other-format weights (onnx/, original/, *.bin, *.pt) are never fetched.
import { ExpertRuntimeError, invalidArgument } from '../errors'
import { MAX_FILE_BYTES, downloadFailed } from './http'
import { COMMIT, hubPath } from './ref'

export interface RepoFile {
  name: string
  size?: number
  /** LFS files only. */
  sha256?: string
}

export interface Listing {
  commit: string
  files: Map<string, RepoFile>
}

/** More files than any model repository holds. */
const MAX_FILES = 100_000
/** More shards than any model has. */
const MAX_SHARDS = 10_000

/** The files of an HF model directory the engine reads, besides its weights. */
export const MODEL_FILES = ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja', 'chat_template.json']
export const SAFETENSORS = 'model.safetensors'
export const SAFETENSORS_INDEX = 'model.safetensors.index.json'
/** A PEFT adapter directory (`Runtime.loadExpert`). */
export const ADAPTER_FILES = ['adapter_config.json', 'adapter_model.safetensors', 'manifest.json']

const isSize = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= MAX_FILE_BYTES

/** Checks the API's answer: a commit id and a list of safe, unique file names. */
export function parseListing(json: unknown, where: string): Listing {
  const o = json as { sha?: unknown; siblings?: unknown } | null
  if (!o || typeof o !== 'object' || !Array.isArray(o.siblings)) throw downloadFailed(`${where}: the answer has no file list`)
  if (typeof o.sha !== 'string' || !COMMIT.test(o.sha)) throw downloadFailed(`${where}: the answer has no commit id`)
  if (o.siblings.length > MAX_FILES) throw downloadFailed(`${where}: more than ${MAX_FILES} files`)
  const files = new Map<string, RepoFile>()
  for (const s of o.siblings as unknown[]) {
    const e = s as { rfilename?: unknown; size?: unknown; lfs?: { sha256?: unknown; size?: unknown } } | null
    const name = hubPath(e?.rfilename, where)
    const lfs = e?.lfs && typeof e.lfs === 'object' ? e.lfs : undefined
    const size = lfs && isSize(lfs.size) ? lfs.size : isSize(e?.size) ? e.size : undefined
    const sha256 = typeof lfs?.sha256 === 'string' && /^[0-9a-f]{64}$/.test(lfs.sha256) ? lfs.sha256 : undefined
    if (!files.has(name)) files.set(name, { name, size, sha256 })
  }
  return { commit: o.sha, files }
}

export interface Selection {
  /** In download order. */
  files: string[]
  /** What to load, relative to the snapshot: `''` for the directory, else one file. */
  entry: string
  /** A shard index to read for the rest of the files (`shardsOf`). */
  index?: string
}

function list(names: string[]): string {
  const shown = names.slice(0, 20).join(', ')
  return names.length > 20 ? `${shown} and ${names.length - 20} more` : shown
}

export const ggufFiles = (l: Listing) => [...l.files.keys()].filter((n) => /\.gguf$/i.test(n)).sort()

/** What a whole-repository ref is for: a model or an adapter (`any`), or only an adapter. */
export type Want = 'any' | 'adapter'

/** The files a whole-repository ref fetches. */
export function selectFiles(l: Listing, repo: string, want: Want = 'any'): Selection {
  const has = (n: string) => l.files.has(n)
  if (want === 'adapter' && !(has('adapter_config.json') && has('adapter_model.safetensors'))) {
    throw new ExpertRuntimeError('INVALID_ADAPTER', `${repo} is not a PEFT adapter repository (no adapter_config.json with adapter_model.safetensors)`)
  }
  if (has('config.json') && (has(SAFETENSORS) || has(SAFETENSORS_INDEX))) {
    if (!has('tokenizer.json')) {
      throw new ExpertRuntimeError('INVALID_MODEL', `${repo} has no tokenizer.json (the engine reads the fast-tokenizer file; tokenizer.model alone is not enough)`)
    }
    const files = MODEL_FILES.filter(has)
    return has(SAFETENSORS) ? { files: [...files, SAFETENSORS], entry: '' } : { files, entry: '', index: SAFETENSORS_INDEX }
  }
  if (has('adapter_config.json') && has('adapter_model.safetensors')) return { files: ADAPTER_FILES.filter(has), entry: '' }
  const ggufs = ggufFiles(l)
  if (ggufs.length === 1) return { files: ggufs, entry: ggufs[0] }
  if (ggufs.length > 1) {
    throw invalidArgument(`${repo} holds ${ggufs.length} GGUF files; name one (hf:${repo}/<file>, or ${repo}:<file> for pull): ${list(ggufs)}`)
  }
  throw new ExpertRuntimeError('INVALID_MODEL', `${repo} has neither config.json with ${SAFETENSORS} (or ${SAFETENSORS_INDEX}) nor a GGUF file`)
}

/** The shard files a `model.safetensors.index.json` names, each one in the listing. */
export function shardsOf(indexJson: unknown, l: Listing, where: string): string[] {
  const map = (indexJson as { weight_map?: unknown } | null)?.weight_map
  if (!map || typeof map !== 'object' || Array.isArray(map)) throw new ExpertRuntimeError('INVALID_MODEL', `${where} has no weight_map`)
  const shards = new Set<string>()
  for (const v of Object.values(map)) {
    if (shards.has(v as string)) continue
    const name = hubPath(v, where)
    if (!l.files.has(name)) throw new ExpertRuntimeError('INVALID_MODEL', `${where} names the shard '${name}', which is not in the repository`)
    shards.add(name)
    if (shards.size > MAX_SHARDS) throw new ExpertRuntimeError('INVALID_MODEL', `${where} names more than ${MAX_SHARDS} shards`)
  }
  return [...shards].sort()
}
