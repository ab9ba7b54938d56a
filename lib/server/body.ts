import type { IncomingMessage } from 'node:http'
import { HttpError, badRequest } from './errors'

/**
 * Reads a JSON request body of at most `maxBytes` (413 beyond, without reading the rest),
 * strictly UTF-8 (400 otherwise), parsed as a JSON object (400 otherwise).
 */
export async function readJson(req: IncomingMessage, maxBytes: number): Promise<Record<string, unknown>> {
  const declared = Number(req.headers['content-length'])
  if (Number.isFinite(declared) && declared > maxBytes) throw tooLarge(maxBytes)
  const body = await new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    const onData = (chunk: Buffer) => {
      size += chunk.length
      if (size > maxBytes) {
        // Stop keeping it, keep draining (the answer closes the connection): destroying the
        // request here would cut the connection before the client reads the 413.
        req.off('data', onData)
        req.resume()
        reject(tooLarge(maxBytes))
        return
      }
      chunks.push(chunk)
    }
    req.on('data', onData)
    req.once('end', () => resolve(Buffer.concat(chunks)))
    req.once('error', reject)
    // The connection closed before the body ended (the client left, or the server is closing).
    req.once('close', () => reject(new HttpError(400, 'the request body was cut short', 'invalid_request_error')))
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
