// The Electron main process: owns the one Runtime of the app (through chat-service.js) and
// opens the window. The engine runs on its own native threads, so nothing here blocks the
// main process's event loop while a model loads or answers.
'use strict'

const { app, BrowserWindow, ipcMain } = require('electron')
const path = require('node:path')
const { Runtime } = require('expert-runtime')
const { createChatService } = require('./chat-service')

// Models never live inside app.asar: the engine opens and memory-maps them by their real path.
// This example reads EXPERT_RUNTIME_MODEL (a .gguf file, an HF model directory, or an
// `hf:org/repo` reference, see docs/models.md), else a file in the app's data folder (on Linux
// ~/.config/<app>/models, on macOS ~/Library/Application Support/<app>/models, on Windows
// %APPDATA%\<app>\models), where an installer or a first-run download would put it.
const model = process.env.EXPERT_RUNTIME_MODEL || path.join(app.getPath('userData'), 'models', 'model.gguf')

let service

function createWindow() {
  const win = new BrowserWindow({
    width: 760,
    height: 680,
    webPreferences: {
      preload: path.join(__dirname, 'preload.js'),
      // The renderer gets the narrow `window.chat` API and nothing else: no Node, no ipcRenderer.
      contextIsolation: true,
      sandbox: true,
      nodeIntegration: false,
    },
  })
  win.loadFile(path.join(__dirname, 'index.html'))
}

app.whenReady().then(() => {
  service = createChatService({
    ipcMain,
    system: 'You are a helpful assistant.',
    generateOptions: { maxTokens: 512 },
    // The conversation survives a restart: saved on quit, continued on the next start.
    sessionFile: path.join(app.getPath('userData'), 'chat.session'),
    loadRuntime: (onProgress) => Runtime.load(model, { onProgress }),
  })
  createWindow()
  app.on('activate', () => {
    if (BrowserWindow.getAllWindows().length === 0) createWindow()
  })
})

app.on('window-all-closed', () => {
  if (process.platform !== 'darwin') app.quit()
})

// Free the engine before the process ends: the first quit waits for dispose(), then quits again.
let disposed = false
app.on('will-quit', (event) => {
  if (!service || disposed) return
  event.preventDefault()
  disposed = true
  service.dispose().finally(() => app.quit())
})
