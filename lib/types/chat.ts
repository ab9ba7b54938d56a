// Chat messages, structured-output formats (`responseFormat`) and tool calling (`tools`, `toolChoice`).

/** One turn of a conversation, as the model's chat template reads it. */
export interface ChatMessage {
  /** Who speaks. Other roles are passed to the chat template as they are. */
  role: 'system' | 'user' | 'assistant' | 'tool' | (string & {})
  /** The turn's text. Always plain text: spellings of control tokens in it are not markup. */
  content: string
  /** The calls an assistant turn made (in `session.history` after a `'tool_calls'` answer). */
  toolCalls?: ToolCall[]
  /** For a `role: 'tool'` message: the `id` of the call this is the result of. */
  toolCallId?: string
  /**
   * An assistant turn's thought (`CompletionResult.reasoning`), kept apart from `content`. It
   * reaches the chat template as `reasoning_content`; the template decides what of it the model
   * reads again (Qwen3's drops the thoughts of turns before the last user message).
   */
  reasoning?: string
}

/** A JSON schema (a plain JSON object; `$ref`/`$defs`, `anyOf`, formats… as llguidance reads them). */
export type JsonSchema = { [key: string]: unknown } | boolean

/**
 * What the answer must look like. The constraint masks the tokens the format does not allow
 * before temperature, top-k and top-p; `logprob` stays the model's own.
 */
export type ResponseFormat =
  /** No constraint. */
  | { type: 'text' }
  /** Any JSON object. */
  | { type: 'json_object' }
  | {
      type: 'json_schema'
      /** The schema the answer's JSON must be valid against. */
      schema: JsonSchema
      /** Accepted for OpenAI compatibility, not read. */
      name?: string
      /**
       * What an object that does not say `additionalProperties` allows. Default `true`: no
       * members beyond its `properties` (vLLM's default; what OpenAI's `strict: true`
       * requires). `false`: any other members too, as JSON Schema reads it. An explicit
       * `additionalProperties` is always honoured. The answer always follows the schema.
       */
      strict?: boolean
    }
  | {
      type: 'regex'
      /** The whole answer must match it (llguidance's regex syntax, Rust-like). */
      pattern: string
    }
  | {
      type: 'grammar'
      /** Lark syntax, as llguidance reads it (`%json { … }` and `@name` sub-grammars included). */
      grammar: string
    }

/** A function the model may call (OpenAI's shape). */
export interface Tool {
  /** Always `'function'`. */
  type: 'function'
  /** The function's name, description and parameters. */
  function: {
    /** The name the model calls it by. */
    name: string
    /** What it does, for the model. */
    description?: string
    /** A JSON schema of its arguments (an object schema). */
    parameters?: JsonSchema
    /**
     * As `responseFormat.strict`, for a call forced by `toolChoice` (which always validates
     * against `parameters`): default `true` closes objects that do not say
     * `additionalProperties`. With `'auto'` a call that does not parse comes back as text.
     */
    strict?: boolean
  }
}

/**
 * Whether and which tools the model calls: `'auto'` (it decides), `'none'` (tools are not
 * offered), `'required'` (at least one call) or one named function (exactly that call).
 */
export type ToolChoice =
  | 'auto'
  | 'none'
  | 'required'
  | {
      type: 'function'
      function: {
        /** The tool the answer must call (once). */
        name: string
      }
    }

/** A call the model made; `arguments` is JSON text valid against the tool's `parameters`. */
export interface ToolCall {
  /** Unique within the conversation (`call_…`); a `role: 'tool'` reply names it in `toolCallId`. */
  id: string
  /** Always `'function'`. */
  type: 'function'
  /** What was called, with which arguments. */
  function: {
    /** The tool's name. */
    name: string
    /** The arguments as JSON text (parse it with `JSON.parse`). */
    arguments: string
  }
}

/** A piece of a tool call as it streams (OpenAI's delta shape): the first piece of a call carries `id`, `type` and `function.name`. */
export interface ToolCallDelta {
  /** Which call of the answer this piece belongs to (0 for the first). */
  index: number
  /** The call's id (first piece only). */
  id?: string
  /** `'function'` (first piece only). */
  type?: 'function'
  /** This piece of the call. */
  function: {
    /** The tool's name (first piece only). */
    name?: string
    /** The next piece of the arguments' JSON text (may be `''`). */
    arguments: string
  }
}
