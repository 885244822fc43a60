"""Text on the request path: the detokenizer stage's outputs equal a full decode, byte for byte.

UTF-8 characters split over byte-fallback tokens, special tokens kept or skipped,
stop strings spanning tokens, streamed texts that only ever grow.
"""

import time

import pytest

from impl.engine.detokenizer_stage import Emission, build_output
from impl.engine.req import FinishReason
from impl.engine.request_handle import RequestHandle
from impl.engine.detokenizer import IncrementalDetokenizer
from tests.helpers.engines import engine, prompts

TEXT = "Emoji 😀🎉 and 你好, café naïve"


@pytest.mark.parametrize("skip,stops", [(True, ["你好!"]), (False, ["你好!"]), (True, []), (False, [])])
def test_stage_streams_whole_characters_and_ends_with_the_full_decode(skip, stops):
    eng = engine("e2b")
    tok = eng.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    ids = ids[:9] + [tok.bos_token_id] + ids[9:]  # a special token in the middle
    assert len(ids) > len(TEXT) // 2 and "\ufffd" in tok.decode(ids[:8])  # byte-fallback splits characters
    (req,) = eng.expand_requests([[2, 5]], {"skip_special_tokens": skip, "stop": stops})
    req.detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    handle = RequestHandle(req, stream=True)
    texts = []
    for n, t in enumerate(ids, 1):
        req.append_output(t)
        if stops:  # a request with stop strings: the scheduler thread steps its detokenizer
            req.detok.step([t])
        finished = FinishReason("length", length=n) if n == len(ids) else None
        out = build_output(Emission(handle, n, 0, finished, time.perf_counter(), req.detok.text if stops else None))
        assert out.text == "".join(x.text_delta for x in [*texts, out])
        texts.append(out)
    full = tok.decode(ids, skip_special_tokens=skip)
    assert texts[-1].text == full and [i for o in texts for i in o.output_ids_delta] == ids
    for a, b in zip(texts, texts[1:]):
        assert b.text.startswith(a.text)
    for out in texts[:-1]:
        assert not out.text.endswith("\ufffd")  # never half a character
        if stops:
            assert not out.text.endswith(("你", "你好"))  # a stop string may be starting: held back
    assert any(o.text.endswith("😀") for o in texts)


def test_stop_string_spanning_tokens_stops_at_the_same_token_streamed_or_not():
    eng = engine("e2b")
    tok = eng.tokenizer
    sp = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}
    p = prompts(lengths=(7,), seed=11)[0]
    full = eng.generate(input_ids=p, sampling_params=sp)
    ids, text = full["output_ids"], full["text"]
    assert text == tok.decode(ids)
    stop = None
    for k in range(4, len(ids) - 2):  # a stop string across the boundary of tokens k-1 and k
        pos = len(tok.decode(ids[:k]))
        cand = text[pos - 1 : pos + 1]
        if 0 < pos < len(text) - 1 and cand.strip() and "\ufffd" not in cand and text.find(cand) == pos - 1:
            stop = cand
            break
    assert stop is not None, f"no stop string spans two tokens in {text!r}"
    m = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
    o = eng.generate(input_ids=p, sampling_params={**sp, "stop": stop})
    assert o["output_ids"] == ids[:m] and o["text"] == text[: text.find(stop)]
    assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    chunks = list(eng.generate(input_ids=p, sampling_params={**sp, "stop": stop}, stream=True))
    assert chunks[-1]["text"] == o["text"] and chunks[-1]["output_ids"] == o["output_ids"]
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"])
    kept = eng.generate(input_ids=p, sampling_params={**sp, "stop": stop, "no_stop_trim": True})
    assert kept["text"] == tok.decode(ids[:m])
