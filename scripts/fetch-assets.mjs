// `npm run fetch-assets [-- --qwen25] [--gemma3]`: fills the cache directory ahead of time.
import { ensureGemma3, ensureQwen25Coder, ensureSmolLM2 } from './assets.mjs'
console.log(ensureSmolLM2())
if (process.argv.includes('--qwen25')) console.log(await ensureQwen25Coder())
if (process.argv.includes('--gemma3')) console.log(await ensureGemma3())
