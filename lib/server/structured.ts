import type { GenerateOptions, ResponseFormat, Tool, ToolCall, ToolChoice } from '../types'
import { badRequest } from './errors'

type Body = Record<string, unknown>

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v)

/**
 * OpenAI's `response_format` as a `ResponseFormat`: `text`, `json_object` and `json_schema`
 * (`{ json_schema: { name, schema, strict } }`), plus `regex` (`pattern`) and `grammar`
 * (`grammar`, Lark) as extensions. The engine checks the schema itself.
 */
function responseFormat(v: unknown): ResponseFormat | undefined {
  if (v === undefined || v === null) return undefined
  if (!isObject(v) || typeof v.type !== 'string') throw badRequest('response_format must be an object with a type', 'response_format')
  switch (v.type) {
    case 'text':
      return undefined
    case 'json_object':
      return { type: 'json_object' }
    case 'json_schema': {
      const js = v.json_schema
      if (!isObject(js) || js.schema === undefined) throw badRequest('response_format.json_schema must be { name, schema, strict? }', 'response_format')
      if (js.strict !== undefined && js.strict !== null && typeof js.strict !== 'boolean') throw badRequest('response_format.json_schema.strict must be a boolean', 'response_format')
      return { type: 'json_schema', schema: js.schema as Record<string, unknown>, ...(typeof js.strict === 'boolean' ? { strict: js.strict } : {}) }
    }
    case 'regex':
      if (typeof v.pattern !== 'string') throw badRequest('response_format.pattern must be a string', 'response_format')
      return { type: 'regex', pattern: v.pattern }
    case 'grammar':
      if (typeof v.grammar !== 'string') throw badRequest('response_format.grammar must be a string (Lark)', 'response_format')
      return { type: 'grammar', grammar: v.grammar }
    default:
      throw badRequest('response_format.type must be text, json_object, json_schema, regex or grammar', 'response_format')
  }
}

function tools(v: unknown): Tool[] | undefined {
  if (v === undefined || v === null) return undefined
  if (!Array.isArray(v)) throw badRequest('tools must be an array', 'tools')
  return v.map((t, i) => {
    if (!isObject(t) || t.type !== 'function' || !isObject(t.function) || typeof t.function.name !== 'string') {
      throw badRequest(`tools[${i}] must be { type: "function", function: { name, description?, parameters? } }`, `tools[${i}]`)
    }
    // The fields the engine reads; others (a client's own annotations) are ignored, as in the
    // rest of the request.
    const f = t.function
    const out: Tool = { type: 'function', function: { name: f.name as string } }
    if (f.description !== undefined) out.function.description = f.description as string
    if (f.parameters !== undefined) out.function.parameters = f.parameters as Tool['function']['parameters']
    if (f.strict !== undefined && f.strict !== null) {
      if (typeof f.strict !== 'boolean') throw badRequest(`tools[${i}].function.strict must be a boolean`, `tools[${i}]`)
      out.function.strict = f.strict
    }
    return out
  })
}

function toolChoice(v: unknown): ToolChoice | undefined {
  if (v === undefined || v === null) return undefined
  if (v === 'auto' || v === 'none' || v === 'required') return v
  if (isObject(v) && v.type === 'function' && isObject(v.function) && typeof v.function.name === 'string') {
    return { type: 'function', function: { name: v.function.name } }
  }
  throw badRequest('tool_choice must be "auto", "none", "required" or { type: "function", function: { name } }', 'tool_choice')
}

/** `response_format`, `tools`, `tool_choice` and `parallel_tool_calls` as `GenerateOptions`. */
export function structuredOptions(body: Body, allowTools: boolean): GenerateOptions {
  const o: GenerateOptions = {}
  const rf = responseFormat(body.response_format)
  if (rf) o.responseFormat = rf
  if (!allowTools) {
    if (body.tools != null) throw badRequest('tools are accepted by /v1/chat/completions only', 'tools')
    return o
  }
  const t = tools(body.tools)
  if (t && t.length > 0) o.tools = t
  const c = toolChoice(body.tool_choice)
  if (c && o.tools) o.toolChoice = c
  else if (c && c !== 'none' && c !== 'auto') throw badRequest('tool_choice needs tools', 'tool_choice')
  const p = body.parallel_tool_calls
  if (p !== undefined && p !== null) {
    if (typeof p !== 'boolean') throw badRequest('parallel_tool_calls must be a boolean', 'parallel_tool_calls')
    o.parallelToolCalls = p
  }
  return o
}

/** An assistant message's `tool_calls`, checked. */
export function toolCalls(v: unknown, i: number): ToolCall[] | undefined {
  if (v === undefined || v === null) return undefined
  if (!Array.isArray(v)) throw badRequest(`messages[${i}].tool_calls must be an array`, `messages[${i}].tool_calls`)
  return v.map((c, j) => {
    const f = isObject(c) ? c.function : undefined
    if (!isObject(c) || typeof c.id !== 'string' || !isObject(f) || typeof f.name !== 'string' || typeof f.arguments !== 'string') {
      throw badRequest(`messages[${i}].tool_calls[${j}] must be { id, type: "function", function: { name, arguments } }`, `messages[${i}].tool_calls`)
    }
    return { id: c.id, type: 'function', function: { name: f.name, arguments: f.arguments } }
  })
}

/**
 * The assistant message of a finished answer (`content` is null when the answer is only tool
 * calls); a thinking model's thought is `reasoning_content` (null when it did not think).
 */
export function assistantMessage(text: string, calls: ToolCall[] | undefined, reasoning?: string): Record<string, unknown> {
  const thought = reasoning === undefined ? {} : { reasoning_content: reasoning || null }
  if (!calls) return { role: 'assistant', content: text, refusal: null, ...thought }
  return { role: 'assistant', content: text.length > 0 ? text : null, refusal: null, ...thought, tool_calls: calls }
}
