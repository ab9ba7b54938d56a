// What names a model on the Hub (`org/repo`, a revision, maybe one file), and the checks every
// name passes before it becomes part of a URL or a path in the cache. Names come from users and
// from the network alike (a file list, a shard index), so both go through `safeRelativePath`:
// nothing it accepts can reach outside the directory it is joined to.
import { ExpertRuntimeError, invalidArgument } from '../errors'

/** A model on the Hub. */
export interface HubRef {
  /** `org/name`. */
  repo: string
  /** A branch, tag or commit; `main` when the ref names none. */
  revision: string
  /** One file, repository-relative and `/`-separated; absent for the whole repository. */
  file?: string
}

export const DEFAULT_REVISION = 'main'

/** Longest spec accepted (a repo id, a revision and a file path fit easily). */
const MAX_SPEC_CHARS = 4096
/** Longest repository-relative file path, and longest component of one, in UTF-8 bytes. */
const MAX_PATH_BYTES = 1024
const MAX_COMPONENT_BYTES = 255

/** An org or repository name as the Hub allows them (letters, digits, `_ . -`; no `..`). */
const REPO_PART = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}$/
/** A branch or tag name, or a commit id. */
const REVISION = /^[A-Za-z0-9_][A-Za-z0-9_.+\-/]{0,254}$/
export const COMMIT = /^[0-9a-f]{40}$/

/** The suffix of an unfinished download in the cache; no repository file may end with it. */
export const PARTIAL_SUFFIX = '.partial'

/** The suffix of the lock a process holds while it downloads a file; reserved as well. */
export const LOCK_SUFFIX = '.partial.lock'

function checkRepoPart(part: string, spec: string): void {
  if (!REPO_PART.test(part) || part.includes('..')) {
    throw invalidArgument(`'${clip(spec)}' is not a Hub model: expected org/repo (letters, digits, '_', '.', '-')`)
  }
}

/** A revision as given (already percent-decoded): a branch, tag or commit id. */
export function checkRevision(revision: string): string {
  const bad =
    typeof revision !== 'string' ||
    !REVISION.test(revision) ||
    revision.split('/').some((c) => c === '' || c === '.' || c === '..') ||
    revision.endsWith('.lock')
  if (bad) throw invalidArgument(`'${clip(String(revision))}' is not a valid revision (a branch, tag or commit id)`)
  return revision
}

/**
 * `p` when it is a safe repository-relative path: 1..1024 bytes of `/`-separated components,
 * none empty, `.` or `..`, no backslash, NUL or other control character, no leading `/`, no
 * `:` on Windows, and not ending in `.partial` (the cache's own suffix). `fail` makes the error
 * (the caller knows whether a user or the network sent the name).
 */
export function safeRelativePath(p: unknown, fail: (why: string) => Error): string {
  if (typeof p !== 'string' || p.length === 0) throw fail('an empty file name')
  if (Buffer.byteLength(p) > MAX_PATH_BYTES) throw fail(`a file name longer than ${MAX_PATH_BYTES} bytes`)
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f-\u009f\\]/.test(p)) throw fail(`'${clip(p)}' holds a backslash or a control character`)
  if (process.platform === 'win32' && p.includes(':')) throw fail(`'${clip(p)}' holds ':'`)
  for (const c of p.split('/')) {
    if (c === '' || c === '.' || c === '..') throw fail(`'${clip(p)}' is not a plain relative path (empty, '.' or '..' component)`)
    if (Buffer.byteLength(c) > MAX_COMPONENT_BYTES) throw fail(`'${clip(p)}' has a component longer than ${MAX_COMPONENT_BYTES} bytes`)
  }
  for (const reserved of [PARTIAL_SUFFIX, LOCK_SUFFIX]) {
    if (p.endsWith(reserved)) throw fail(`'${clip(p)}' ends with ${reserved}, which the cache reserves`)
  }
  return p
}

/** A file name a user gave. */
const userPath = (p: string) => safeRelativePath(p, (why) => invalidArgument(`bad file in Hub ref: ${why}`))

