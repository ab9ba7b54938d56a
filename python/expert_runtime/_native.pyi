# Type stubs for the compiled module (src/python/). Options are keyword arguments in
# snake_case; an unknown one, a wrong type or an out-of-range integer raises
# ExpertRuntimeError("INVALID_ARGUMENT").
import os
from types import TracebackType
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterator, List, Literal, Mapping, Optional, Sequence, Tuple, TypedDict, Union

from typing_extensions import NotRequired, Unpack

class ExpertRuntimeError(Exception):
    """Every error the engine raises. ``code`` is stable and equal to Node's:
    MODEL_NOT_FOUND, INVALID_MODEL, UNSUPPORTED_ARCHITECTURE, CONTEXT_OVERFLOW,
    INVALID_ARGUMENT, SESSION_BUSY, DISPOSED, NO_CUDA_DEVICE, EXPERT_NOT_FOUND,
    UNSUPPORTED_ADAPTER, INVALID_ADAPTER, KV_CACHE_EXHAUSTED, OUT_OF_MEMORY, IO_ERROR, INTERNAL."""

    code: str
    detail: str

class KvCacheOptions(TypedDict, total=False):
    max_tokens: int
    block_size: int
    prefix_cache: bool
    dtype: str  # 'f32' | 'f16' | 'bf16' | 'q8_0' | 'q4_0' (default: the model's dtype)

class LoadOptions(TypedDict, total=False):
    device: str  # 'auto' | 'cpu' | 'cuda' | 'cuda:N'
    dtype: str  # 'auto' | 'f32' | 'f16' | 'bf16'
    # past what the model supports: loads, with a note in info["warnings"]; "auto": the longest
    # context whose KV cache fits memory_limit next to everything else (OUT_OF_MEMORY below 512)
    context_length: Union[int, Literal["auto"]]
    # Bytes the runtime may take in all (weights, KV, state, tables, scratch); a model that
    # cannot fit is refused with OUT_OF_MEMORY before its weights are read. Default: no bound;
    # for context_length="auto", the free memory less a margin.
    memory_limit: int
    # Replaces the model's own RoPE scaling: {"type": "linear" | "dynamic" | "yarn" | "llama3",
    # "factor", "original_max_position_embeddings", ...} (HF's keys); {"type": "default"}: none.
    rope_scaling: Dict[str, Any]
    threads: int
    kv_cache: KvCacheOptions
    quantize: str  # 'none' | 'q8_0' | 'q4_0' | 'q4_k': quantize dense weights as they are read
    mmap: bool  # default True: dense weights read in place from the memory-mapped file (CPU)
    on_progress: Callable[[int, int], None]  # (loaded_bytes, total_bytes), on the loading thread

class ToolCallFunctionDict(TypedDict):
    name: str
    arguments: str  # JSON text (a dict is written as JSON)

class ToolCallDict(TypedDict):
    id: str
    type: Literal["function"]
    function: ToolCallFunctionDict

class Message(TypedDict):
    role: str
    content: Optional[str]
    tool_calls: NotRequired[List[Union[ToolCallDict, "ToolCall"]]]
    tool_call_id: NotRequired[str]
    reasoning: NotRequired[str]  # an assistant turn's thought

class TextInput(TypedDict):
    text: str

class TokensInput(TypedDict):
    tokens: Sequence[int]

GenerateInput = Union[str, Sequence[Message], TextInput, TokensInput]

class ResponseFormat(TypedDict, total=False):
    type: Literal["text", "json_object", "json_schema", "regex", "grammar"]
    schema: Union[Mapping[str, Any], bool]  # json_schema
    json_schema: Mapping[str, Any]  # OpenAI's form: {"name", "schema", "strict"}
    name: str
    strict: bool
    pattern: str  # regex
    grammar: str  # grammar (Lark syntax, as llguidance reads it)

class FunctionSpec(TypedDict, total=False):
    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments object
    strict: bool

class Tool(TypedDict):
    type: Literal["function"]
    function: FunctionSpec

class NamedToolChoice(TypedDict):
    type: Literal["function"]
    function: Dict[Literal["name"], str]

class _SpeculativeRequired(TypedDict):
    type: Literal["ngram"]

class Speculative(_SpeculativeRequired, total=False):
    """Prompt lookup: drafts copied from the context."""
    max_draft: int  # draft tokens per step at most, 1..64 (default 8)
    ngram: int  # longest suffix matched, 1..16 (default 3)
    min_ngram: int  # shortest suffix matched (default 2, at most ngram)

class _SpeculativeDraftRequired(TypedDict):
    type: Literal["draft"]
    model: "Runtime"  # another loaded runtime with the same tokenizer

