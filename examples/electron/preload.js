// Runs in the renderer before the page, with access to ipcRenderer; exposes only a narrow chat
// API as `window.chat` (contextBridge). A sandboxed preload cannot require local files, so the
// channel names are repeated here (chat-service.js defines them; the example's test checks
// that both agree).
'use strict'

const { contextBridge, ipcRenderer } = require('electron')

/** Calls `fn(message)` for each event on `channel`; returns a function that stops it. */
function subscribe(channel, fn) {
  const listener = (_event, message) => fn(message)
  ipcRenderer.on(channel, listener)
  return () => ipcRenderer.removeListener(channel, listener)
}

contextBridge.exposeInMainWorld('chat', {
  /** { state: 'loading' | 'ready' | 'error', … }; later changes arrive through onStatus. */
  status: () => ipcRenderer.invoke('chat:status'),
  /** Resolves when the answer ends; its text arrives meanwhile through onToken. */
  send: (id, text) => ipcRenderer.invoke('chat:send', { id: String(id), text: String(text) }),
  /** Stops the answer `id`. */
  cancel: (id) => ipcRenderer.invoke('chat:cancel', String(id)),
  /** Starts the conversation over. */
  reset: () => ipcRenderer.invoke('chat:reset'),
  onToken: (fn) => subscribe('chat:token', fn),
  onStatus: (fn) => subscribe('chat:status', fn),
})
