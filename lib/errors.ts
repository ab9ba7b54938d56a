/** Stable error codes. Match on `err.code`, never on the message. */
export type ErrorCode =
  | 'MODEL_NOT_FOUND'
  | 'INVALID_MODEL'
  | 'UNSUPPORTED_ARCHITECTURE'
  | 'CONTEXT_OVERFLOW'
  | 'INVALID_ARGUMENT'
  | 'SESSION_BUSY'
  | 'DISPOSED'
  | 'NO_CUDA_DEVICE'
  | 'NO_NATIVE_BINARY'
  | 'EXPERT_NOT_FOUND'
  | 'UNSUPPORTED_ADAPTER'
  | 'INVALID_ADAPTER'
  | 'KV_CACHE_EXHAUSTED'
  | 'OUT_OF_MEMORY'
  /** A file could not be written or read for a reason of the file system (a full disk, a read-only directory, permissions). */
  | 'IO_ERROR'
  /** A Hub download failed (network, HTTP status, a malformed response); a partial file is kept and resumes. */
  | 'DOWNLOAD_FAILED'
  /** A downloaded file's sha256 or size differs from what the Hub announced; nothing was kept. */
  | 'CHECKSUM_MISMATCH'
  /** The Hub refused access (HTTP 401/403): a private or gated repository, or a bad `HF_TOKEN`. */
  | 'ACCESS_DENIED'
  | 'INTERNAL'

/** Every error this package throws or rejects with. */
export class ExpertRuntimeError extends Error {
  /** What went wrong, as a stable code (see `ErrorCode`). */
  readonly code: ErrorCode
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options)
    this.name = 'ExpertRuntimeError'
    this.code = code
  }
}

const CODED = /^([A-Z_]+): ([\s\S]*)$/

/** Lifts a native error (`"CODE: message"`) into an `ExpertRuntimeError`. */
export function toError(e: unknown): ExpertRuntimeError {
  if (e instanceof ExpertRuntimeError) return e
  const err = e as { message?: string; code?: string } | undefined
  const msg = String(err?.message ?? e)
  const m = CODED.exec(msg)
  if (m) return new ExpertRuntimeError(m[1] as ErrorCode, m[2], { cause: e })
  // napi argument conversion failures (a wrong type for a field).
  if (err?.code === 'InvalidArg' || err?.code === 'NumberExpected' || err?.code === 'StringExpected' || err?.code === 'ObjectExpected') {
    return new ExpertRuntimeError('INVALID_ARGUMENT', msg, { cause: e })
  }
  return new ExpertRuntimeError('INTERNAL', msg, { cause: e })
}

export function invalidArgument(message: string): ExpertRuntimeError {
  return new ExpertRuntimeError('INVALID_ARGUMENT', message)
}

export function disposedError(what: string): ExpertRuntimeError {
  return new ExpertRuntimeError('DISPOSED', `the ${what} was disposed`)
}
