// The AI SDK's prompt (LanguageModelV3Prompt) as the chat messages a Session reads.

import { UnsupportedFunctionalityError } from '@ai-sdk/provider'
import type { LanguageModelV3Prompt, LanguageModelV3ToolResultOutput, LanguageModelV3ToolResultPart } from '@ai-sdk/provider'
import type { ChatMessage, ToolCall } from '../types'

/**
 * One `ChatMessage` per message of the prompt, in order, for the model's chat template:
 * - `system`: its text;
 * - `user`: its text parts joined (a file part, an image say, is refused: the models are text-only);
 * - `assistant`: text parts → `content`, reasoning parts → `reasoning`, tool-call parts →
 *   `toolCalls` (arguments as JSON text); a tool result in an assistant message (a provider-executed
 *   tool, which this provider never makes) follows it as a `tool` message;
 * - `tool`: one `tool` message per result, with its `toolCallId`. Approval responses are for
 *   provider-executed tools only (the AI SDK sends no others), so there are none to read.
 */
export function toChatMessages(prompt: LanguageModelV3Prompt): ChatMessage[] {
  const out: ChatMessage[] = []
  for (const message of prompt) {
    switch (message.role) {
      case 'system':
        out.push({ role: 'system', content: message.content })
        break
      case 'user': {
        let content = ''
        for (const part of message.content) {
          if (part.type === 'text') content += part.text
          else throw unsupportedFile(part.mediaType)
        }
        out.push({ role: 'user', content })
        break
      }
      case 'assistant': {
        let content = ''
        let reasoning = ''
        const toolCalls: ToolCall[] = []
        const results: ChatMessage[] = []
        for (const part of message.content) {
          switch (part.type) {
            case 'text':
              content += part.text
              break
            case 'reasoning':
              reasoning += part.text
              break
            case 'tool-call':
              toolCalls.push({ id: part.toolCallId, type: 'function', function: { name: part.toolName, arguments: argumentsText(part.input) } })
              break
            case 'tool-result':
              results.push(toolMessage(part))
              break
            case 'file':
              throw unsupportedFile(part.mediaType)
          }
        }
        out.push({ role: 'assistant', content, ...(reasoning ? { reasoning } : {}), ...(toolCalls.length > 0 ? { toolCalls } : {}) })
        out.push(...results)
        break
      }
      case 'tool':
        for (const part of message.content) if (part.type === 'tool-result') out.push(toolMessage(part))
        break
    }
  }
  return out
}

/**
 * A call's input as JSON text. It is the parsed object, except for a call whose input did not
 * parse (the AI SDK then keeps the model's text): that text is used as it is when it is JSON.
 */
function argumentsText(input: unknown): string {
  if (typeof input === 'string') {
    try {
      JSON.parse(input)
      return input
    } catch {
      /* not JSON: written as a JSON string below */
    }
  }
  return JSON.stringify(input ?? {})
}

function toolMessage(part: LanguageModelV3ToolResultPart): ChatMessage {
  return { role: 'tool', content: toolOutputText(part.output, part.toolName), toolCallId: part.toolCallId }
}

/** A tool's output as the text the model reads: text as it is, JSON as JSON text. */
function toolOutputText(output: LanguageModelV3ToolResultOutput, toolName: string): string {
  switch (output.type) {
    case 'text':
    case 'error-text':
      return output.value
    case 'json':
    case 'error-json':
      return JSON.stringify(output.value)
    case 'execution-denied':
      return output.reason ? `Tool execution denied: ${output.reason}` : 'Tool execution denied.'
    case 'content':
      return output.value
        .map((part) => {
          if (part.type === 'text') return part.text
          throw new UnsupportedFunctionalityError({
            functionality: `tool output part '${part.type}'`,
            message: `expert-runtime: the output of tool '${toolName}' has a '${part.type}' part; the models are text-only, so tool outputs must be text or JSON`,
          })
        })
        .join('')
  }
}

function unsupportedFile(mediaType: string): UnsupportedFunctionalityError {
  return new UnsupportedFunctionalityError({
    functionality: 'file parts',
    message: `expert-runtime: the prompt has a file part (${mediaType}); the models are text-only, so prompts must be text`,
  })
}