class SpeculativeDraft(_SpeculativeDraftRequired, total=False):
    """A second, smaller model proposes the drafts (greedily)."""
    max_draft: int  # draft tokens per step at most, 1..64 (default 4)

class ThinkingBudget(TypedDict):
    budget_tokens: int  # most thought tokens; 0 is no thought

class GenerateOptions(TypedDict, total=False):
    max_tokens: int
    temperature: float  # 0 = greedy
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    seed: int
    stop: Union[str, Sequence[str]]
    top_logprobs: int
    thinking: Union[bool, ThinkingBudget]  # thinking models: think, answer at once, or think under a budget
    enable_thinking: bool  # alias of thinking: bool
    experts: Union[Sequence[str], Literal["auto"]]
    parse_special_tokens: bool
    response_format: ResponseFormat
    tools: Sequence[Tool]
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice]
    parallel_tool_calls: bool
    speculative: Union[Speculative, SpeculativeDraft]

class EmbedOptions(TypedDict, total=False):
    pooling: Literal["mean", "last"]
    normalize: bool
    experts: Sequence[str]

class RouterWeights(TypedDict, total=False):
    keywords: float
    similarity: float

class RouterSettings(TypedDict, total=False):
    threshold: float
    max_experts: int
    generic_patterns: List[str]
    weights: RouterWeights
    history_turns: int
    generic_min_keyword_hits: int

class ExpertScore(TypedDict):
    name: str
    score: Optional[float]
    keyword_hits: List[str]
    exclude_hits: List[str]
    similarity: Optional[float]

class RouteDecision(TypedDict):
    generic_similarity: Optional[float]
    experts: List[str]
    generic: bool
    scores: List[ExpertScore]
    reason: str

class RuntimeInfo(TypedDict):
    architecture: str
    family: str  # as the checkpoint names it: model_type, or a GGUF's general.architecture
    dtype: str
    device: str
    device_name: str
    device_memory_total: Optional[int]
    vocab_size: int
    context_length: int
    num_layers: int
    hidden_size: int
    eos_token_ids: List[int]
    kv_cache_dtype: str
    rope_scaling: Optional[Dict[str, Any]]  # the scaling the model runs with, parameters resolved
    quantization: str  # 'none', or the weights' block formats, most bytes first ('q4_k+q6_k')
    weight_bytes: int
    warnings: List[str]

class RuntimeStats(TypedDict):
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_cached: int
    kv_blocks_touched: int
    kv_block_size: int
    kv_bytes: int
    kv_bytes_per_token: int
    sessions: int
    active_requests: int
    queued_requests: int
    prefix_cache_hit_tokens: int
    evicted_blocks: int
    kv_device_bytes: int
    device_memory_free: Optional[int]
    device_memory_total: Optional[int]
    memory: MemoryByKind  # resident bytes by kind

class MemoryByKind(TypedDict):
    weights: int  # the weights (those read in place from a memory-mapped file included)
    kv: int  # the KV pool's resident part (CPU: blocks ever used and not given back)
    state: int  # recurrent state held by sequences
    experts: int  # the resident experts' weights

class FunctionCall:
    name: str
    arguments: str

class ToolCall:
    id: str
    type: Literal["function"]
    function: FunctionCall
    def to_dict(self) -> ToolCallDict: ...

class FunctionDelta:
    name: Optional[str]
    arguments: str

class ToolCallDelta:
    index: int
    id: Optional[str]
    type: Optional[Literal["function"]]
    function: FunctionDelta

class TokenChunk:
    token_id: int
    text: str  # answer text only
    reasoning: Optional[str]  # the thought text this token wrote (thinking models)
    logprob: float  # the model's own, before any response-format mask
    top_logprobs: Optional[List[Tuple[int, float]]]
    tool_call_delta: Optional[ToolCallDelta]
    tool_call_deltas: Optional[List[ToolCallDelta]]
    experts: Optional[List[str]]  # first chunk only: the experts that run, in application order
    routing: Optional[RouteDecision]  # first chunk only, for experts="auto": the router's decision

class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    draft_tokens: int
    accepted_draft_tokens: int
    reasoning_tokens: int  # of completion_tokens, those of the thought (thinking models)

class Timings:
    ttft_ms: float
    prepare_ms: float
    format_ms: float
    tokens_per_second: float
    prefill_tokens_per_second: float

class Completion:
    text: str  # the answer (tool-call markup and the thought left out)
    reasoning: Optional[str]  # the thought (thinking models; '' when it did not think), else None
    tokens: List[int]
    finish_reason: Literal["stop", "length", "cancelled", "tool_calls"]
    usage: Usage
    timings: Timings
    experts: List[str]
    tool_calls: Optional[List[ToolCall]]
    routing: Optional[RouteDecision]

