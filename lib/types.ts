// The public types, gathered from lib/types/ (one file per domain) so that every name is importable from './types'.
export type * from './types/chat'
export type * from './types/load'
export type * from './types/runtime-info'
export type * from './types/generation'
export type * from './types/experts'
export type * from './types/inspection'
