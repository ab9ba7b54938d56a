// Noticing that the process which launched us is gone, for `serve` (a server left behind by
// its launcher keeps its port and its memory until someone finds it).
//
// `npx expert-runtime serve` runs as npm → `sh -c '<command>'` → node: npm spawns its commands
// through the shell, and dash (Debian's and Ubuntu's /bin/sh) does not exec the last command of
// `-c`. A SIGTERM to npm kills that shell (npm forwards the signal to its child, which is the
// shell), and node, never signalled, is left running under init. Node cannot ask the kernel to
// signal it when its parent dies (`prctl(PR_SET_PDEATHSIG)` is not reachable from JS), a closed
// stdin proves nothing (npx passes the terminal; daemons run with /dev/null), and an IPC channel
// exists only when the parent made one. What does work everywhere is that an orphan is adopted:
// its `process.ppid` changes (to 1, or to a subreaper). So we poll it, once a second, on an
// unref'd timer. When our parent is npm's shell, on Linux we also watch the shell's own parent
// (npm) through /proc: an npm killed with SIGKILL leaves the shell alive, waiting for us.

import { readFileSync } from 'node:fs'

/** The parent pid of `pid`, from /proc (Linux); undefined when it cannot be read (gone). */
function parentOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so split after the last ')'.
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
    return Number.isInteger(ppid) ? ppid : undefined
  } catch {
    return undefined
  }
}

/** Whether `pid` is the `sh -c <script>` npm runs our command line through (Linux). */
function isNpmShell(pid: number): boolean {
  const script = process.env.npm_lifecycle_script
  if (process.platform !== 'linux' || !script) return false
  try {
    // `sh -c "'expert-runtime' serve …"`; npm_lifecycle_script is the command before the arguments.
    const [, flag, line] = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')
    return flag === '-c' && typeof line === 'string' && (line === script || line.startsWith(`${script} `))
  } catch {
    return false
  }
}

/** Whether npm (`npx`, `npm exec`, `npm run`/`start`) launched this process or one of its ancestors. */
export const launchedByNpm = () => typeof process.env.npm_lifecycle_event === 'string' || typeof process.env.npm_command === 'string'

/**
 * Calls `onGone` (once) when the parent process is gone, or, when the parent is npm's shell,
 * npm is. Checks every `intervalMs` on an unref'd timer (it keeps nothing alive). Returns the stop.
 * Already adopted at the start (parent pid 1, or 0 as a container's first process): nothing to watch.
 */
export function watchParent(onGone: (what: string) => void, intervalMs = 1000): () => void {
  const parent = process.ppid
  if (parent <= 1) return () => {}
  const grandparent = isNpmShell(parent) ? parentOf(parent) : undefined
  const timer = setInterval(() => {
    let gone: string | null = null
    if (process.ppid !== parent) gone = `the parent process (${parent}) exited`
    else if (grandparent !== undefined && parentOf(parent) !== grandparent) gone = `npm (${grandparent}) exited`
    if (gone) {
      clearInterval(timer)
      onGone(gone)
    }
  }, intervalMs)
  timer.unref()
  return () => clearInterval(timer)
}
