// Aborts as the AI SDK expects them from a provider: rejections with the signal's reason, as `fetch` gives.

/**
 * What an aborted call rejects with: the signal's reason, as `fetch` does (by default a
 * `DOMException` named `AbortError`, which the AI SDK reads as an abort, not a failure).
 */
export function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('This operation was aborted', 'AbortError')
}

/** Throws the abort error when `signal` is aborted. */
export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw abortError(signal)
}

/**
 * `work`, or a rejection with the abort error as soon as `signal` aborts (for calls the engine
 * cannot stop half-way, such as an embedding: its result is then dropped).
 */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return work
  if (signal.aborted) {
    work.catch(() => {})
    return Promise.reject(abortError(signal))
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      work.catch(() => {})
      reject(abortError(signal))
    }
    signal.addEventListener('abort', onAbort, { once: true })
    work.then(
      (v) => {
        signal.removeEventListener('abort', onAbort)
        resolve(v)
      },
      (e) => {
        signal.removeEventListener('abort', onAbort)
        reject(e)
      },
    )
  })
}
