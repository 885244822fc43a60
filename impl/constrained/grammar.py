"""Grammars per request: compiled off the scheduler thread, cached by source, one matcher per sequence.

``GrammarBackend`` (one per engine) owns xgrammar's ``GrammarCompiler`` over the
engine's token table (built on first use: ``tokenizer_info.py``). ``compile``
runs on the caller's thread (the HTTP intake pool, or the offline caller),
never on the scheduler thread: the source is checked against ``GrammarLimits``
first, then compiled on the backend's own worker with a timeout; the compiler
caches compiled grammars by source, so a repeated schema compiles once. Any
failure is an ``InvalidGrammar`` naming the request field (a 400), never an
error inside a scheduler step.

``GrammarState`` is one sequence's matcher (``n > 1`` gives each choice its
own): the scheduler fills its row of the token bitmask before sampling, and
advances it with every committed token; the request finishes when the
matcher terminates (the grammar completed and a stop token was taken).
Retraction keeps the state (a retracted request keeps its output tokens,
which the matcher has already consumed).

Kinds (SGLang's ``sampling_params`` names): ``json_schema`` (a JSON Schema
document as a string), ``regex``, ``ebnf`` (xgrammar's GBNF dialect,
``root ::= ...``).
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from impl.constrained.limits import GrammarLimits, InvalidGrammar, check_source

GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
# JSON output is compact (no optional whitespace: a random-weight model would pad with it forever)
JSON_SEPARATORS = (",", ":")


@dataclass(frozen=True)
class GrammarKey:
    """What to compile: the kind and its source text (the cache key)."""

    kind: str  # one of GRAMMAR_KINDS
    source: str


class GrammarState:
    """One sequence's matcher over a compiled grammar."""

    def __init__(self, compiled: Any, vocab_size: int, key: GrammarKey):
        import xgrammar as xgr

        self.key = key
        self.vocab_size = vocab_size  # bitmask width in tokens (the LM head's width)
        self.matcher = xgr.GrammarMatcher(compiled, max_rollback_tokens=-1)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` ([B, ceil(V / 32)] int32)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        return bool(self.matcher.accept_token(int(token)))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)

    @property
    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())


class GrammarBackend:
    """One engine's grammar compiler (SGLang's ``XGrammarGrammarBackend``)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int],
                 limits: GrammarLimits | None = None, compile_threads: int = 1):
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.stop_token_ids = tuple(stop_token_ids)
        self.limits = limits or GrammarLimits()
        self._compile_threads = compile_threads
        self._compiler: Any = None
        self._lock = threading.Lock()
        # compiles run here (not on the caller's thread) so a timeout can return while a hostile one finishes
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")

    @property
    def compiler(self):
        """The compiler over the token table, built once, on first use (a 262,144-entry table takes a moment)."""
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                from impl.constrained.tokenizer_info import build_tokenizer_info

                info = build_tokenizer_info(self.tokenizer, self.vocab_size, self.stop_token_ids)
                self.vocab_size = info.vocab_size
                self._compiler = xgr.GrammarCompiler(info, max_threads=self._compile_threads, cache_enabled=True,
                                                     cache_limit_bytes=256 * 2**20)
            return self._compiler

    def _compile_now(self, key: GrammarKey) -> Any:
        c = self.compiler
        if key.kind == "json_schema":
            return c.compile_json_schema(key.source, any_whitespace=False, separators=JSON_SEPARATORS)
        if key.kind == "regex":
            return c.compile_regex(key.source)
        if key.kind == "ebnf":
            return c.compile_grammar(key.source)
        raise InvalidGrammar(f"unknown grammar kind {key.kind!r}; use one of {GRAMMAR_KINDS}", key.kind)

    def compile(self, key: GrammarKey, field: str | None = None) -> Any:
        """The compiled grammar of ``key`` (cached); InvalidGrammar naming ``field`` (default: the kind)."""
        field = field or key.kind
        check_source(key.kind, key.source, field, self.limits)
        future = self._pool.submit(self._compile_now, key)
        try:
            return future.result(timeout=self.limits.compile_timeout_s)
        except concurrent.futures.TimeoutError:
            raise InvalidGrammar(f"{field} did not compile within {self.limits.compile_timeout_s:g} s; "
                                 "send a simpler grammar", field) from None
        except InvalidGrammar:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar reports a bad grammar as RuntimeError / ValueError
            raise InvalidGrammar(f"{field} could not be compiled: {_reason(e)}", field) from None

    def new_state(self, key: GrammarKey, field: str | None = None) -> GrammarState:
        """A fresh matcher for one sequence (compiling ``key`` if it is not cached)."""
        compiled = self.compile(key, field)
        return GrammarState(compiled, self.vocab_size, key)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _reason(e: BaseException) -> str:
    """xgrammar's message without its C++ source location prefix, bounded."""
    text = str(e).strip()
    if "] " in text[:80] and text.startswith("["):
        text = text.split("] ", 1)[1]
    if ".cc:" in text[:120]:
        text = text.split(": ", 1)[-1]
    text = text.split("The JSON string is:")[0].strip()
    return text[:300]
