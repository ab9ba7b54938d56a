// examples/electron: the main-process logic of the example app (chat-service.js) driven under
// plain Node, with a fake ipcMain / webContents of Electron's shape, against the real engine
// on the tiny qwen3-tiny fixture (no Electron install: the IPC layer is all the service uses).
// Checks that tokens arrive as `chat:token` messages and add up to the answer, that cancel,
// reset, a closed window and dispose-on-quit do what the README says, and that the example's
// files agree with each other (preload's channels, the asarUnpack patterns).
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { EventEmitter } from 'node:events'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'
import { fixture } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const EXAMPLE = new URL('../examples/electron/', import.meta.url)
const { createChatService, CHANNELS } = require('../examples/electron/chat-service.js')

const MODEL = fixture('qwen3-tiny')
const SYSTEM = 'You are a helpful assistant.'

/** Electron's ipcMain, as far as the service uses it: one handler per channel. */
class FakeIpcMain {
  handlers = new Map()
  handle(channel, fn) {
    if (this.handlers.has(channel)) throw new Error(`Attempted to register a second handler for '${channel}'`)
    this.handlers.set(channel, fn)
  }
  removeHandler(channel) {
    this.handlers.delete(channel)
  }
  /** ipcRenderer.invoke from `sender`: arguments and results cross as structured clones. */
  async invoke(sender, channel, ...args) {
    const fn = this.handlers.get(channel)
    if (!fn) throw new Error(`No handler registered for '${channel}'`)
    return structuredClone(await fn({ sender }, ...structuredClone(args)))
  }
}

let nextWebContentsId = 1
/** A window's webContents: records what main sends it; `destroy()` is a closed window. */
class FakeWebContents extends EventEmitter {
  id = nextWebContentsId++
  destroyed = false
  messages = []
  send(channel, payload) {
    if (this.destroyed) throw new Error('Object has been destroyed')
    this.messages.push({ channel, payload: structuredClone(payload) })
    this.emit('message', channel, payload)
  }
  isDestroyed() {
    return this.destroyed
  }
  destroy() {
    this.destroyed = true
    this.emit('destroyed')
  }
  tokens(id) {
    return this.messages.filter((m) => m.channel === CHANNELS.token && m.payload.id === id).map((m) => m.payload.text)
  }
  /** Resolves at the `n`th token of answer `id`. */
  tokenCount(id, n) {
    return new Promise((resolve) => {
      const check = () => {
        if (this.tokens(id).length < n) return
        this.off('message', check)
        resolve()
      }
      this.on('message', check)
      check()
    })
  }
}

/**
 * `stats()` as of after every command sent so far: the engine handles commands in order and
 * publishes its counters at the end of each loop, so the second of two embeddings (each a
 * round trip through the engine's channel) is answered after the loop that handled earlier
 * commands has published.
 */
async function statsAfterCommands(rt) {
  await rt.embed(['sync'])
  await rt.embed(['sync'])
  return rt.stats()
}

function service(generateOptions, loadRuntime = (onProgress) => Runtime.load(MODEL, { onProgress }), sessionFile = undefined) {
  const ipc = new FakeIpcMain()
  return { ipc, chat: createChatService({ ipcMain: ipc, loadRuntime, system: SYSTEM, generateOptions, sessionFile }) }
}

