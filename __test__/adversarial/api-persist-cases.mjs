// Adversarial saved sessions: `session.save` to hostile paths and `rt.restoreSession` of hostile
// files (special files, truncations and bit flips of a real save, another model's save).
import fs from 'node:fs'
import { prng } from './formats.mjs'
import { fx, NON_OBJECTS, NON_STRINGS, SPECIALS } from './inputs.mjs'

/** A real save of a qwen3-tiny session (the shared runtime's model) after one turn, as bytes. */
async function savedBytes(ctx) {
  const s = await ctx.session()
  await s.complete({ tokens: [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22] }, { temperature: 0, maxTokens: 3 })
  const p = `${await ctx.caseDir()}/good.session`
  await s.save(p)
  return fs.promises.readFile(p)
}

/** Restores `p` into the shared runtime and, when that works, takes a turn from it. */
async function restoreAndTurn(ctx, p, options) {
  const rt = await ctx.shared()
  ctx.stage = 'call'
  const s = await (options === undefined ? rt.restoreSession(p) : rt.restoreSession(p, options))
  ctx.sessions.push(s)
  await s.complete({ tokens: [30, 31, 32] }, { temperature: 0, maxTokens: 2 })
}

export function apiPersistCases(add) {
  const cat = 'api'
  const IA = ['INVALID_ARGUMENT']
  const SAVE = ['INVALID_ARGUMENT', 'IO_ERROR']

  // session.save(path)
  for (const [n, v] of NON_STRINGS) add(cat, `session.save path ${n}`, IA, false, async (ctx) => (await ctx.session()).save(v))
  add(cat, 'session.save path empty', IA, false, async (ctx) => (await ctx.session()).save(''))
  add(cat, 'session.save path 2 MB', SAVE, false, async (ctx) => (await ctx.session()).save('/tmp/' + 'p'.repeat(2 << 20)))
  add(cat, 'session.save path with NUL', SAVE, false, async (ctx) => (await ctx.session()).save(`${await ctx.caseDir()}/a\u0000b`))
  add(cat, 'session.save into a missing directory', SAVE, false, async (ctx) => (await ctx.session()).save(`${await ctx.caseDir()}/no/such/x.session`))
  add(cat, 'session.save path a file name of 300 bytes', SAVE, false, async (ctx) => (await ctx.session()).save(`${await ctx.caseDir()}/${'n'.repeat(300)}`))
  // Over a special file in the case's directory: the save replaces the entry (never writes
  // through a link), or is refused.
  for (const kind of SPECIALS) {
    add(cat, `session.save over ${kind}`, SAVE, kind !== 'dir', async (ctx) => {
      const p = await ctx.special('target', kind)
      const s = await ctx.session()
      await s.complete({ tokens: [5, 6, 7] }, { temperature: 0, maxTokens: 1 })
      await s.save(p)
      await restoreAndTurn(ctx, p)
    })
  }

  // rt.restoreSession(path, options)
  for (const [n, v] of NON_STRINGS) add(cat, `restoreSession path ${n}`, IA, false, async (ctx) => restoreAndTurn(ctx, v))
  add(cat, 'restoreSession path empty', IA, false, async (ctx) => restoreAndTurn(ctx, ''))
  add(cat, 'restoreSession path missing', IA, false, async (ctx) => restoreAndTurn(ctx, '/nonexistent/x.session'))
  add(cat, 'restoreSession path 2 MB', IA, false, async (ctx) => restoreAndTurn(ctx, '/' + 'p'.repeat(2 << 20)))
  for (const kind of SPECIALS) add(cat, `restoreSession of ${kind}`, IA, false, async (ctx) => restoreAndTurn(ctx, await ctx.special('s.session', kind)))
  for (const [n, v] of NON_OBJECTS) {
    add(cat, `restoreSession options ${n}`, IA, false, async (ctx) => restoreAndTurn(ctx, await ctx.file('s.session', await savedBytes(ctx)), v))
  }
  add(cat, 'restoreSession a real save', [], true, async (ctx) => restoreAndTurn(ctx, await ctx.file('s.session', await savedBytes(ctx))))
  // Truncated anywhere, or one bit flipped anywhere: refused by the checks (lengths, header,
  // CRC-32), never trusted.
  for (let i = 0; i < 24; i++) {
    add(cat, `restoreSession truncated #${i}`, IA, false, async (ctx) => {
      const b = await savedBytes(ctx)
      const at = prng(7000 + i).int(0, b.length)
      await restoreAndTurn(ctx, await ctx.file('s.session', b.subarray(0, at)))
    })
    add(cat, `restoreSession one bit flipped #${i}`, IA, false, async (ctx) => {
      const b = Buffer.from(await savedBytes(ctx))
      const r = prng(9000 + i)
      const at = r.int(0, b.length)
      b[at] ^= 1 << r.int(0, 8)
      await restoreAndTurn(ctx, await ctx.file('s.session', b))
    })
  }
  add(cat, 'restoreSession of another model\'s save', IA, false, async (ctx) => {
    const other = await ctx.load(fx('llama-tiny'))
    const s = other.createSession()
    await s.complete({ tokens: [5, 6, 7, 8] }, { temperature: 0, maxTokens: 1 })
    const p = `${await ctx.caseDir()}/other.session`
    await s.save(p)
    s.dispose()
    await restoreAndTurn(ctx, p)
  })
}
