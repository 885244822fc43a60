"""Per-request work bounds of the HTTP server, each with its ``ServerArgs`` flag.

``RequestLimits.from_args`` reads the flags (a bad value is a ``ValueError`` at
startup); the request models (``protocol.request_models``) bake the limits into
their field ranges, so one model both validates a body and publishes the bounds
in the OpenAPI schema. ``LIMIT_FLAGS`` maps a body field to the flag that
bounds it, so a refusal can name the flag to raise. The context (prompt plus
``max_new_tokens``) is not a limit of the body: the engine's intake policy fits
every request to it (``impl/engine/intake.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

# Defaults: vLLM's --max-logprobs (20, also OpenAI's top_logprobs bound); the others are
# our own (SGLang and vLLM have no such bounds), sized so one request's work stays small.
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 2**20
DEFAULT_MAX_N = 16
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_MAX_STOP_STRINGS = 32
DEFAULT_MAX_STOP_STRING_LEN = 256
DEFAULT_MAX_STOP_TOKEN_IDS = 256
DEFAULT_MAX_LOGPROBS = 20

# body field (last path segment) -> the flag bounding it
LIMIT_FLAGS = {
    "n": "--max-n",
    "text": "--max-batch-size",
    "input_ids": "--max-batch-size",
    "prompt": "--max-batch-size",
    "rid": "--max-batch-size",
    "sampling_params": "--max-batch-size",
    "return_logprob": "--max-batch-size",
    "logprob_start_len": "--max-batch-size",
    "stop": "--max-stop-strings / --max-stop-string-len",
    "stop_token_ids": "--max-stop-token-ids",
    "top_logprobs_num": "--max-logprobs",
    "logprobs": "--max-logprobs",
    "top_logprobs": "--max-logprobs",
}


@dataclass(frozen=True)
class RequestLimits:
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_n: int = DEFAULT_MAX_N
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_stop_strings: int = DEFAULT_MAX_STOP_STRINGS
    max_stop_string_len: int = DEFAULT_MAX_STOP_STRING_LEN
    max_stop_token_ids: int = DEFAULT_MAX_STOP_TOKEN_IDS
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    vocab_size: int = 2**31 - 1  # token ids are in [0, vocab_size)

    @classmethod
    def from_args(cls, args, vocab_size: int | None = None) -> "RequestLimits":
        """The limits given by ``args`` (ServerArgs); ValueError names a flag with an unusable value."""
        values = {}
        for name, low in (("max_request_body_bytes", 1024), ("max_n", 1), ("max_batch_size", 1), ("max_stop_strings", 0),
                          ("max_stop_string_len", 1), ("max_stop_token_ids", 0), ("max_logprobs", 0)):
            v = getattr(args, name, None)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {v!r}")
            values[name] = v
        if vocab_size is not None:
            values["vocab_size"] = int(vocab_size)
        return cls(**values)

    @property
    def max_choices(self) -> int:
        """Requests one HTTP call may expand to (prompts x n)."""
        return self.max_batch_size * self.max_n


def field_name(path: str) -> str:
    """The body field an error's path names: 'prompt' of 'prompt[1][1]', 'stop' of 'sampling_params[0].stop[2]'."""
    return path.split(".")[-1].split("[")[0]


def limit_hint(field: str) -> str:
    """'; raise it with --max-n' for a field a server flag bounds, else ''."""
    flag = LIMIT_FLAGS.get(field_name(field))
    return f" (a server limit: {flag})" if flag else ""
