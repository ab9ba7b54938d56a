// LanguageModelV3 over a Runtime: each call is one request on a fresh Session, disposed after it.

import type {
  LanguageModelV3,
  LanguageModelV3CallOptions,
  LanguageModelV3Content,
  LanguageModelV3GenerateResult,
  LanguageModelV3StreamPart,
  LanguageModelV3StreamResult,
} from '@ai-sdk/provider'
import { ExpertRuntimeError } from '../errors'
import type { Runtime } from '../runtime'
import type { GenerationStream, Session } from '../session'
import type { ChatMessage, TokenChunk } from '../types'
import { abortError, throwIfAborted } from './abort'
import type { ExpertRuntimeModelId, Selection } from './model-id'
import { prepareCall, type PreparedCall } from './options'
import { toChatMessages } from './prompt'
import { finishReasonOf, providerMetadataOf, usageOf } from './results'
import { StreamParts } from './stream-parts'

/** One request, started: its session (disposed by whoever finishes the request) and its chunks. */
interface Started {
  session: Session
  stream: GenerationStream
  chunks: AsyncIterator<TokenChunk>
  call: PreparedCall
  messages: ChatMessage[]
}

/** The request as `request.body` reports it (telemetry, debugging): the messages and options sent to the session. */
function requestBody(s: Pick<Started, 'messages' | 'call'>) {
  const { signal: _signal, ...options } = s.call.options
  return { messages: s.messages, options }
}

/**
 * A model of `createExpertRuntime`: the runtime's base model under the experts its id selects.
 * Errors of the engine reach the caller as they are (`ExpertRuntimeError`, with its `code`):
 * `EXPERT_NOT_FOUND` for an expert that is not loaded, `INVALID_ARGUMENT` for a bad setting,
 * `CONTEXT_OVERFLOW` for a prompt longer than the context. An aborted `abortSignal` stops the
 * request within one engine step and rejects (or errors the stream) with the signal's reason.
 */
export class ExpertRuntimeLanguageModel implements LanguageModelV3 {
  readonly specificationVersion = 'v3'
  readonly provider = 'expert-runtime'
  readonly modelId: ExpertRuntimeModelId
  /** No URL is read by the model: the AI SDK downloads what a prompt links to (and file parts are refused). */
  readonly supportedUrls: Record<string, RegExp[]> = {}
  // Plain (TypeScript-private) fields, not `#private` ones: the AI SDK 7 wraps v3 models in
  // Proxies that call methods with the proxy as `this`, where `#private` fields cannot be read.
  private readonly runtime: () => Promise<Runtime>
  private readonly selection: Selection

  /** @internal */
  constructor(modelId: ExpertRuntimeModelId, selection: Selection, runtime: () => Promise<Runtime>) {
    this.modelId = modelId
    this.selection = selection
    this.runtime = runtime
  }

  /** Starts the request: a fresh session generating the prompt's answer. */
  private async start(options: LanguageModelV3CallOptions): Promise<Started> {
    const messages = toChatMessages(options.prompt)
    const call = prepareCall(options, this.selection)
    const rt = await this.runtime()
    throwIfAborted(options.abortSignal)
    const session = rt.createSession()
    const stream = session.generate(messages, call.options)
    return { session, stream, chunks: stream[Symbol.asyncIterator](), call, messages }
  }

  async doGenerate(options: LanguageModelV3CallOptions): Promise<LanguageModelV3GenerateResult> {
    const started = await this.start(options)
    const { session, stream, chunks, call } = started
    const timestamp = new Date()
    // The thought as the chunks wrote it, in case the summary lacks it.
    let reasoning = ''
    try {
      for (let r = await chunks.next(); !r.done; r = await chunks.next()) if (r.value.reasoning) reasoning += r.value.reasoning
    } finally {
      session.dispose()
    }
    throwIfAborted(options.abortSignal)
    const result = stream.result
    if (!result) throw new ExpertRuntimeError('INTERNAL', 'the stream ended without a summary')
    const content: LanguageModelV3Content[] = []
    const thought = result.reasoning || reasoning
    if (thought) content.push({ type: 'reasoning', text: thought })
    if (result.text) content.push({ type: 'text', text: result.text })
    for (const c of result.toolCalls ?? []) content.push({ type: 'tool-call', toolCallId: c.id, toolName: c.function.name, input: c.function.arguments })
    return {
      content,
      finishReason: finishReasonOf(result.finishReason),
      usage: usageOf(result.usage),
      providerMetadata: providerMetadataOf(result),
      request: { body: requestBody(started) },
      response: { modelId: this.modelId, timestamp },
      warnings: call.warnings,
    }
  }

  /**
   * Resolves once the first token is out (or the request has failed, which then rejects, as an
   * HTTP provider's does on an error status): the stream then carries the rest.
   */
  async doStream(options: LanguageModelV3CallOptions): Promise<LanguageModelV3StreamResult> {
    const started = await this.start(options)
    const { session, stream, chunks, call } = started
    const signal = options.abortSignal
    const timestamp = new Date()
    let first: IteratorResult<TokenChunk>
    try {
      first = await chunks.next()
      throwIfAborted(signal)
    } catch (e) {
      await chunks.return?.()
      session.dispose()
      throw e
    }
    const parts = new StreamParts()
    let pending: IteratorResult<TokenChunk> | undefined = first
    let finished = false
    /** The request has ended: the session goes. */
    const finish = () => {
      finished = true
      signal?.removeEventListener('abort', stop)
      session.dispose()
    }
    /**
     * Stops the request (the reader let go, or the signal aborted: the AI SDK then stops
     * reading this stream), waits until the engine has ended it, and frees the session.
     */
    async function stop(): Promise<void> {
      if (finished) return
      finished = true
      signal?.removeEventListener('abort', stop)
      try {
        await chunks.return?.()
      } finally {
        session.dispose()
      }
    }
    signal?.addEventListener('abort', stop, { once: true })
    const body = new ReadableStream<LanguageModelV3StreamPart>({
      start: (controller) => {
        controller.enqueue({ type: 'stream-start', warnings: call.warnings })
        controller.enqueue({ type: 'response-metadata', modelId: this.modelId, timestamp })
      },
      // Reads chunks until one writes a part (a token may write none yet): a pull that enqueues
      // nothing is not called again while the reader waits.
      pull: async (controller) => {
        for (;;) {
          let r: IteratorResult<TokenChunk>
          try {
            r = pending ?? (await chunks.next())
            pending = undefined
            // The reader let go meanwhile (`cancel`): the stream is closed, nothing more goes in.
            if (finished && !signal?.aborted) return
          } catch (error) {
            if (finished) return
            // An engine error mid-answer: reported as a part, then the stream finishes ('error').
            finish()
            controller.enqueue({ type: 'error', error })
            for (const p of parts.end(undefined)) controller.enqueue(p)
            controller.close()
            return
          }
          if (r.done || signal?.aborted) {
            finish()
            if (signal?.aborted) controller.error(abortError(signal))
            else {
              for (const p of parts.end(stream.result)) controller.enqueue(p)
              controller.close()
            }
            return
          }
          const out = parts.chunk(r.value)
          if (options.includeRawChunks) controller.enqueue({ type: 'raw', rawValue: r.value })
          for (const p of out) controller.enqueue(p)
          if (out.length > 0 || options.includeRawChunks) return
        }
      },
      cancel: stop,
    })
    return { stream: body, request: { body: requestBody(started) } }
  }
}
