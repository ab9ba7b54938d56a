// One file from the Hub into the cache. The bytes go to `<dest>.partial`; a cut connection is
// retried (at most MAX_ATTEMPTS attempts) with `Range: bytes=N-`, appending on 206 and starting
// over on 200. The expected size and sha256 come from the file list or, for LFS files, from the
// Hub's `X-Linked-Size` / `X-Linked-Etag` on its redirect; the bytes are hashed as they are
// written and checked before the partial is renamed to `dest`. A mismatch removes the partial:
// a file in the cache is always a verified one.
//
// Processes sharing a cache download a file one at a time: the one that creates
// `<dest>.partial.lock` (exclusively) downloads, touching the lock as it goes; the others wait
// for the file to appear, reporting the partial's growth as their progress. A lock whose owner
// is gone (a dead process on this host, or no touch for LOCK_STALE_MS) is taken over. Two
// waiters taking over the same dead lock at once can still both download; the sha256 check then
// rejects a mixed file, so the cache stays correct.
import { createHash, type Hash } from 'node:crypto'
import { createReadStream } from 'node:fs'
import { mkdir, open as openFile, readFile, rename, rm, stat, utimes } from 'node:fs/promises'
import { hostname } from 'node:os'
import { dirname } from 'node:path'
import { setTimeout as delay } from 'node:timers/promises'
import { ExpertRuntimeError } from '../errors'
import { MAX_FILE_BYTES, downloadFailed, header, isTransient, networkError, open, parseSha256Etag, parseSize, statusError, transientError } from './http'
import { LOCK_SUFFIX, PARTIAL_SUFFIX } from './ref'
import type { HubSettings } from './settings'

/** Attempts per file before giving up (the partial stays for the next call). */
export const MAX_ATTEMPTS = 5

export interface FileTarget {
  /** The file's `resolve/` URL. */
  url: URL
  /** Its final path in the cache. */
  dest: string
  /** For messages: `org/repo:file`. */
  what: string
  /** From the file list, when it said. */
  size?: number
  sha256?: string
}

/** Bytes of the file on disk so far, and its size once known. May throw: the download stops. */
export type FileProgress = (bytes: number, size: number | undefined) => void

/** Per attempt: whether it moved the download on (a retry after progress does not wait). */
interface Attempt {
  progressed: boolean
}

const inflight = new Map<string, Promise<void>>()

/**
 * Downloads `t` into the cache. Concurrent calls for the same file in this process share one
 * download (the later ones get no byte progress for it).
 */
export function downloadFile(t: FileTarget, settings: HubSettings, onProgress: FileProgress): Promise<void> {
  const running = inflight.get(t.dest)
  if (running) return running
  const p = underLock(t, onProgress, () => withAttempts(t, settings, onProgress)).finally(() => inflight.delete(t.dest))
  inflight.set(t.dest, p)
  return p
}

/** A lock not touched for this long has lost its owner. */
export const LOCK_STALE_MS = 60_000
/** How often the owner touches its lock. */
const LOCK_TOUCH_MS = 5_000
/** How often a waiter looks again. */
const LOCK_POLL_MS = 100

const exists = (p: string) => stat(p).then(
  (s) => s.isFile(),
  () => false,
)

/**
 * Runs `download` holding `t`'s lock, once no other process is downloading the file; returns
 * without it when the file is there by then.
 */
async function underLock(t: FileTarget, onProgress: FileProgress, download: () => Promise<void>): Promise<void> {
  await mkdir(dirname(t.dest), { recursive: true })
  const lock = t.dest + LOCK_SUFFIX
  let shown = 0
  for (;;) {
    if (await exists(t.dest)) return
    const handle = await openFile(lock, 'wx').catch((e: NodeJS.ErrnoException) => {
      if (e.code === 'EEXIST') return undefined
      throw e
    })
    if (handle) {
      try {
        await handle.writeFile(`${process.pid}\n${hostname()}\n`)
      } finally {
        await handle.close()
      }
      const touch = setInterval(() => {
        const now = new Date()
        utimes(lock, now, now).catch(() => {})
      }, LOCK_TOUCH_MS)
      touch.unref()
      try {
        // Published between our look and the lock: nothing to do.
        if (await exists(t.dest)) return
        return await download()
      } finally {
        clearInterval(touch)
        await rm(lock, { force: true })
      }
    }
    if (await abandoned(lock)) {
      await rm(lock, { force: true })
      continue
    }
    const partial = (await stat(t.dest + PARTIAL_SUFFIX).catch(() => undefined))?.size ?? 0
    if (partial > shown) {
      shown = partial
      onProgress(partial, t.size)
    }
    await delay(LOCK_POLL_MS)
  }
}

