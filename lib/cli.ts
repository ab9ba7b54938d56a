#!/usr/bin/env node
// `expert-runtime <command> …`: the command-line interface. Each command lives in lib/cli/.
import { UsageError } from './cli/args'
import { serve, USAGE as SERVE_USAGE } from './cli/serve'
import { chat, USAGE as CHAT_USAGE } from './cli/chat'
import { inspectCommand, USAGE as INSPECT_USAGE } from './cli/inspect'
import { pull, USAGE as PULL_USAGE } from './cli/pull'

interface Command {
  run(argv: string[]): Promise<void>
  usage: string
  summary: string
}

const COMMANDS: Record<string, Command> = {
  chat: { run: chat, usage: CHAT_USAGE, summary: 'chat with a model in the terminal' },
  inspect: { run: inspectCommand, usage: INSPECT_USAGE, summary: 'describe a model or an adapter without loading its weights' },
  serve: { run: serve, usage: SERVE_USAGE, summary: 'an OpenAI-compatible HTTP server for one model' },
  pull: { run: pull, usage: PULL_USAGE, summary: 'download a model from the Hugging Face Hub into the cache' },
}

function usage(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((c) => c.length))
  const lines = Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`)
  return `usage: expert-runtime <command> [arguments]\n\n${lines.join('\n')}\n\n'expert-runtime <command> --help' describes a command.`
}

async function main(argv: string[]): Promise<void> {
  const [name, ...rest] = argv
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    const which = name === 'help' ? COMMANDS[rest[0] ?? ''] : undefined
    process.stdout.write((which ? which.usage : usage()) + '\n')
    process.exitCode = name === undefined ? 2 : 0
    return
  }
  const command = COMMANDS[name]
  if (!command) {
    process.stderr.write(`expert-runtime: unknown command '${name}'\n\n${usage()}\n`)
    process.exitCode = 2
    return
  }
  if (rest.includes('--help') || rest.includes('-h')) {
    process.stdout.write(command.usage + '\n')
    return
  }
  try {
    await command.run(rest)
  } catch (e) {
    if (e instanceof UsageError) {
      process.stderr.write(`expert-runtime ${name}: ${e.message}\n\n${command.usage}\n`)
      process.exitCode = 2
      return
    }
    throw e
  }
}

main(process.argv.slice(2)).catch((e) => {
  process.stderr.write(`expert-runtime: ${(e as Error).message}\n`)
  process.exit(1)
})
