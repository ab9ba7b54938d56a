// Token chunks as the AI SDK's stream parts: text and reasoning blocks, tool inputs as they
// stream, and the complete tool calls and the finish part at the end.

import type { LanguageModelV3StreamPart } from '@ai-sdk/provider'
import type { CompletionResult, TokenChunk, ToolCallDelta } from '../types'
import { finishReasonOf, providerMetadataOf, usageOf } from './results'

/**
 * Turns one request's chunks into stream parts. Text and reasoning each stream in a block
 * (`*-start`, `*-delta`…, `*-end`); a new block opens when the other kind interrupts one. A tool
 * call streams as `tool-input-start` (its first piece: id and name) and `tool-input-delta`s (its
 * argument text); at the end every open block and input is closed, and each complete call of
 * the summary (`result.toolCalls`: a call cut off by `maxTokens` is not one) follows as a
 * `tool-call` part with its whole input, then `finish`.
 */
export class StreamParts {
  #open: { kind: 'text' | 'reasoning'; id: string } | undefined
  #blocks = 0
  /** Streamed tool calls by `index`: their ids, in the order they started. */
  #calls = new Map<number, string>()

  /** The parts one chunk writes (none for a token that wrote nothing yet). */
  chunk(chunk: TokenChunk): LanguageModelV3StreamPart[] {
    const parts: LanguageModelV3StreamPart[] = []
    if (chunk.reasoning) this.#delta('reasoning', chunk.reasoning, parts)
    if (chunk.text) this.#delta('text', chunk.text, parts)
    for (const d of chunk.toolCallDeltas ?? (chunk.toolCallDelta ? [chunk.toolCallDelta] : [])) this.#toolDelta(d, parts)
    return parts
  }

  #delta(kind: 'text' | 'reasoning', delta: string, parts: LanguageModelV3StreamPart[]): void {
    if (this.#open?.kind !== kind) {
      this.#close(parts)
      this.#open = { kind, id: `${kind}-${this.#blocks++}` }
      parts.push({ type: `${kind}-start`, id: this.#open.id })
    }
    parts.push({ type: `${kind}-delta`, id: this.#open.id, delta })
  }

  #close(parts: LanguageModelV3StreamPart[]): void {
    if (this.#open) parts.push({ type: `${this.#open.kind}-end`, id: this.#open.id })
    this.#open = undefined
  }

  #toolDelta(d: ToolCallDelta, parts: LanguageModelV3StreamPart[]): void {
    let id = this.#calls.get(d.index)
    if (id === undefined) {
      // The first piece of a call names it; a piece of a call never announced has nothing to attach to.
      if (d.id === undefined || d.function.name === undefined) return
      id = d.id
      this.#calls.set(d.index, id)
      parts.push({ type: 'tool-input-start', id, toolName: d.function.name })
    }
    if (d.function.arguments) parts.push({ type: 'tool-input-delta', id, delta: d.function.arguments })
  }

  /** The closing parts, once the stream has ended with `result` (undefined after an error: then `finish` says `error`). */
  end(result: CompletionResult | undefined): LanguageModelV3StreamPart[] {
    const parts: LanguageModelV3StreamPart[] = []
    this.#close(parts)
    for (const id of this.#calls.values()) parts.push({ type: 'tool-input-end', id })
    for (const c of result?.toolCalls ?? []) {
      parts.push({ type: 'tool-call', toolCallId: c.id, toolName: c.function.name, input: c.function.arguments })
    }
    parts.push({
      type: 'finish',
      finishReason: finishReasonOf(result?.finishReason),
      usage: usageOf(result?.usage),
      ...(result ? { providerMetadata: providerMetadataOf(result) } : {}),
    })
    return parts
  }
}
