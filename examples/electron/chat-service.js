// The main-process half of the example app: one Runtime for the app, one Session per window,
// and the IPC channels preload.js exposes. It takes Electron's `ipcMain` (or anything with
// the same `handle` / `removeHandler` shape) and a function that loads the Runtime, and
// requires nothing from Electron itself, so __test__/electron-example.test.mjs drives it under
// plain Node with a fake ipcMain against a real model.
//
// Channels (renderer → main, `ipcRenderer.invoke`):
//   chat:status             → the current status; the window then receives `chat:status` events
//   chat:send  { id, text } → resolves when the answer ends: { id, finishReason, text, usage, timings }
//                             or { id, error: { code, message } }; meanwhile `chat:token` events
//   chat:cancel id          → stops that answer (its `chat:send` resolves with finishReason 'cancelled')
//   chat:reset              → cancels what runs and starts the window's conversation over
// Events (main → renderer, `webContents.send`):
//   chat:token  { id, text }                          one per generated piece of text
//   chat:status { state: 'loading', loadedBytes, totalBytes } | { state: 'ready', model }
//               | { state: 'error', error: { code, message } }
'use strict'

const CHANNELS = Object.freeze({
  status: 'chat:status',
  send: 'chat:send',
  cancel: 'chat:cancel',
  reset: 'chat:reset',
  token: 'chat:token',
})

/** An error as plain data: IPC keeps `message` of an Error but drops `code`. */
function errorData(e) {
  return { code: typeof e?.code === 'string' ? e.code : 'INTERNAL', message: String(e?.message ?? e) }
}

/**
 * @param {object} o
 * @param {{ handle(channel: string, fn: (event: any, ...args: any[]) => any): void, removeHandler(channel: string): void }} o.ipcMain
 * @param {(onProgress: (p: { loadedBytes: number, totalBytes: number }) => void) => Promise<import('expert-runtime').Runtime>} o.loadRuntime
 * @param {string} [o.system] the system prompt of every conversation
 * @param {import('expert-runtime').GenerateOptions} [o.generateOptions] options of every answer (`signal` is set here)
 * @param {string} [o.sessionFile] where the conversation is kept across restarts: `dispose()`
 *   saves the last window's conversation there, and the first window of the next start
 *   continues it (`rt.restoreSession`: no prompt is evaluated again). A missing or unusable
 *   file (another model, damaged) starts a new conversation.
 */
