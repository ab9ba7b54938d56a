// `HubOptions` and the environment variables behind their defaults, checked once into the
// settings every request uses. The token never appears in a message.
import { homedir } from 'node:os'
import { join, resolve } from 'node:path'
import { checkInt, onlyKeys, optionKeys, optionsObject } from '../checks'
import { invalidArgument } from '../errors'
import type { HubOptions } from '../types'

export const DEFAULT_ENDPOINT = 'https://huggingface.co'
export const DEFAULT_TIMEOUT_MS = 30_000

export interface HubSettings {
  /** The Hub's base URL, without a trailing `/` (it may carry a path: a mirror under a prefix). */
  endpoint: string
  /** The origin the token is sent to: the endpoint's, and no other. */
  authOrigin: string
  token: string | undefined
  offline: boolean
  cacheDir: string
  timeoutMs: number
}

/**
 * The cache's root: `$EXPERT_RUNTIME_CACHE/hub`, else `~/.cache/expert-runtime/hub` (the
 * directory scripts/assets.mjs keeps its assets in, plus `hub`).
 */
export function defaultCacheDir(): string {
  return join(process.env.EXPERT_RUNTIME_CACHE || join(homedir(), '.cache', 'expert-runtime'), 'hub')
}

/** `1`, `true`, `yes`, `on` (any case), as huggingface_hub reads `HF_HUB_OFFLINE`. */
function envFlag(name: string): boolean {
  return /^(1|true|yes|on)$/i.test((process.env[name] ?? '').trim())
}

/** Offline by the environment (`EXPERT_RUNTIME_OFFLINE` or `HF_HUB_OFFLINE`). */
export const offlineByEnv = () => envFlag('EXPERT_RUNTIME_OFFLINE') || envFlag('HF_HUB_OFFLINE')

const HUB_KEYS = optionKeys<HubOptions>({ cacheDir: true, endpoint: true, token: true, offline: true, timeoutMs: true })

/**
 * The `hub` options checked (keys and types) without reading the environment: `Runtime.load`
 * and `loadExpert` check them for a local path too, where they are not used.
 */
export function checkHubOptions(options: HubOptions | undefined): HubOptions {
  const o = optionsObject(options, 'hub')
  onlyKeys(o, HUB_KEYS, 'hub')
  if (o.cacheDir !== undefined && (typeof o.cacheDir !== 'string' || o.cacheDir.length === 0)) throw invalidArgument('hub.cacheDir must be a non-empty string')
  if (o.endpoint !== undefined && typeof o.endpoint !== 'string') throw invalidArgument('hub.endpoint must be a string')
  if (o.token !== undefined && typeof o.token !== 'string') throw invalidArgument('hub.token must be a string')
  if (o.offline !== undefined && typeof o.offline !== 'boolean') throw invalidArgument('hub.offline must be a boolean')
  // Node's timers hold at most 2^31 - 1 ms; a larger value would fire after 1 ms.
  if (o.timeoutMs !== undefined) checkInt('hub.timeoutMs', o.timeoutMs, 1, 0x7fff_ffff)
  return o
}

export function hubSettings(options: HubOptions | undefined): HubSettings {
  const o = checkHubOptions(options)

  const endpointText = o.endpoint ?? (process.env.HF_ENDPOINT || DEFAULT_ENDPOINT)
  let url: URL
  try {
    url = new URL(endpointText)
  } catch {
    throw invalidArgument(`the Hub endpoint '${endpointText.slice(0, 120)}' (hub.endpoint / HF_ENDPOINT) is not a URL`)
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') throw invalidArgument('the Hub endpoint must be an http: or https: URL')
  if (url.username || url.password) throw invalidArgument('the Hub endpoint must not carry credentials (use HF_TOKEN)')
  if (url.search || url.hash) throw invalidArgument('the Hub endpoint must not carry a query or fragment')

  const token = o.token ?? (process.env.HF_TOKEN || process.env.HUGGING_FACE_HUB_TOKEN || undefined)
  // Visible ASCII only: anything else cannot go in a header (and CR/LF would split it).
  if (token && !/^[\x21-\x7e]+$/.test(token)) throw invalidArgument('the Hub token (hub.token / HF_TOKEN) holds characters an HTTP header cannot carry')

  return {
    endpoint: url.href.replace(/\/+$/, ''),
    authOrigin: url.origin,
    token: token || undefined,
    offline: o.offline ?? offlineByEnv(),
    cacheDir: resolve(o.cacheDir ?? defaultCacheDir()),
    timeoutMs: o.timeoutMs ?? DEFAULT_TIMEOUT_MS,
  }
}
