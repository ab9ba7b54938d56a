import type { IncomingMessage } from 'node:http'
import { HttpError, badRequest } from './errors'

/**
 * Reads a JSON request body of at most `maxBytes` (413 beyond, without reading the rest) within
 * `timeoutMs` of the call (408 after, `0`: no limit), strictly UTF-8 (400 otherwise), parsed as
 * a JSON object (400 otherwise). The time limit is on the whole body, not between its chunks:
 * a client trickling a byte at a time cannot hold the request open either. The handler bounds
 * the read itself because it may be mounted in a server whose own timeouts are off.
 */
export async function readJson(req: IncomingMessage, maxBytes: number, timeoutMs = 0): Promise<Record<string, unknown>> {
  const declared = Number(req.headers['content-length'])
  if (Number.isFinite(declared) && declared > maxBytes) throw tooLarge(maxBytes)
  const body = await new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    let timer: NodeJS.Timeout | undefined
    const settle = (err: HttpError | null) => {
      clearTimeout(timer)
      req.off('data', onData)
      req.off('end', onEnd)
      req.off('error', onError)
      req.off('close', onClose)
      if (err) {
        // Stop keeping it, keep draining (the answer closes the connection): destroying the
        // request here would cut the connection before the client reads the answer.
        req.resume()
        reject(err)
      } else resolve(Buffer.concat(chunks))
    }
    const onData = (chunk: Buffer) => {
      size += chunk.length
      if (size > maxBytes) settle(tooLarge(maxBytes))
      else chunks.push(chunk)
    }
    const onEnd = () => settle(null)
    const onError = (e: Error) => settle(badRequest(`the request body could not be read: ${e.message}`))
    // The connection closed before the body ended (the client left, or the server is closing).
    const onClose = () => settle(badRequest('the request body was cut short'))
    req.on('data', onData)
    req.once('end', onEnd)
    req.once('error', onError)
    req.once('close', onClose)
    if (timeoutMs > 0) timer = setTimeout(() => settle(timedOut(timeoutMs)), timeoutMs)
  })
  let text: string
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body)
  } catch {
    throw badRequest('the request body is not valid UTF-8')
  }
  let v: unknown
  try {
    v = JSON.parse(text)
  } catch (e) {
    throw badRequest(`the request body is not valid JSON: ${(e as Error).message}`)
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw badRequest('the request body must be a JSON object')
  return v as Record<string, unknown>
}

const tooLarge = (max: number) => new HttpError(413, `the request body is larger than ${max} bytes`, 'invalid_request_error', null, 'request_too_large')

const timedOut = (ms: number) =>
  new HttpError(408, `the request body did not arrive within ${ms} ms (bodyTimeoutMs)`, 'invalid_request_error', null, 'request_timeout')
