"""expert-runtime: run small LLMs with many run-time PEFT experts.

The same Rust engine as the Node package: ``Runtime`` (a loaded base model), ``Session`` (a
conversation), ``Expert`` (a PEFT adapter applied at run time). Every error is an
``ExpertRuntimeError`` whose ``code`` is the same stable code Node reports.
"""

from ._native import (
    AsyncTokenStream,
    Completion,
    Expert,
    ExpertRuntimeError,
    FunctionCall,
    FunctionDelta,
    Runtime,
    Session,
    Timings,
    TokenChunk,
    TokenStream,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = [
    "AsyncTokenStream",
    "Completion",
    "Expert",
    "ExpertRuntimeError",
    "FunctionCall",
    "FunctionDelta",
    "Runtime",
    "Session",
    "Timings",
    "TokenChunk",
    "TokenStream",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
]
