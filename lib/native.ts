// The generated binding (napi build --js native.js --dts native.d.ts), kept internal.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const native = require('../native.js') as typeof import('../native')
export = native
