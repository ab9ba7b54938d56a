// Models from the Hugging Face Hub: `fetchModel('org/repo')` returns a local path the engine
// loads, downloading into the cache what is not there yet (docs/models.md).
//
// Design notes:
// - One revision is resolved to its commit by the API (`/api/models/{repo}/revision/{rev}`); every
//   file is then fetched from `resolve/{commit}/…`, so the listing and the bytes agree even when
//   the branch moves meanwhile, and cached files are keyed by commit (cache.ts).
// - The listing is the only thing that says which files exist; file names from it (and from a
//   shard index) pass the same checks as a user's (ref.ts) before they touch the filesystem.
// - Offline (option or environment) never opens a socket. Online, an unreachable Hub falls back
//   to what the cache holds for that revision; a commit id that the cache holds needs no Hub.
// - Files are fetched one at a time (download.ts); a revision's ref and a whole-repo manifest are
//   written only after all of its files are verified and in place.
import { readFile, stat } from 'node:fs/promises'
import { setTimeout as delay } from 'node:timers/promises'
import { onlyKeys, optionKeys } from '../checks'
import { ExpertRuntimeError, invalidArgument } from '../errors'
import type { DownloadProgress, HubOptions } from '../types'
import { RepoCache } from './cache'
import { downloadFile } from './download'
import { MAX_JSON_BYTES, downloadFailed, getJson, isTransient } from './http'
import { ggufFiles, parseListing, selectFiles, shardsOf, type Listing, type RepoFile, type Want } from './listing'
import { COMMIT, checkRevision, describeRef, parseHfRef, safeRelativePath, type HubRef } from './ref'
import { hubSettings, offlineByEnv, type HubSettings } from './settings'

export { parseHfRef, parsePullSpec, describeRef, type HubRef } from './ref'
export { defaultCacheDir, DEFAULT_ENDPOINT } from './settings'

const HUB_REF_KEYS = optionKeys<HubRef>({ repo: true, revision: true, file: true })

/** Attempts at the file list before falling back to the cache. */
const LISTING_ATTEMPTS = 3

/**
 * The local path of `ref` (the text after `hf:`, or a parsed `HubRef`): a model directory, or
 * one file. Downloads what the cache lacks. Errors: `INVALID_ARGUMENT` (a bad ref or option, a
 * repository with several GGUF files and none named), `MODEL_NOT_FOUND` (no such repository,
 * revision or file; not in the cache when offline), `ACCESS_DENIED`, `DOWNLOAD_FAILED`,
 * `CHECKSUM_MISMATCH`, `INVALID_MODEL` (a repository without usable weights, or one naming
 * unsafe paths). `want: 'adapter'` (`Runtime.loadExpert`) accepts only a PEFT adapter
 * repository, and fails with `INVALID_ADAPTER` before downloading anything else.
 */
export async function fetchModel(
  ref: string | HubRef,
  options?: HubOptions,
  onProgress?: (p: DownloadProgress) => void,
  want: Want = 'any',
): Promise<string> {
  if (onProgress !== undefined && typeof onProgress !== 'function') throw invalidArgument('onDownloadProgress must be a function')
  const settings = hubSettings(options)
  const r = typeof ref === 'string' ? parseHfRef(ref) : checkRef(ref)
  const cache = new RepoCache(settings.cacheDir, r.repo)
  try {
    return await resolveRef(r, cache, settings, new Tally(onProgress), want)
  } catch (e) {
    // A filesystem error in the cache (EACCES, ENOSPC, …); anything else (an exception from
    // onProgress) passes unchanged.
    if (!(e instanceof Error) || e instanceof ExpertRuntimeError || !('syscall' in e)) throw e
    throw downloadFailed(`${describeRef(r)}: ${e.message}`, e)
  }
}

function checkRef(ref: HubRef): HubRef {
  if (!ref || typeof ref !== 'object') throw invalidArgument('a Hub ref must be a string or { repo, revision, file }')
  onlyKeys(ref, HUB_REF_KEYS, 'a Hub ref', 'field')
  const parsed = parseHfRef(String(ref.repo))
  if (parsed.file !== undefined || parsed.revision !== 'main') throw invalidArgument(`'${String(ref.repo).slice(0, 120)}' is not org/repo`)
  const file = ref.file === undefined ? undefined : safeRelativePath(ref.file, (why) => invalidArgument(`bad file in Hub ref: ${why}`))
  return { repo: parsed.repo, revision: checkRevision(ref.revision ?? 'main'), file }
}

