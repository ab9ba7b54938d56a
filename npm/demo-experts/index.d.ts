/** The SQL expert's directory: answers a database question with one SQL query. */
export declare const sql: string
/** The shell expert's directory: answers a request with one shell command. */
export declare const shell: string
/** The base model both were trained on (any of its formats loads them: safetensors or GGUF). */
export declare const baseModel: string