/** Whether `lock`'s owner is gone: a process of this host that no longer runs, or no touch for LOCK_STALE_MS. */
async function abandoned(lock: string): Promise<boolean> {
  const st = await stat(lock).catch(() => undefined)
  if (!st) return false // released meanwhile: look again
  if (Date.now() - st.mtimeMs > LOCK_STALE_MS) return true
  const [pid, host] = (await readFile(lock, 'utf8').catch(() => '')).split('\n')
  if (host !== hostname() || !/^[1-9][0-9]{0,9}$/.test(pid ?? '')) return false
  try {
    process.kill(Number(pid), 0)
    return false
  } catch (e) {
    // EPERM: it runs, as another user.
    return (e as NodeJS.ErrnoException).code === 'ESRCH'
  }
}

async function withAttempts(t: FileTarget, settings: HubSettings, onProgress: FileProgress): Promise<void> {
  const partial = t.dest + PARTIAL_SUFFIX
  for (let n = 1; ; n++) {
    const attempt: Attempt = { progressed: false }
    try {
      await attemptOnce(t, partial, settings, onProgress, attempt)
      return
    } catch (e) {
      if (!isTransient(e)) throw e
      if (n >= MAX_ATTEMPTS) {
        const kept = (await stat(partial).catch(() => undefined))?.size ?? 0
        const resume = kept > 0 ? `; ${kept} bytes are kept in ${partial} and the next download resumes from there` : ''
        throw downloadFailed(`${t.what}: ${(e as Error).message} (gave up after ${MAX_ATTEMPTS} attempts${resume})`, e)
      }
      // A connection that delivered bytes is retried at once; one that did not, after a backoff.
      if (!attempt.progressed) await delay(Math.min(250 * 2 ** (n - 1), 4000))
    }
  }
}

const mismatch = (message: string) => new ExpertRuntimeError('CHECKSUM_MISMATCH', `${message}; the download was discarded`)

/** `a` and `b` agree where both are known; the known one. */
function agree<T>(a: T | undefined, b: T | undefined, what: string, t: FileTarget): T | undefined {
  if (a !== undefined && b !== undefined && a !== b) throw mismatch(`${t.what}: the Hub announced ${what} ${String(a)} and ${String(b)}`)
  return a ?? b
}

async function hashFile(path: string, bytes: number, hash: Hash): Promise<void> {
  if (bytes === 0) return
  for await (const chunk of createReadStream(path, { start: 0, end: bytes - 1 })) hash.update(chunk as Buffer)
}

async function attemptOnce(t: FileTarget, partial: string, settings: HubSettings, onProgress: FileProgress, attempt: Attempt): Promise<void> {
  try {
    await fetchInto(t, partial, settings, onProgress, attempt)
  } catch (e) {
    // A file that is not what the Hub announced is never kept, not even as a partial.
    if (e instanceof ExpertRuntimeError && e.code === 'CHECKSUM_MISMATCH') await rm(partial, { force: true })
    throw e
  }
}

