// The download cache's layout (docs/models.md):
//
//   <cacheDir>/<org>/<repo>/
//     refs/<revision>                 the commit a branch or tag resolved to when its files were last complete
//     snapshots/<commit>/<file>       the files, each published by an atomic rename when verified
//     snapshots/<commit>/<file>.partial   a download under way (or cut), resumed by the next one
//     manifests/<commit>.json         which files make up the whole-repo model, and its entry path
//
// Files are keyed by commit, so a finished file never changes; a revision's ref is updated only
// once everything it names is in place. Every path is checked to stay under the repo's directory.
import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs'
import { resolve, sep } from 'node:path'
import { ExpertRuntimeError } from '../errors'
import { COMMIT, hubPath, type HubRef } from './ref'

/** What a whole-repository pull consists of (`manifests/<commit>.json`). */
export interface Manifest {
  /** The path to load, relative to the snapshot: `''` for the directory, else one GGUF file. */
  entry: string
  files: string[]
}

const MAX_MANIFEST_BYTES = 1024 * 1024

export class RepoCache {
  readonly dir: string

  constructor(
    readonly root: string,
    readonly repo: string,
  ) {
    // `repo` is a checked `org/name` (ref.ts): two plain components.
    this.dir = resolve(root, ...repo.split('/'))
  }

  /** `rel` (already checked by `hubPath`/ref parsing) under the repo directory, verified to stay there. */
  #under(...parts: string[]): string {
    const p = resolve(this.dir, ...parts)
    if (!p.startsWith(this.dir + sep)) throw new ExpertRuntimeError('INVALID_ARGUMENT', `cache path escapes ${this.dir}`)
    return p
  }

  snapshotDir(commit: string): string {
    if (!COMMIT.test(commit)) throw new ExpertRuntimeError('INTERNAL', `not a commit id: ${commit.slice(0, 60)}`)
    return this.#under('snapshots', commit)
  }

  filePath(commit: string, file: string): string {
    return this.#under('snapshots', commit, ...file.split('/'))
  }

  #refPath(revision: string): string {
    // A revision may hold '/' (refs/pr/1): one file name, percent-encoded.
    return this.#under('refs', encodeURIComponent(revision))
  }

  #manifestPath(commit: string): string {
    return this.#under('manifests', `${commit}.json`)
  }

  /** The commit `revision` names: itself when it is a commit id, else the cached ref (if any). */
  commitOf(revision: string): string | undefined {
    if (COMMIT.test(revision)) return revision
    try {
      const text = readFileSync(this.#refPath(revision), 'utf8').trim()
      return COMMIT.test(text) ? text : undefined
    } catch {
      return undefined
    }
  }

  writeRef(revision: string, commit: string): void {
    if (COMMIT.test(revision)) return
    atomicWrite(this.#refPath(revision), commit + '\n')
  }

  readManifest(commit: string): Manifest | undefined {
    const p = this.#manifestPath(commit)
    try {
      if (statSync(p).size > MAX_MANIFEST_BYTES) return undefined
      const m = JSON.parse(readFileSync(p, 'utf8')) as Manifest
      if (typeof m?.entry !== 'string' || !Array.isArray(m.files)) return undefined
      const files = m.files.map((f) => hubPath(f, `the cache's manifest ${p}`))
      const entry = m.entry === '' ? '' : hubPath(m.entry, `the cache's manifest ${p}`)
      return { entry, files }
    } catch (e) {
      if (e instanceof ExpertRuntimeError) throw e
      return undefined
    }
  }

  writeManifest(commit: string, m: Manifest): void {
    atomicWrite(this.#manifestPath(commit), JSON.stringify(m, null, 2) + '\n')
  }

  /** Whether `file` of `commit` is in place (and `size` long, when given). */
  has(commit: string, file: string, size?: number): boolean {
    const st = statSync(this.filePath(commit, file), { throwIfNoEntry: false })
    return !!st && st.isFile() && (size === undefined || st.size === size)
  }

  /**
   * The local path of `ref` if the cache holds it whole (no network): one file of the commit
   * its revision names, or a whole-repo pull's entry with every file of its manifest present.
   */
  lookup(ref: HubRef): string | undefined {
    const commit = this.commitOf(ref.revision)
    if (!commit) return undefined
    if (ref.file) return this.has(commit, ref.file) ? this.filePath(commit, ref.file) : undefined
    const m = this.readManifest(commit)
    if (!m || !m.files.every((f) => this.has(commit, f))) return undefined
    return m.entry === '' ? this.snapshotDir(commit) : this.filePath(commit, m.entry)
  }
}

/** Writes `text` to `p` by way of a temporary file and a rename (readers never see half of it). */
function atomicWrite(p: string, text: string): void {
  mkdirSync(resolve(p, '..'), { recursive: true })
  const tmp = `${p}.${process.pid}.tmp`
  writeFileSync(tmp, text)
  renameSync(tmp, p)
}
