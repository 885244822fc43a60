"""SGLang-shaped output dicts built from a Req (``text``, ``output_ids``, ``meta_info``).

Logprob entries use SGLang's tuple format ``(logprob, token_id, None)`` (the
third slot is the token text, filled only with ``return_text_in_logprobs``,
which this engine does not offer). ``input_token_logprobs`` runs over prompt
tokens ``logprob_start_len ..``; its first entry is ``(None, id, None)`` when
``logprob_start_len == 0``. Without prompt logprobs (``logprob_start_len``
None or -1) the input lists are empty.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from impl.engine.req import Req


def _triple(pairs):
    return [(lp, tok, None) for lp, tok in pairs]


def _top(entries):
    return [None if e is None else _triple(e) for e in entries]


def build_output(req: Req, decode_text: Callable[[Sequence[int], bool], str] | None) -> dict[str, Any]:
    sp = req.sampling_params
    text = decode_text(req.output_ids, sp.skip_special_tokens) if decode_text is not None else ""
    if req.stop_text_pos is not None and not sp.no_stop_trim:
        text = text[: req.stop_text_pos]
    end = req.finished_time if req.finished_time is not None else time.perf_counter()
    meta: dict[str, Any] = {
        "id": req.rid,
        "prompt_tokens": len(req.origin_input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "finish_reason": None if req.finished_reason is None else req.finished_reason.to_json(),
        "e2e_latency": end - req.created_time,
    }
    if req.first_token_time is not None:
        meta["ttft"] = req.first_token_time - req.created_time
    if req.return_logprob:
        meta.update(
            input_token_logprobs=_triple(req.input_token_logprobs),
            output_token_logprobs=_triple(req.output_token_logprobs),
            input_top_logprobs=_top(req.input_top_logprobs) if req.top_logprobs_num else [],
            output_top_logprobs=_top(req.output_top_logprobs) if req.top_logprobs_num else [],
        )
    return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}


def failed_output(req: Req, message: str) -> dict[str, Any]:
    """The final output of a request whose output could not be built: no text, an error finish reason (500)."""
    end = req.finished_time if req.finished_time is not None else time.perf_counter()
    return {
        "text": "",
        "output_ids": list(req.output_ids),
        "meta_info": {
            "id": req.rid,
            "prompt_tokens": len(req.origin_input_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "finish_reason": {"type": "abort", "message": message, "status_code": 500},
            "e2e_latency": end - req.created_time,
        },
    }