async function fetchInto(t: FileTarget, partial: string, settings: HubSettings, onProgress: FileProgress, attempt: Attempt): Promise<void> {
  const st = await stat(partial).catch(() => undefined)
  let offset = st?.isFile() ? st.size : 0
  if (st && !st.isFile()) throw downloadFailed(`${partial} is in the way (not a file)`)
  if (t.size !== undefined && offset > t.size) {
    await rm(partial, { force: true })
    offset = 0
  }
  // A previous run may have stopped between the last byte and the rename.
  if (offset > 0 && offset === t.size && t.sha256) return publishComplete(t, partial, offset, t.sha256, attempt)
  // The kept bytes are hashed before the request: a long re-hash while a response waits unread
  // would look like a stalled connection.
  const resumedHash = createHash('sha256')
  await hashFile(partial, offset, resumedHash)

  const opened = await open(t.url, settings, offset > 0 ? { range: `bytes=${offset}-` } : {})
  const { res } = opened
  try {
    const status = res.statusCode ?? 0
    // X-Linked-* come from the Hub's own response (the redirect to the CDN), never from the CDN.
    let sha256 = t.sha256
    let size = t.size
    for (const h of opened.hops) {
      sha256 = agree(sha256, parseSha256Etag(header(h, 'x-linked-etag')), 'sha256', t)
      size = agree(size, parseSize(header(h, 'x-linked-size'), 'X-Linked-Size'), 'size', t)
      if (sha256 !== undefined || size !== undefined) break
    }
    if (status === 416 && offset > 0) {
      // Nothing left past the partial's end: it is complete, or it is wrong.
      if (offset === size && sha256) return publishComplete(t, partial, offset, sha256, attempt)
      await rm(partial, { force: true })
      attempt.progressed = true
      throw transientError(`${t.what}: the server would not resume at byte ${offset}; starting over`)
    }
    if (status !== 200 && status !== 206) throw statusError(status, res.headers, t.what, settings)

    let start = 0
    if (status === 206 && offset > 0) {
      const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(header(res.headers, 'content-range')?.trim() ?? '')
      if (!m || Number(m[1]) !== offset) {
        await rm(partial, { force: true })
        attempt.progressed = true
        throw transientError(`${t.what}: the server resumed at another byte than ${offset}; starting over`)
      }
      if (m[3] !== '*') size = agree(size, parseSize(m[3], 'Content-Range total'), 'size', t)
      start = offset
    } else if (status === 200) {
      size = agree(size, parseSize(header(res.headers, 'content-length'), 'Content-Length'), 'size', t)
    } else {
      throw downloadFailed(`${t.what}: the server sent a partial answer to a whole-file request`)
    }
    const limit = size ?? MAX_FILE_BYTES

    const hash = start > 0 ? resumedHash : createHash('sha256')
    const fh = await openFile(partial, start > 0 ? 'a' : 'w')
    let written = start
    // The caller's exception stops the download as it is (the partial is kept) and is rethrown as is.
    let callbackError: { error: unknown } | undefined
    const diskError = (e: Error) => {
      throw downloadFailed(`cannot write ${partial}: ${e.message}`, e)
    }
    const writeAll = async (chunk: Buffer) => {
      for (let off = 0; off < chunk.length; ) off += (await fh.write(chunk, off, chunk.length - off).catch(diskError)).bytesWritten
    }
    const report = () => {
      try {
        onProgress(written, size)
      } catch (error) {
        callbackError = { error }
      }
      return !callbackError
    }
    try {
      if (report()) {
        for await (const chunk of res as AsyncIterable<Buffer>) {
          if (written + chunk.length > limit) throw mismatch(`${t.what}: the server sent more than ${limit} bytes`)
          await writeAll(chunk)
          hash.update(chunk)
          written += chunk.length
          attempt.progressed = true
          if (!report()) break
        }
      }
      if (!callbackError) {
        if (!res.complete) throw transientError(`${t.what}: the connection closed after ${written} bytes`)
        await fh.sync().catch(diskError)
      }
    } catch (e) {
      throw e instanceof ExpertRuntimeError ? e : networkError(opened.url, opened.cutReason() ?? e)
    } finally {
      await fh.close()
    }
    if (callbackError) throw callbackError.error
    if (size !== undefined && written !== size) throw mismatch(`${t.what}: ${written} bytes arrived, the Hub announced ${size}`)
    const got = hash.digest('hex')
    if (sha256 && got !== sha256) throw mismatch(`${t.what}: sha256 ${got} differs from the Hub's ${sha256}`)
    await rename(partial, t.dest)
  } finally {
    res.destroy()
  }
}

/** A partial already `size` bytes long: published if its sha256 matches, else started over. */
async function publishComplete(t: FileTarget, partial: string, size: number, sha256: string, attempt: Attempt): Promise<void> {
  const hash = createHash('sha256')
  await hashFile(partial, size, hash)
  if (hash.digest('hex') !== sha256) {
    await rm(partial, { force: true })
    attempt.progressed = true
    throw transientError(`${t.what}: the kept partial download does not match; starting over`)
  }
  await rename(partial, t.dest)
}
