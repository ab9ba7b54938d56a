// GET requests to the Hub and wherever it redirects (its LFS files live on a CDN host), on
// node:http / node:https. Redirects are followed up to a cap, the token goes to the endpoint's
// origin only, a silent socket is cut after `timeoutMs`, and every failure becomes an
// `ExpertRuntimeError`: `transient` ones (a reset connection, a stall, 5xx, 429) may be retried.
import * as http from 'node:http'
import * as https from 'node:https'
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http'
import { ExpertRuntimeError } from '../errors'
import { clip } from './ref'
import type { HubSettings } from './settings'

export const MAX_REDIRECTS = 8
/** Largest API (JSON) response read. */
export const MAX_JSON_BYTES = 16 * 1024 * 1024
/** Larger than any model file (1 TiB): a bigger size is a broken or hostile server. */
export const MAX_FILE_BYTES = 2 ** 40
/** A whole API response must arrive within this (a trickling server cannot hold a load forever). */
const JSON_DEADLINE_MS = 120_000

const USER_AGENT = `expert-runtime (node ${process.version})`

const TRANSIENT = new WeakSet<Error>()
/** Connection-level failures a retry may cure. Refused and unresolvable hosts are not among them. */
const TRANSIENT_CODES = new Set(['ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ECONNABORTED', 'ERR_STREAM_PREMATURE_CLOSE'])

/** A `DOWNLOAD_FAILED` error a retry may cure. */
export function transientError(message: string, cause?: unknown): ExpertRuntimeError {
  const e = new ExpertRuntimeError('DOWNLOAD_FAILED', message, { cause })
  TRANSIENT.add(e)
  return e
}

export const isTransient = (e: unknown): boolean => e instanceof Error && TRANSIENT.has(e)

export const downloadFailed = (message: string, cause?: unknown) => new ExpertRuntimeError('DOWNLOAD_FAILED', message, { cause })

/** A socket, DNS or parser error as an `ExpertRuntimeError`. */
export function networkError(url: URL, e: unknown): ExpertRuntimeError {
  if (e instanceof ExpertRuntimeError) return e
  const err = e as { code?: string; message?: string }
  const code = err?.code ?? ''
  const why = `${url.host}: ${err?.message ?? String(e)}`
  if (TRANSIENT_CODES.has(code)) return transientError(`connection to ${why}`, e)
  if (code.startsWith('HPE_')) return downloadFailed(`${url.host} sent a malformed HTTP response: ${err?.message ?? code}`, e)
  const hint = code === 'ENOTFOUND' || code === 'ECONNREFUSED' || code === 'EAI_AGAIN' ? ' (offline? EXPERT_RUNTIME_OFFLINE=1 uses only the cache)' : ''
  return downloadFailed(`cannot reach ${why}${hint}`, e)
}

/** A response header as one string (Node joins repeats for most, but not every, header). */
export function header(h: IncomingHttpHeaders, name: string): string | undefined {
  const v = h[name]
  return Array.isArray(v) ? v[0] : v
}

/** A byte count from a header: digits only, at most `MAX_FILE_BYTES`. Anything else throws. */
export function parseSize(v: string | undefined, what: string): number | undefined {
  if (v === undefined) return undefined
  const t = v.trim()
  if (!/^\d{1,16}$/.test(t) || Number(t) > MAX_FILE_BYTES) throw downloadFailed(`the server sent an impossible ${what} '${clip(t)}'`)
  return Number(t)
}

/** A sha256 from an ETag-like header (`"abc…"`, `W/"abc…"`), lowercase; undefined for another kind of tag. */
export function parseSha256Etag(v: string | undefined): string | undefined {
  if (v === undefined) return undefined
  const m = /^(?:W\/)?"?([0-9a-fA-F]{64})"?$/.exec(v.trim())
  return m ? m[1].toLowerCase() : undefined
}

/** Sanitised server text for a message: one line, at most 200 characters. */
function serverText(v: string | undefined): string {
  // eslint-disable-next-line no-control-regex
  return v ? v.replace(/[\u0000-\u001f\u007f-\u009f]+/g, ' ').slice(0, 200) : ''
}

/** The error for a status that is not a success, for `what` (e.g. "repository org/x"). */
export function statusError(status: number, h: IncomingHttpHeaders, what: string, settings: HubSettings): ExpertRuntimeError {
  const hubCode = header(h, 'x-error-code')
  const hubMessage = serverText(header(h, 'x-error-message'))
  const detail = hubMessage ? `: ${hubMessage}` : ''
  const tokenHint = settings.token
    ? 'the token in HF_TOKEN was refused or lacks access to it'
    : 'a private or gated repository needs a token: set HF_TOKEN (and accept a gated model\'s terms on the Hub)'
  if (status === 404 || (status === 401 && hubCode === 'RepoNotFound')) {
    const maybe = status === 401 ? ` (or it is private: ${tokenHint})` : ''
    return new ExpertRuntimeError('MODEL_NOT_FOUND', `${what} was not found on ${settings.endpoint}${maybe}${detail}`)
  }
  if (status === 401 || status === 403) return new ExpertRuntimeError('ACCESS_DENIED', `${what}: access denied (HTTP ${status}); ${tokenHint}${detail}`)
  if (status === 429 || status >= 500) return transientError(`${what}: the server answered HTTP ${status}${detail}`)
  return downloadFailed(`${what}: unexpected HTTP ${status}${detail}`)
}

