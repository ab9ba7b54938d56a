// The page: sends a question, appends the answer's text as `chat:token` events arrive, and
// cancels it with an AbortController (the Stop button) whose abort tells the main process.
'use strict'

const log = document.getElementById('log')
const form = document.getElementById('form')
const input = document.getElementById('input')
const sendButton = document.getElementById('send')
const stopButton = document.getElementById('stop')
const resetButton = document.getElementById('reset')
const statusLine = document.getElementById('status')

let ready = false
/** The answer being written: { id, controller, element }. */
let current = null
let nextId = 1

function showStatus(s) {
  ready = s.state === 'ready'
  if (s.state === 'loading') {
    const pct = s.totalBytes ? Math.round((100 * s.loadedBytes) / s.totalBytes) : 0
    statusLine.textContent = `Loading the model… ${pct}%`
  } else if (s.state === 'ready') {
    statusLine.textContent = `${s.model.architecture} on ${s.model.deviceName}, ${s.model.contextLength} positions`
  } else {
    statusLine.textContent = `The model did not load: [${s.error.code}] ${s.error.message}`
  }
  updateButtons()
}

function updateButtons() {
  sendButton.disabled = !ready || current !== null
  stopButton.disabled = current === null
}

function append(role, text) {
  const element = document.createElement('div')
  element.className = `turn ${role}`
  element.textContent = text
  log.append(element)
  element.scrollIntoView({ block: 'end' })
  return element
}

window.chat.onStatus(showStatus)
window.chat.status().then(showStatus)

window.chat.onToken(({ id, text }) => {
  if (current?.id !== id) return
  current.element.textContent += text
  current.element.scrollIntoView({ block: 'end' })
})

form.addEventListener('submit', async (event) => {
  event.preventDefault()
  const text = input.value.trim()
  if (!text || !ready || current) return
  input.value = ''
  append('user', text)
  const id = `answer-${nextId++}`
  const controller = new AbortController()
  controller.signal.addEventListener('abort', () => window.chat.cancel(id), { once: true })
  current = { id, controller, element: append('assistant', '') }
  updateButtons()
  try {
    const r = await window.chat.send(id, text)
    const note = document.createElement('div')
    note.className = 'note'
    note.textContent = r.error
      ? `[${r.error.code}] ${r.error.message}`
      : `${r.usage.completionTokens} tokens, ${r.timings.tokensPerSecond.toFixed(1)} tokens/s` + (r.finishReason === 'cancelled' ? ', stopped' : '')
    current.element.after(note)
  } finally {
    current = null
    updateButtons()
    input.focus()
  }
})

stopButton.addEventListener('click', () => current?.controller.abort())

resetButton.addEventListener('click', async () => {
  current?.controller.abort()
  await window.chat.reset()
  log.replaceChildren()
})
