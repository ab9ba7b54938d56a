import { realpath, stat } from 'node:fs/promises'
import type { ServerResponse } from 'node:http'
import { join, sep } from 'node:path'
import type { Expert } from '../expert'
import { HttpError, badRequest, notFound } from './errors'
import type { Context } from './context'

/** An expert as the management endpoints describe it. */
export const describeExpert = (e: Expert) => ({ id: e.name, object: 'expert', kind: e.kind, rank: e.rank, bytes: e.bytes, manifest: e.manifest })

/**
 * `expertsDir/name`, checked: a plain name (no separators, not `.` or `..`), and the real
 * path (symlinks resolved) inside the real `expertsDir`.
 */
export async function expertPath(expertsDir: string, name: unknown): Promise<string> {
  if (typeof name !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(name) || name.includes('..')) {
    throw badRequest('name must be the name of a directory in the experts directory (letters, digits, . _ -)', 'name')
  }
  const root = await realpath(expertsDir)
  let real: string
  try {
    real = await realpath(join(root, name))
  } catch {
    throw notFound(`no expert directory named '${name}'`, 'expert_not_found')
  }
  if (!real.startsWith(root + sep)) throw new HttpError(403, `'${name}' resolves outside the experts directory`, 'invalid_request_error', 'name', 'forbidden')
  if (!(await stat(real)).isDirectory()) throw notFound(`'${name}' is not a directory`, 'expert_not_found')
  return real
}

/** `POST /v1/experts {name}`: loads `expertsDir/name`. */
export async function loadExpert(ctx: Context, expertsDir: string, body: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const path = await expertPath(expertsDir, body.name)
  const e = await ctx.rt.loadExpert(path)
  ctx.json(res, 200, describeExpert(e))
}

/** `DELETE /v1/experts/:name`. */
export async function unloadExpert(ctx: Context, name: string, res: ServerResponse): Promise<void> {
  const e = ctx.rt.experts.find((x) => x.name === name)
  if (!e) throw notFound(`no expert named '${name}' is loaded`, 'model_not_found')
  await e.unload()
  ctx.json(res, 200, { id: name, object: 'expert', deleted: true })
}