export interface Opened {
  /** The final response (not a redirect). */
  res: IncomingMessage
  url: URL
  /** Headers of every response on the way, the redirects first: the Hub's own carry X-Linked-*. */
  hops: IncomingHttpHeaders[]
  /** Why the connection was cut by us (a stall), if it was. */
  cutReason(): Error | undefined
}

function send(url: URL, settings: HubSettings, headers: Record<string, string>): Promise<{ res: IncomingMessage; cutReason(): Error | undefined }> {
  return new Promise((resolveResponse, reject) => {
    const h: Record<string, string> = { 'user-agent': USER_AGENT, 'accept-encoding': 'identity', ...headers }
    // The token is for the Hub alone: a CDN or any other host a redirect names never sees it.
    if (settings.token && url.origin === settings.authOrigin) h.authorization = `Bearer ${settings.token}`
    let cut: Error | undefined
    let req: http.ClientRequest
    try {
      req = (url.protocol === 'https:' ? https : http).request(url, { method: 'GET', headers: h, timeout: settings.timeoutMs })
    } catch (e) {
      reject(downloadFailed(`cannot request ${url.host}: ${(e as Error).message}`, e))
      return
    }
    req.on('timeout', () => {
      cut = Object.assign(new Error(`no data for ${settings.timeoutMs} ms`), { code: 'ETIMEDOUT' })
      req.destroy(cut)
    })
    req.on('error', (e) => reject(networkError(url, e)))
    req.on('response', (res) => resolveResponse({ res, cutReason: () => cut }))
    req.end()
  })
}

/** GET `url`, following redirects (at most `MAX_REDIRECTS`, http/https only). */
export async function open(url: URL, settings: HubSettings, headers: Record<string, string> = {}): Promise<Opened> {
  const hops: IncomingHttpHeaders[] = []
  let current = url
  for (;;) {
    const { res, cutReason } = await send(current, settings, headers)
    const status = res.statusCode ?? 0
    const location = header(res.headers, 'location')
    if (![301, 302, 303, 307, 308].includes(status) || location === undefined) return { res, url: current, hops: [...hops, res.headers], cutReason }
    // A redirect's body is never read: dropping the connection is cheaper than draining a hostile one.
    res.destroy()
    hops.push(res.headers)
    if (hops.length > MAX_REDIRECTS) throw downloadFailed(`more than ${MAX_REDIRECTS} redirects from ${url.host}${clip(url.pathname)}`)
    let next: URL
    try {
      next = new URL(location, current)
    } catch {
      throw downloadFailed(`${current.host} redirected to a malformed location '${clip(location)}'`)
    }
    if (next.protocol !== 'http:' && next.protocol !== 'https:') throw downloadFailed(`${current.host} redirected to a ${next.protocol} URL`)
    if (next.username || next.password) throw downloadFailed(`${current.host} redirected to a URL with credentials`)
    current = next
  }
}

/** GET a JSON document of at most `MAX_JSON_BYTES`, whole within `JSON_DEADLINE_MS`. */
export async function getJson(url: URL, settings: HubSettings, what: string): Promise<unknown> {
  const { res, url: last, cutReason } = await open(url, settings, { accept: 'application/json' })
  const status = res.statusCode ?? 0
  if (status !== 200) {
    res.destroy()
    throw statusError(status, res.headers, what, settings)
  }
  const declared = parseSize(header(res.headers, 'content-length'), 'Content-Length')
  if (declared !== undefined && declared > MAX_JSON_BYTES) {
    res.destroy()
    throw downloadFailed(`${what}: the listing is larger than ${MAX_JSON_BYTES} bytes`)
  }
  const deadline = setTimeout(() => res.destroy(Object.assign(new Error(`not complete within ${JSON_DEADLINE_MS} ms`), { code: 'ETIMEDOUT' })), JSON_DEADLINE_MS)
  const chunks: Buffer[] = []
  let size = 0
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      size += chunk.length
      if (size > MAX_JSON_BYTES) throw downloadFailed(`${what}: the listing is larger than ${MAX_JSON_BYTES} bytes`)
      chunks.push(chunk)
    }
    if (!res.complete) throw transientError(`${what}: the connection to ${last.host} closed early`)
  } catch (e) {
    throw e instanceof ExpertRuntimeError ? e : networkError(last, cutReason() ?? e)
  } finally {
    clearTimeout(deadline)
    res.destroy()
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8'))
  } catch (e) {
    throw downloadFailed(`${what}: ${last.host} did not answer JSON`, e)
  }
}