class TokenStream(Iterator[TokenChunk]):
    """One request's chunks. Leaving early (``close()``, the end of a ``with`` block, Ctrl-C,
    or dropping the stream) cancels the request; ``result`` then holds what was delivered."""

    def __iter__(self) -> "TokenStream": ...
    def __next__(self) -> TokenChunk: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...
    def complete(self) -> Completion: ...
    @property
    def result(self) -> Optional[Completion]: ...
    def __enter__(self) -> "TokenStream": ...
    def __exit__(self, t: Optional[type], v: Optional[BaseException], tb: Optional[TracebackType]) -> bool: ...

class AsyncTokenStream(AsyncIterator[TokenChunk]):
    def __aiter__(self) -> "AsyncTokenStream": ...
    def __anext__(self) -> Awaitable[TokenChunk]: ...
    def cancel(self) -> None: ...
    def aclose(self) -> Awaitable[None]: ...
    def complete(self) -> Awaitable[Completion]: ...
    @property
    def result(self) -> Optional[Completion]: ...
    def __aenter__(self) -> Awaitable["AsyncTokenStream"]: ...
    def __aexit__(self, t: Optional[type], v: Optional[BaseException], tb: Optional[TracebackType]) -> Awaitable[bool]: ...

class Session:
    def generate(self, input: GenerateInput, **options: Unpack[GenerateOptions]) -> TokenStream: ...
    def complete(self, input: GenerateInput, **options: Unpack[GenerateOptions]) -> Completion: ...
    def agenerate(self, input: GenerateInput, **options: Unpack[GenerateOptions]) -> AsyncTokenStream: ...
    def acomplete(self, input: GenerateInput, **options: Unpack[GenerateOptions]) -> Awaitable[Completion]: ...
    @property
    def history(self) -> List[Message]: ...
    @property
    def busy(self) -> bool: ...
    @property
    def experts(self) -> Union[List[str], Literal["auto"]]: ...
    def set_experts(self, experts: Union[Sequence[str], Literal["auto"]]) -> None: ...
    def set_history(self, messages: Sequence[Message]) -> None: ...
    def save(self, path: Union[str, "os.PathLike[str]"]) -> None: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> "Session": ...
    def __exit__(self, t: Optional[type], v: Optional[BaseException], tb: Optional[TracebackType]) -> bool: ...

class Expert:
    id: int
    name: str
    kind: str
    rank: Optional[int]
    target_modules: List[str]
    bytes: int
    mapped_bytes: int  # of bytes, read in place from the memory-mapped adapter file
    skipped_vision_tensors: int  # vision-tower tensors of a multimodal adapter, not loaded (images are no input)
    num_virtual_tokens: int
    @property
    def manifest(self) -> Optional[Dict[str, Any]]: ...
    @property
    def loaded(self) -> bool: ...
    def unload(self) -> bool: ...

class Runtime:
    @staticmethod
    def load(path: Union[str, "os.PathLike[str]"], **options: Unpack[LoadOptions]) -> "Runtime": ...
    @staticmethod
    def aload(path: Union[str, "os.PathLike[str]"], **options: Unpack[LoadOptions]) -> Awaitable["Runtime"]: ...
    @property
    def info(self) -> RuntimeInfo: ...
    def tokenize(self, text: str, add_special_tokens: bool = True, parse_special_tokens: bool = False) -> List[int]: ...
    def detokenize(self, ids: Sequence[int]) -> str: ...
    def create_session(
        self,
        system: Optional[str] = None,
        experts: Union[Sequence[str], Literal["auto"], None] = None,
        context_shift: Literal["none", "drop-oldest", None] = None,
    ) -> Session: ...
    def restore_session(
        self, path: Union[str, "os.PathLike[str]"], context_shift: Literal["none", "drop-oldest", None] = None
    ) -> Session: ...
    def load_expert(self, path: Union[str, "os.PathLike[str]"], *, name: Optional[str] = None, scale: float = 1.0, mmap: bool = True) -> Expert: ...
    def experts(self) -> List[Expert]: ...
    def embed(self, texts: Sequence[str], **options: Unpack[EmbedOptions]) -> List[List[float]]: ...
    def route(self, input: GenerateInput, history_turns: Optional[int] = None) -> RouteDecision: ...
    def set_router(self, **settings: Unpack[RouterSettings]) -> None: ...
    @property
    def router(self) -> RouterSettings: ...
    def stats(self) -> RuntimeStats: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> "Runtime": ...
    def __exit__(self, t: Optional[type], v: Optional[BaseException], tb: Optional[TracebackType]) -> bool: ...
