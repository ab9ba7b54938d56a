import type * as N from '../native'

/**
 * Each live `Runtime`'s native handle, for the internal calls that take another runtime (a draft
 * model for speculative decoding) without exposing the handle on the public class.
 * @internal
 */
export const runtimeHandles = new WeakMap<object, N.NativeRuntime>()
