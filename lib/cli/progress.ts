// Progress on stderr for the commands: a download's (`pull`, and `hf:` models for `chat` and
// `serve`) and a load's.
import type { DownloadProgress, LoadOptions } from '../types'

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
 * The progress options of a `Runtime.load` of `model`: downloads as `progressPrinter` draws
 * them, then a line per 10% of the weights read. Call `end` once the load settles.
 */
export function loadProgress(model: string): Pick<LoadOptions, 'onProgress' | 'onDownloadProgress'> & { end(): void } {
  const download = progressPrinter(model)
  let lastPct = -1
  return {
    onDownloadProgress: download.update,
    onProgress: ({ loadedBytes, totalBytes }) => {
      const pct = totalBytes > 0 ? Math.floor((100 * loadedBytes) / totalBytes) : 100
      if (pct >= lastPct + 10 || (pct === 100 && lastPct !== 100)) {
        lastPct = pct
        process.stderr.write(`loading ${model}: ${pct}%\n`)
      }
    },
    end: download.end,
  }
}
