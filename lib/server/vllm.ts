// Endpoints as vLLM spells them, so that what drives vLLM servers (the inference gateway's
// LoRA sidecar, Ray Serve's OpenAI ingress, tokenizer-aware routers) drives ours:
//
//   POST /v1/load_lora_adapter   {lora_name, lora_path}  loads an expert from `expertsDir`
//   POST /v1/unload_lora_adapter {lora_name}             unloads it
//   POST /tokenize    {prompt, add_special_tokens?, return_token_strs?}
//                     or {messages, add_generation_prompt?, return_token_strs?}
//                     → {count, max_model_len, tokens, token_strs}
//   POST /detokenize  {tokens}  → {prompt}
//
// `lora_path` is held to `POST /v1/experts`'s rules: inside `expertsDir` (a name, a relative
// path or an absolute one), symlinks resolved, never outside it.
import { realpath, stat } from 'node:fs/promises'
import type { ServerResponse } from 'node:http'
import { isAbsolute, join, resolve, sep } from 'node:path'
import { HttpError, badRequest, notFound } from './errors'
import type { Context } from './context'
import { chatMessages } from './chat'

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/

/** `lora_path`, checked: a directory inside `expertsDir` once every symlink is resolved. */
async function loraPath(expertsDir: string, p: unknown): Promise<string> {
  if (typeof p !== 'string' || p.length === 0 || p.length > 4096 || p.includes('\0')) {
    throw badRequest('lora_path must be the path of an adapter directory in the experts directory', 'lora_path')
  }
  const dir = resolve(expertsDir)
  const root = await realpath(expertsDir)
  const asked = isAbsolute(p) ? resolve(p) : resolve(join(root, p))
  // Outside before any look at the file system: whether such a path exists is not told.
  const inside = (x: string, r: string) => x.startsWith(r + sep)
  const forbidden = () => new HttpError(403, `'${p}' is outside the experts directory`, 'invalid_request_error', 'lora_path', 'forbidden')
  if (!inside(asked, root) && !inside(asked, dir)) throw forbidden()
  let real: string
  try {
    real = await realpath(asked)
  } catch {
    throw notFound(`no adapter directory at '${p}'`, 'expert_not_found')
  }
  if (!inside(real, root)) throw forbidden()
  if (!(await stat(real)).isDirectory()) throw notFound(`'${p}' is not a directory`, 'expert_not_found')
  return real
}

function loraName(v: unknown): string {
  if (typeof v !== 'string' || !NAME.test(v)) throw badRequest('lora_name must be a name of letters, digits, . _ - (at most 128)', 'lora_name')
  return v
}

function text(ctx: Context, res: ServerResponse, body: string): void {
  res.writeHead(200, ctx.headers({ 'content-type': 'text/plain; charset=utf-8', 'content-length': String(Buffer.byteLength(body)) }))
  res.end(body)
}

/** `POST /v1/load_lora_adapter`. */
export async function loadLoraAdapter(ctx: Context, expertsDir: string, body: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const name = loraName(body.lora_name)
  const path = await loraPath(expertsDir, body.lora_path)
  if (ctx.rt.experts.some((e) => e.name === name)) {
    throw badRequest(`The lora adapter '${name}' has already been loaded.`, 'lora_name', 'expert_exists')
  }
  await ctx.rt.loadExpert(path, { name })
  text(ctx, res, `Success: LoRA adapter '${name}' added successfully.`)
}

/** `POST /v1/unload_lora_adapter`. */
export async function unloadLoraAdapter(ctx: Context, body: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const name = loraName(body.lora_name)
  const e = ctx.rt.experts.find((x) => x.name === name)
  if (!e) throw notFound(`The lora adapter '${name}' cannot be found.`, 'model_not_found')
  await e.unload()
  text(ctx, res, `Success: LoRA adapter '${name}' removed successfully.`)
}

function flag(body: Record<string, unknown>, key: string, dflt: boolean): boolean {
  const v = body[key]
  if (v === undefined || v === null) return dflt
  if (typeof v !== 'boolean') throw badRequest(`${key} must be a boolean`, key)
  return v
}

/** `POST /tokenize`: a prompt, or messages rendered with the chat template as a request would be. */
export async function tokenize(ctx: Context, body: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (body.model !== undefined && body.model !== null) ctx.select(body.model)
  const strs = flag(body, 'return_token_strs', false)
  let tokens: number[]
  if (body.messages !== undefined) {
    if (body.prompt !== undefined) throw badRequest('give prompt or messages, not both', 'prompt')
    tokens = await ctx.rt.tokenizeChat(chatMessages(body.messages), { addGenerationPrompt: flag(body, 'add_generation_prompt', true) })
  } else {
    if (typeof body.prompt !== 'string') throw badRequest('prompt must be a string (or give messages)', 'prompt')
    tokens = ctx.rt.tokenize(body.prompt, { addSpecialTokens: flag(body, 'add_special_tokens', true) })
  }
  ctx.json(res, 200, {
    count: tokens.length,
    max_model_len: ctx.rt.info.contextLength,
    tokens,
    token_strs: strs ? tokens.map((t) => ctx.rt.detokenize([t])) : null,
  })
}

/** `POST /detokenize`. */
export async function detokenize(ctx: Context, body: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (body.model !== undefined && body.model !== null) ctx.select(body.model)
  const t = body.tokens
  const vocab = ctx.rt.info.vocabSize
  if (!Array.isArray(t)) throw badRequest('tokens must be an array of token ids', 'tokens')
  for (let i = 0; i < t.length; i++) {
    if (!Number.isInteger(t[i]) || t[i] < 0 || t[i] >= vocab) throw badRequest(`tokens[${i}] must be a token id from 0 to ${vocab - 1}`, 'tokens')
  }
  ctx.json(res, 200, { prompt: ctx.rt.detokenize(t as number[]) })
}
