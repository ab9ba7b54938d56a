import type { ServerResponse } from 'node:http'
import { badRequest } from './errors'
import type { Context } from './context'

/** `POST /v1/embeddings`: text input (a string or strings); `encoding_format` float or base64. */
export async function embeddings(ctx: Context, body: Record<string, unknown>, res: ServerResponse, model: string): Promise<void> {
  const input = body.input
  const texts = typeof input === 'string' ? [input] : input
  if (!Array.isArray(texts) || texts.length === 0) throw badRequest('input must be a string or a non-empty array of strings', 'input')
  for (let i = 0; i < texts.length; i++) {
    if (typeof texts[i] !== 'string') {
      throw badRequest('input must be text: token-id input is not supported', 'input')
    }
  }
  const format = body.encoding_format ?? 'float'
  if (format !== 'float' && format !== 'base64') throw badRequest("encoding_format must be 'float' or 'base64'", 'encoding_format')
  if (body.dimensions != null) throw badRequest('dimensions is not supported (the vectors are hiddenSize long)', 'dimensions')
  const selection = ctx.select(body.model)
  if (selection === 'auto') throw badRequest("model 'auto' does not apply to embeddings: name the base model or experts", 'model')
  const vectors = await ctx.rt.embed(texts as string[], { experts: selection })
  let tokens = 0
  for (const t of texts as string[]) tokens += ctx.rt.tokenize(t).length
  ctx.json(res, 200, {
    object: 'list',
    model,
    data: vectors.map((v, index) => ({
      object: 'embedding',
      index,
      embedding: format === 'base64' ? Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64') : Array.from(v),
    })),
    usage: { prompt_tokens: tokens, total_tokens: tokens },
  })
}
