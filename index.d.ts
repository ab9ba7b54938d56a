// Public types: generated from lib/*.ts into dist/ by `npm run build:ts`.
export * from './dist/index'