describe('examples/electron chat service (qwen3-tiny, real engine, fake IPC)', () => {
  const GREEDY_8 = { temperature: 0, maxTokens: 8 }
  let expected
  before(async () => {
    // The same question answered directly through the API: what the IPC messages must carry.
    const rt = await Runtime.load(MODEL)
    expected = await rt.createSession({ system: SYSTEM }).complete('Hello robot', GREEDY_8)
    await rt.dispose()
  })

  it('keeps the conversation across restarts through sessionFile: saved on dispose, continued on the next start', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'er-electron-'))
    const file = path.join(dir, 'chat.session')
    try {
      // First start: no file yet, a new conversation; quitting saves it.
      let { ipc, chat } = service(GREEDY_8, undefined, file)
      const win = new FakeWebContents()
      const r1 = await ipc.invoke(win, CHANNELS.send, { id: 'a', text: 'Hello robot' })
      assert.equal(r1.error, undefined, JSON.stringify(r1.error))
      assert.equal(r1.usage.cachedTokens, 0)
      win.destroy()
      await chat.dispose()
      assert.ok(existsSync(file), 'saved on dispose')
      // Next start: the first window continues it; the conversation is cached, not evaluated again.
      ;({ ipc, chat } = service(GREEDY_8, undefined, file))
      const again = new FakeWebContents()
      const r2 = await ipc.invoke(again, CHANNELS.send, { id: 'b', text: 'And then?' })
      assert.equal(r2.error, undefined, JSON.stringify(r2.error))
      assert.ok(r2.usage.cachedTokens > 10, `cached ${r2.usage.cachedTokens}`)
      await chat.dispose()
      // A damaged file starts a new conversation instead of failing.
      writeFileSync(file, 'not a session')
      ;({ ipc, chat } = service(GREEDY_8, undefined, file))
      const r3 = await ipc.invoke(new FakeWebContents(), CHANNELS.send, { id: 'c', text: 'Hello robot' })
      assert.equal(r3.error, undefined, JSON.stringify(r3.error))
      assert.equal(r3.usage.cachedTokens, 0)
      await chat.dispose()
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it('reports loading then ready to a window that asked, and streams an answer as chat:token messages', async () => {
    const { ipc, chat } = service(GREEDY_8)
    const win = new FakeWebContents()
    const first = await ipc.invoke(win, CHANNELS.status)
    assert.ok(['loading', 'ready'].includes(first.state), JSON.stringify(first))
    const rt = await chat.ready
    assert.ok(rt instanceof Runtime)
    const statuses = win.messages.filter((m) => m.channel === CHANNELS.status).map((m) => m.payload)
    assert.equal(statuses.at(-1).state, 'ready')
    assert.equal(statuses.at(-1).model.architecture, 'qwen3')
    assert.deepEqual(await ipc.invoke(win, CHANNELS.status), statuses.at(-1))

    const r = await ipc.invoke(win, CHANNELS.send, { id: 'a1', text: 'Hello robot' })
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.equal(r.id, 'a1')
    assert.equal(r.finishReason, 'length')
    assert.equal(r.usage.completionTokens, 8)
    assert.equal(typeof r.timings.tokensPerSecond, 'number')
    const tokens = win.tokens('a1')
    assert.ok(tokens.length >= 1 && tokens.length <= 8, `${tokens.length} token messages`)
    assert.ok(tokens.every((t) => typeof t === 'string' && t.length > 0))
    assert.equal(tokens.join(''), r.text)
    assert.equal(r.text, expected.text, 'the same answer as through the API directly')

    // The window's conversation goes on: the second turn reuses the first one's cache.
    const r2 = await ipc.invoke(win, CHANNELS.send, { id: 'a2', text: 'And again?' })
    assert.equal(r2.finishReason, 'length')
    assert.ok(r2.usage.cachedTokens > 0, JSON.stringify(r2.usage))
    assert.equal(win.tokens('a2').join(''), r2.text)

    // Reset starts it over: the same question gives the first answer again, from a fresh history.
    assert.equal(await ipc.invoke(win, CHANNELS.reset), true)
    const r3 = await ipc.invoke(win, CHANNELS.send, { id: 'a3', text: 'Hello robot' })
    assert.equal(r3.text, expected.text)
    assert.equal(r3.usage.promptTokens, r.usage.promptTokens)
    await chat.dispose()
  })

  it('cancel (the renderer aborting its AbortController) stops the answer; the tokens sent are the answer', async () => {
    // No maxTokens: greedy on this fixture never samples EOS, so the answer would run to the
    // end of the 512-position context.
    const { ipc, chat } = service({ temperature: 0 })
    const win = new FakeWebContents()
    // What renderer.js does: an AbortController per answer, whose abort invokes chat:cancel.
    const controller = new AbortController()
    controller.signal.addEventListener('abort', () => void ipc.invoke(win, CHANNELS.cancel, 'long'), { once: true })
    const answer = ipc.invoke(win, CHANNELS.send, { id: 'long', text: 'Tell me everything' })
    await win.tokenCount('long', 3)
    controller.abort()
    const sentBeforeAbort = win.tokens('long').length
    const r = await answer
    assert.equal(r.finishReason, 'cancelled')
    assert.equal(win.tokens('long').length, sentBeforeAbort, 'no token reaches the window after the abort')
    assert.ok(r.usage.completionTokens < 512 - r.usage.promptTokens, 'stopped before the context was full')
    assert.equal(win.tokens('long').join(''), r.text, 'the summary holds exactly what reached the window')
    assert.equal(await ipc.invoke(win, CHANNELS.cancel, 'long'), false, 'nothing left to cancel')

    // The window's session is free again at once.
    const next = await ipc.invoke(win, CHANNELS.send, { id: 'next', text: 'Hello robot' })
    assert.equal(next.error, undefined, JSON.stringify(next.error))
    assert.ok(win.tokens('next').length > 0)
    await chat.dispose()
  })

  it('windows have their own conversations, answered together; a closed window frees its session', async () => {
    const { ipc, chat } = service(GREEDY_8)
    const rt = await chat.ready
    const a = new FakeWebContents()
    const b = new FakeWebContents()
    const [ra, rb] = await Promise.all([
      ipc.invoke(a, CHANNELS.send, { id: 'x', text: 'Hello robot' }),
      ipc.invoke(b, CHANNELS.send, { id: 'x', text: 'Hello robot' }),
    ])
    assert.equal(ra.text, expected.text)
    assert.equal(rb.text, expected.text)
    assert.equal(a.tokens('x').join(''), ra.text)
    assert.equal(b.tokens('x').join(''), rb.text)
    assert.equal((await statsAfterCommands(rt)).sessions, 2)

    // A window that closes while it is answering: its answer stops and its session is freed
    // (a second service over the same runtime, whose answers run to the end of the context).
    const c = new FakeWebContents()
    const long = service({ temperature: 0 }, async () => rt)
    const pending = long.ipc.invoke(c, CHANNELS.send, { id: 'y', text: 'Tell me everything' })
    await c.tokenCount('y', 2)
    assert.equal((await statsAfterCommands(rt)).sessions, 3)
    c.destroy()
    const r = await pending
    assert.equal(r.finishReason, 'cancelled')
    await new Promise((resolve) => setImmediate(resolve))
    assert.equal((await statsAfterCommands(rt)).sessions, 2)
    b.destroy()
    await new Promise((resolve) => setImmediate(resolve))
    assert.equal((await statsAfterCommands(rt)).sessions, 1)
    await chat.dispose()
    assert.equal(rt.disposed, true)
  })

  it('dispose on quit: stops running answers, removes the handlers, frees the model', async () => {
    const { ipc, chat } = service({ temperature: 0 })
    const win = new FakeWebContents()
    const pending = ipc.invoke(win, CHANNELS.send, { id: 'q', text: 'Tell me everything' })
    await win.tokenCount('q', 2)
    const rt = await chat.ready
    await chat.dispose()
    const r = await pending
    assert.equal(r.finishReason, 'cancelled')
    assert.equal(rt.disposed, true)
    assert.equal(ipc.handlers.size, 0)
    await assert.rejects(ipc.invoke(win, CHANNELS.send, { id: 'late', text: 'hi' }), /No handler registered/)
    await chat.dispose() // idempotent
  })

  it('a model that does not load: the status and every answer carry its error code', async () => {
    const { ipc, chat } = service(GREEDY_8, (onProgress) => Runtime.load(fixture('no-such-model'), { onProgress }))
    const win = new FakeWebContents()
    await ipc.invoke(win, CHANNELS.status)
    assert.equal(await chat.ready, undefined)
    const status = await ipc.invoke(win, CHANNELS.status)
    assert.equal(status.state, 'error')
    assert.equal(status.error.code, 'MODEL_NOT_FOUND')
    assert.equal(win.messages.at(-1).payload.state, 'error', 'the window was told')
    const r = await ipc.invoke(win, CHANNELS.send, { id: 'e', text: 'hi' })
    assert.equal(r.error.code, 'MODEL_NOT_FOUND')
    const bad = await ipc.invoke(win, CHANNELS.send, { id: '', text: 'hi' })
    assert.equal(bad.error.code, 'INVALID_ARGUMENT')
    await chat.dispose()
  })

  it("the example's files agree: preload's channels, the asarUnpack patterns, main.js owning the runtime", () => {
    const preload = readFileSync(new URL('preload.js', EXAMPLE), 'utf8')
    const used = new Set(preload.match(/'chat:[a-z]+'/g).map((s) => s.slice(1, -1)))
    assert.deepEqual([...used].sort(), Object.values(CHANNELS).sort())
    assert.match(preload, /contextBridge\.exposeInMainWorld\('chat'/)
    const pkg = JSON.parse(readFileSync(new URL('package.json', EXAMPLE), 'utf8'))
    assert.ok(pkg.build.asarUnpack.includes('**/*.node'))
    assert.ok(pkg.build.asarUnpack.includes('**/node_modules/expert-runtime-*/**'))
    const main = readFileSync(new URL('main.js', EXAMPLE), 'utf8')
    assert.match(main, /require\('expert-runtime'\)/)
    assert.match(main, /createChatService\(/)
    assert.match(main, /contextIsolation: true/)
    assert.match(main, /service\.dispose\(\)/)
  })
})