function createChatService({ ipcMain, loadRuntime, system, generateOptions = {}, sessionFile }) {
  /** @type {any} */
  let status = { state: 'loading', loadedBytes: 0, totalBytes: 0 }
  /** @type {import('expert-runtime').Runtime | undefined} */
  let runtime
  let disposed = false
  /** Windows (webContents) that asked for the status, and each one's conversation. */
  const windows = new Map()
  /** The saved conversation is offered once, to the first window that sends. */
  let restorable = Boolean(sessionFile)
  /** The conversation `dispose()` saves: the one that answered last (kept when its window closes). */
  let lastSession
  let lastWindowClosed = false
  const setLast = (session) => {
    if (lastSession && lastSession !== session && lastWindowClosed) lastSession.dispose()
    lastSession = session
    lastWindowClosed = false
  }

  const setStatus = (s) => {
    status = s
    for (const w of windows.values()) if (!w.sender.isDestroyed()) w.sender.send(CHANNELS.status, s)
  }

  // Loading starts at once and runs off the JS thread; handlers wait for it.
  const ready = (async () => {
    try {
      runtime = await loadRuntime(({ loadedBytes, totalBytes }) => {
        if (!disposed) setStatus({ state: 'loading', loadedBytes, totalBytes })
      })
      const { architecture, device, deviceName, contextLength, quantization } = runtime.info
      setStatus({ state: 'ready', model: { architecture, device, deviceName, contextLength, quantization } })
      return runtime
    } catch (e) {
      setStatus({ state: 'error', error: errorData(e) })
      return undefined
    }
  })()

  /** The window's state, created on its first call; freed when the window goes away. */
  function windowOf(sender) {
    let w = windows.get(sender.id)
    if (!w) {
      w = { sender, session: undefined, requests: new Map(), closed: false }
      windows.set(sender.id, w)
      // A closed or reloaded window: stop its answers and free its conversation.
      sender.once('destroyed', () => void closeWindow(w))
    }
    return w
  }

  async function stopRequests(w) {
    const running = [...w.requests.values()]
    for (const r of running) r.controller.abort()
    await Promise.all(running.map((r) => r.done))
  }

  async function closeWindow(w) {
    w.closed = true
    windows.delete(w.sender.id)
    await stopRequests(w)
    // Without a sessionFile a closed window's conversation is freed at once; with one, the
    // conversation that answered last stays for `dispose()` to save.
    if (sessionFile && w.session && w.session === lastSession) lastWindowClosed = true
    else w.session?.dispose()
    w.session = undefined
  }

  /** The saved conversation for the first window, else a new one. */
  async function openSession(rt) {
    if (restorable) {
      restorable = false
      try {
        return await rt.restoreSession(sessionFile)
      } catch {
        // No file yet, or one this model cannot continue: start over.
      }
    }
    return rt.createSession({ system })
  }

  async function send(event, request) {
    const id = request?.id
    const text = request?.text
    if (typeof id !== 'string' || id.length === 0 || id.length > 128) {
      return { id, error: { code: 'INVALID_ARGUMENT', message: 'id must be a non-empty string' } }
    }
    if (typeof text !== 'string') return { id, error: { code: 'INVALID_ARGUMENT', message: 'text must be a string' } }
    const w = windowOf(event.sender)
    if (w.requests.has(id)) return { id, error: { code: 'INVALID_ARGUMENT', message: `request ${id} is already running` } }
    // Registered before anything is awaited, so a `chat:cancel` that follows finds it.
    const controller = new AbortController()
    let settle
    const done = new Promise((resolve) => (settle = resolve))
    w.requests.set(id, { controller, done })
    try {
      const rt = await ready
      if (!rt || disposed) return { id, error: status.state === 'error' ? status.error : { code: 'DISPOSED', message: 'the chat service was disposed' } }
      if (w.closed) return { id, finishReason: 'cancelled', text: '' }
      w.session ??= await openSession(rt)
      if (sessionFile) setLast(w.session)
      const stream = w.session.generate(text, { ...generateOptions, signal: controller.signal })
      for await (const chunk of stream) {
        // '' while a character is incomplete: nothing to show yet.
        if (chunk.text && !w.sender.isDestroyed()) w.sender.send(CHANNELS.token, { id, text: chunk.text })
      }
      const { finishReason, text: answer, usage, timings } = stream.result
      return { id, finishReason, text: answer, usage, timings }
    } catch (e) {
      return { id, error: errorData(e) }
    } finally {
      w.requests.delete(id)
      settle()
    }
  }

  ipcMain.handle(CHANNELS.status, (event) => {
    windowOf(event.sender)
    return status
  })
  ipcMain.handle(CHANNELS.send, send)
  ipcMain.handle(CHANNELS.cancel, (event, id) => {
    const r = windows.get(event.sender.id)?.requests.get(id)
    r?.controller.abort()
    return r !== undefined
  })
  ipcMain.handle(CHANNELS.reset, async (event) => {
    const w = windowOf(event.sender)
    await stopRequests(w)
    w.session?.reset()
    return true
  })

  return {
    /** The current status (what `chat:status` answers). */
    get status() {
      return status
    },
    /** Resolves with the Runtime once it is loaded (undefined if loading failed). */
    ready,
    /**
     * Stops every answer, saves the last conversation to `sessionFile` (when given), frees
     * every conversation and the model, and removes the handlers. Call it before the app
     * quits (see main.js). Idempotent.
     */
    async dispose() {
      if (disposed) return
      disposed = true
      for (const c of [CHANNELS.status, CHANNELS.send, CHANNELS.cancel, CHANNELS.reset]) ipcMain.removeHandler(c)
      await Promise.all([...windows.values()].map(closeWindow))
      if (sessionFile && lastSession) {
        // Best effort: a quit must not fail because the disk is full.
        await lastSession.save(sessionFile).catch(() => {})
      }
      lastSession?.dispose()
      const rt = await ready
      await rt?.dispose()
    },
  }
}

module.exports = { createChatService, CHANNELS }