async function resolveRef(ref: HubRef, cache: RepoCache, settings: HubSettings, tally: Tally, want: Want): Promise<string> {
  if (settings.offline) {
    const hit = cache.lookup(ref)
    if (hit) return hit
    const why = offlineByEnv() ? 'EXPERT_RUNTIME_OFFLINE / HF_HUB_OFFLINE is set' : 'hub.offline is set'
    throw new ExpertRuntimeError('MODEL_NOT_FOUND', `${describeRef(ref)} is not in the cache (${cache.dir}) and offline mode is on (${why}); fetch it once online`)
  }
  // A commit's files never change: when the cache has them, the Hub is not asked.
  if (COMMIT.test(ref.revision)) {
    const hit = cache.lookup(ref)
    if (hit) return hit
  }
  let listing: Listing
  try {
    listing = await getListing(ref, settings)
  } catch (e) {
    // The Hub cannot be reached: what the cache holds for this revision still serves.
    if (e instanceof ExpertRuntimeError && e.code === 'DOWNLOAD_FAILED') {
      const hit = cache.lookup(ref)
      if (hit) return hit
    }
    throw e
  }
  const commit = listing.commit
  const fetch = (names: string[]) => fetchFiles(ref, names.map((n) => listing.files.get(n)!), commit, cache, settings, tally)

  if (ref.file) {
    if (!listing.files.has(ref.file)) {
      const ggufs = ggufFiles(listing)
      const hint = ggufs.length > 0 && /\.gguf$/i.test(ref.file) ? ` (its GGUF files: ${ggufs.slice(0, 20).join(', ')})` : ''
      throw new ExpertRuntimeError('MODEL_NOT_FOUND', `${ref.repo} has no file '${ref.file}' at revision ${ref.revision}${hint}`)
    }
    await fetch([ref.file])
    cache.writeRef(ref.revision, commit)
    return cache.filePath(commit, ref.file)
  }

  const selection = selectFiles(listing, ref.repo, want)
  const files = [...selection.files]
  await fetch(files)
  if (selection.index) {
    await fetch([selection.index])
    const indexPath = cache.filePath(commit, selection.index)
    const where = `${ref.repo}'s ${selection.index}`
    if ((await stat(indexPath)).size > MAX_JSON_BYTES) throw new ExpertRuntimeError('INVALID_MODEL', `${where} is larger than ${MAX_JSON_BYTES} bytes`)
    let json: unknown
    try {
      json = JSON.parse(await readFile(indexPath, 'utf8'))
    } catch (e) {
      throw new ExpertRuntimeError('INVALID_MODEL', `${where} is not JSON`, { cause: e })
    }
    const shards = shardsOf(json, listing, where)
    await fetch(shards)
    files.push(selection.index, ...shards)
  }
  cache.writeManifest(commit, { entry: selection.entry, files })
  cache.writeRef(ref.revision, commit)
  return selection.entry === '' ? cache.snapshotDir(commit) : cache.filePath(commit, selection.entry)
}

/** The revision's commit and file list, retried on transient failures. */
async function getListing(ref: HubRef, settings: HubSettings): Promise<Listing> {
  const url = new URL(`${settings.endpoint}/api/models/${ref.repo}/revision/${encodeURIComponent(ref.revision)}?blobs=true`)
  const what = `repository ${ref.repo} (revision ${ref.revision})`
  for (let n = 1; ; n++) {
    try {
      return parseListing(await getJson(url, settings, what), `the Hub's file list of ${ref.repo}@${ref.revision}`)
    } catch (e) {
      if (!isTransient(e) || n >= LISTING_ATTEMPTS) throw e
      await delay(500 * n)
    }
  }
}

/** The `resolve/` URL of one file at one commit. */
function fileUrl(settings: HubSettings, repo: string, commit: string, file: string): URL {
  return new URL(`${settings.endpoint}/${repo}/resolve/${commit}/${file.split('/').map(encodeURIComponent).join('/')}`)
}

/** Downloads, one at a time, those of `files` the cache lacks (a finished file is trusted: it was verified when written). */
async function fetchFiles(ref: HubRef, files: RepoFile[], commit: string, cache: RepoCache, settings: HubSettings, tally: Tally): Promise<void> {
  const missing = files.filter((f) => !cache.has(commit, f.name, f.size))
  for (const f of missing) tally.expect(f.name, f.size)
  for (const f of missing) {
    await downloadFile(
      {
        url: fileUrl(settings, ref.repo, commit, f.name),
        dest: cache.filePath(commit, f.name),
        what: `${ref.repo}:${f.name}`,
        size: f.size,
        sha256: f.sha256,
      },
      settings,
      (bytes, size) => tally.update(f.name, bytes, size),
    )
    // A download shared with a concurrent call reported its bytes there, not here.
    tally.settle(f.name, (await stat(cache.filePath(commit, f.name))).size)
  }
}

/** Sums per-file progress into one `DownloadProgress` over every file this call fetches. */
class Tally {
  #files = new Map<string, { bytes: number; size?: number }>()

  constructor(private readonly onProgress?: (p: DownloadProgress) => void) {}

  expect(file: string, size?: number): void {
    this.#files.set(file, { bytes: 0, size })
  }

  /** A finished file: reported once more only if its last report fell short. */
  settle(file: string, size: number): void {
    const f = this.#files.get(file)
    if (f && (f.bytes !== size || f.size !== size)) this.update(file, size, size)
  }

  update(file: string, bytes: number, size?: number): void {
    this.#files.set(file, { bytes, size })
    if (!this.onProgress) return
    let loadedBytes = 0
    let totalBytes = 0
    for (const f of this.#files.values()) {
      loadedBytes += f.bytes
      totalBytes += f.size ?? f.bytes
    }
    this.onProgress({ loadedBytes, totalBytes, file })
  }
}
