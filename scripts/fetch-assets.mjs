// `npm run fetch-assets [-- --qwen25]`: fills the cache directory ahead of time.
import { ensureQwen25Coder, ensureSmolLM2 } from './assets.mjs'
console.log(ensureSmolLM2())
if (process.argv.includes('--qwen25')) console.log(await ensureQwen25Coder())