/** A file name the Hub sent (a file list, a shard index): a bad one means the repository is unusable. */
export const hubPath = (p: unknown, where: string) =>
  safeRelativePath(p, (why) => new ExpertRuntimeError('INVALID_MODEL', `${where} names an unsafe file (${why}); nothing was written`))

function checkSpec(spec: unknown): string {
  if (typeof spec !== 'string' || spec.length === 0) throw invalidArgument('a Hub ref must be a non-empty string')
  if (spec.length > MAX_SPEC_CHARS) throw invalidArgument(`a Hub ref is at most ${MAX_SPEC_CHARS} characters`)
  return spec
}

/** `org/repo@rev`: the repo id and the revision (percent-decoded, so `refs%2Fpr%2F1` works). */
function repoAndRevision(org: string, nameAtRev: string, spec: string): { repo: string; revision?: string } {
  const at = nameAtRev.indexOf('@')
  const name = at < 0 ? nameAtRev : nameAtRev.slice(0, at)
  checkRepoPart(org, spec)
  checkRepoPart(name, spec)
  if (at < 0) return { repo: `${org}/${name}` }
  let revision: string
  try {
    revision = decodeURIComponent(nameAtRev.slice(at + 1))
  } catch {
    throw invalidArgument(`'${clip(spec)}': the revision is not valid percent-encoding`)
  }
  return { repo: `${org}/${name}`, revision: checkRevision(revision) }
}

/**
 * The part of an `hf:` path after `hf:`: `org/repo`, `org/repo/path/to/file.gguf`, with an
 * optional `@revision` after the repo (`org/repo@v1.0/file.gguf`; a revision holding `/` is
 * written `%2F`).
 */
export function parseHfRef(spec: string): HubRef {
  checkSpec(spec)
  const parts = spec.split('/')
  if (parts.length < 2) throw invalidArgument(`'${clip(spec)}' is not a Hub model: expected hf:org/repo[@revision][/file]`)
  const { repo, revision } = repoAndRevision(parts[0], parts[1], spec)
  const file = parts.length > 2 ? userPath(parts.slice(2).join('/')) : undefined
  return { repo, revision: revision ?? DEFAULT_REVISION, file }
}

/**
 * What `expert-runtime pull` takes: `org/repo[@rev][:file]`, or any `hf:` spelling (with or
 * without the `hf:` prefix). `revision` (from `--revision`) must agree with an `@rev`.
 */
export function parsePullSpec(spec: string, revision?: string): HubRef {
  checkSpec(spec)
  const s = spec.startsWith('hf:') ? spec.slice(3) : spec
  const colon = s.indexOf(':')
  const head = colon < 0 ? [] : s.slice(0, colon).split('/')
  let ref: HubRef
  let named: boolean
  if (head.length === 2) {
    // org/repo[@rev]:file
    const r = repoAndRevision(head[0], head[1], spec)
    ref = { repo: r.repo, revision: r.revision ?? DEFAULT_REVISION, file: userPath(s.slice(colon + 1)) }
    named = r.revision !== undefined
  } else {
    ref = parseHfRef(s)
    named = (s.split('/')[1] ?? '').includes('@')
  }
  if (revision === undefined) return ref
  checkRevision(revision)
  if (named && ref.revision !== revision) throw invalidArgument(`the revision is given twice ('${ref.revision}' and '${revision}')`)
  return { ...ref, revision }
}

/** A ref as text, for messages (`org/repo@rev:file`). */
export function describeRef(ref: HubRef): string {
  return `${ref.repo}${ref.revision === DEFAULT_REVISION ? '' : `@${ref.revision}`}${ref.file ? `:${ref.file}` : ''}`
}

/**
 * At most 120 characters of `s` for a message (a 2 MB name is not echoed whole), control
 * characters shown as `?` (a message may reach a terminal).
 */
export function clip(s: string): string {
  // eslint-disable-next-line no-control-regex
  const t = s.replace(/[\u0000-\u001f\u007f-\u009f]/g, '?')
  return t.length > 120 ? `${t.slice(0, 117)}...` : t
}
