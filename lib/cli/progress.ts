// Progress on stderr for the commands: a download's (`pull`, and `hf:` models for `chat` and
// `serve`) and a load's.
import type { DownloadProgress, LoadOptions, LoadProgress } from '../types'

const MB = 1024 * 1024
const mb = (n: number) => (n / MB).toFixed(1)

/** Progress on stderr: redrawn in place (at most ~10 times a second) on a terminal, every 10% otherwise. */
export function progressPrinter(label: string) {
  const tty = process.stderr.isTTY === true
  let lastDraw = 0
  let lastTenth = -1
  let drawn = false
  const started = Date.now()
  const update = ({ loadedBytes, totalBytes, file }: DownloadProgress) => {
    const fraction = totalBytes > 0 ? Math.min(1, loadedBytes / totalBytes) : 0
    const pct = Math.floor(fraction * 100)
    if (tty) {
      const now = Date.now()
      if (now - lastDraw < 100 && loadedBytes < totalBytes) return
      lastDraw = now
      const width = 24
      const filled = Math.round(fraction * width)
      const seconds = Math.max((now - started) / 1000, 0.001)
      const bar = `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`
      process.stderr.write(`\r${bar} ${String(pct).padStart(3)}% ${mb(loadedBytes)}/${mb(totalBytes)} MB ${mb(loadedBytes / seconds)} MB/s ${file}\x1b[K`)
      drawn = true
    } else {
      const tenth = Math.floor(pct / 10)
      if (tenth === lastTenth) return
      lastTenth = tenth
      process.stderr.write(`pull ${label}: ${pct}% (${mb(loadedBytes)} of ${mb(totalBytes)} MB)\n`)
    }
  }
  const end = () => {
    if (drawn) process.stderr.write('\n')
    drawn = false
  }
  return { update, end }
}

/**
 * How a load's progress is shown: on a terminal, one line redrawn in place (`\r`, then the
 * line cleared to its end) each time the whole percentage changes, and ended with a newline by
 * `end`; otherwise (a log, a pipe) a line each time it has grown by 10 points, and one at
 * 100%. `write` takes what to print.
 */
export function loadProgressView(model: string, tty: boolean, write: (s: string) => void): { update(p: LoadProgress): void; end(): void } {
  let last = -1
  let drawn = false
  return {
    update: ({ loadedBytes, totalBytes }) => {
      const pct = totalBytes > 0 ? Math.min(100, Math.floor((100 * loadedBytes) / totalBytes)) : 100
      if (tty) {
        if (pct === last) return
        last = pct
        write(`\rloading ${model}: ${pct}%\x1b[K`)
        drawn = true
      } else if (pct >= last + 10 || (pct === 100 && last !== 100)) {
        last = pct
        write(`loading ${model}: ${pct}%\n`)
      }
    },
    end: () => {
      if (drawn) write('\n')
      drawn = false
    },
  }
}

/**
 * The progress options of a `Runtime.load` of `model`: downloads as `progressPrinter` draws
 * them, then the weights read as `loadProgressView` shows them on stderr. Call `end` once the
 * load settles.
 */
export function loadProgress(model: string): Pick<LoadOptions, 'onProgress' | 'onDownloadProgress'> & { end(): void } {
  const download = progressPrinter(model)
  const load = loadProgressView(model, process.stderr.isTTY === true, (s) => process.stderr.write(s))
  return {
    onDownloadProgress: download.update,
    onProgress: (p) => {
      // Reading starts once the download is over: its bar keeps its own line.
      download.end()
      load.update(p)
    },
    end: () => {
      download.end()
      load.end()
    },
  }
}
