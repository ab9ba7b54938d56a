import type { ServerResponse } from 'node:http'
import type { Runtime } from '../runtime'
import type { GenerationStream } from '../session'
import type { CompletionResult, GenerateInput, GenerateOptions, TokenChunk } from '../types'
import type { Metrics } from './metrics'
import type { Selection } from './models'

/** What an endpoint needs from the server serving it. */
export interface Context {
  rt: Runtime
  baseId: string
  metrics: Metrics
  /** `model` → experts (404 for an unknown one). */
  select(model: unknown): Selection
  /** Registers a running stream (the server cancels it when it closes); returns its removal. */
  track(stream: GenerationStream): () => void
  generate(input: GenerateInput, options: GenerateOptions, res: ServerResponse, onChunk: (c: TokenChunk) => void): Promise<CompletionResult>
  json(res: ServerResponse, status: number, body: unknown, headers?: Record<string, string>): void
  /** `extra` plus the headers every answer carries (CORS), for answers written without `json`. */
  headers(extra?: Record<string, string>): Record<string, string>
}
