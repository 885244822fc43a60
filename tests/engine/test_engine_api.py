"""The offline Engine API: SGLang-shaped outputs, logprobs, sampling, stop strings, n, streaming, abort, errors."""

import asyncio

import pytest
import torch

from tests.helpers.engines import engine, hf_model, prompts

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}


def _hf_logprobs(ids):
    with torch.no_grad():
        return torch.log_softmax(hf_model("e2b")(torch.tensor([ids])).logits[0].float(), -1)  # [L, V]


@pytest.mark.slow  # runs transformers beside the engine
def test_prompt_and_output_logprobs_match_transformers():
    eng = engine("e2b", chunked_prefill_size=8)  # prompt logprob rows spread over chunks
    p = prompts(lengths=(21,), seed=3)[0]
    for start in (0, 7):
        o = eng.generate(input_ids=p, sampling_params=GREEDY, return_logprob=True, logprob_start_len=start, top_logprobs_num=3)
        m = o["meta_info"]
        ref = _hf_logprobs(p + o["output_ids"])
        inp = m["input_token_logprobs"]
        assert [t for _, t, _ in inp] == p[start:] and all(x is None for _, _, x in inp)
        if start == 0:
            assert inp[0][0] is None
        for j, (lp, tok, _) in enumerate(inp):
            pos = start + j
            if pos > 0:
                assert lp == pytest.approx(float(ref[pos - 1, tok]), abs=1e-4)
        out = m["output_token_logprobs"]
        assert [t for _, t, _ in out] == o["output_ids"]
        for i, (lp, tok, _) in enumerate(out):
            assert lp == pytest.approx(float(ref[len(p) + i - 1, tok]), abs=1e-4)
            top = m["output_top_logprobs"][i]
            assert len(top) == 3 and top[0][1] == tok  # greedy picks the top-1
        assert len(m["input_top_logprobs"]) == len(p) - start
    eng.check_integrity()


def test_without_prompt_logprobs_input_lists_are_empty():
    o = engine("e2b").generate(input_ids=[2, 5, 9], sampling_params=GREEDY, return_logprob=True)
    assert o["meta_info"]["input_token_logprobs"] == [] and len(o["meta_info"]["output_token_logprobs"]) == 6


def test_return_text_in_logprobs_names_each_token():
    eng = engine("e2b")
    kw = dict(input_ids=[2, 5, 9], sampling_params=GREEDY, return_logprob=True, logprob_start_len=0, top_logprobs_num=1)
    o = eng.generate(**kw, return_text_in_logprobs=True)["meta_info"]
    for lp, tok, text in o["input_token_logprobs"] + o["output_token_logprobs"]:
        assert text == eng.tokenizer.decode([tok], False)
    assert all(t[0][2] == eng.tokenizer.decode([t[0][1]], False) for t in o["output_top_logprobs"])
    streamed = list(eng.generate(**kw, return_text_in_logprobs=True, stream=True))[-1]["meta_info"]
    assert streamed["output_token_logprobs"] == o["output_token_logprobs"]
    assert all(e[2] is None for e in eng.generate(**kw)["meta_info"]["output_token_logprobs"])


def test_seeded_sampling_repeats_exactly_whatever_the_batch():
    eng = engine("e2b")
    sp = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 10, "seed": 42, "ignore_eos": True}
    p = prompts(lengths=(12,), seed=9)[0]
    alone = eng.generate(input_ids=p, sampling_params=sp)["output_ids"]
    batch = eng.generate(input_ids=[prompts()[3], p, prompts()[5]],
                         sampling_params=[{**sp, "seed": 1}, sp, {**sp, "seed": 2}])
    assert batch[1]["output_ids"] == alone
    assert eng.generate(input_ids=p, sampling_params={**sp, "seed": 43})["output_ids"] != alone


def test_n_returns_n_outputs_per_prompt():
    eng = engine("e2b")
    outs = eng.generate(input_ids=[2, 7, 9], sampling_params={"temperature": 1.0, "max_new_tokens": 5, "n": 3, "seed": 0})
    assert isinstance(outs, list) and len(outs) == 3 and len({tuple(o["output_ids"]) for o in outs}) > 1
    batch = eng.generate(input_ids=[[2, 7], [2, 8]], sampling_params={"max_new_tokens": 2, "n": 2})
    assert len(batch) == 4


def test_stop_string_trims_text_and_reports_match():
    eng = engine("e2b")
    p = prompts(lengths=(9,), seed=4)[0]
    full = eng.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 12})
    text = full["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"need a visible stop string in {text!r}"
    o = eng.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 12, "stop": stop})
    assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert o["text"] == text[: text.find(stop)]
    assert o["output_ids"] == full["output_ids"][: len(o["output_ids"])]
    tok = full["output_ids"][3]
    o = eng.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 12, "stop_token_ids": [tok]})
    assert o["output_ids"] == full["output_ids"][: full["output_ids"].index(tok) + 1]
    assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok}


def test_text_prompt_and_streaming_are_cumulative():
    eng = engine("e2b")
    final = eng.generate("The quick brown fox", GREEDY)
    chunks = list(eng.generate("The quick brown fox", GREEDY, stream=True))
    assert len(chunks) == 6
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5, 6]
    assert chunks[-1]["text"] == final["text"] and chunks[-1]["output_ids"] == final["output_ids"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * 5
    assert final["meta_info"]["prompt_tokens"] == len(eng.encode("The quick brown fox"))


def test_abort_during_stream_and_from_another_thread():
    eng = engine("e2b")
    it = eng.generate(input_ids=[2, 5, 6], sampling_params={"max_new_tokens": 50, "ignore_eos": True}, stream=True, rid="victim")
    first = next(it)
    assert first["meta_info"]["finish_reason"] is None
    eng.abort("victim")
    rest = list(it)
    assert rest[-1]["meta_info"]["finish_reason"]["type"] == "abort" and len(rest[-1]["output_ids"]) < 50
    eng.check_integrity()


def test_background_loop_serves_concurrent_submissions():
    from impl import Engine
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    eng = Engine(tiny_checkpoint("noshare"), dtype="float32")
    eng.start_background_loop()
    try:
        handles = [h for p in prompts() for h in eng.submit(eng.expand_requests([p], GREEDY))]
        for h in handles:
            assert h.done.wait(60)
        sync = [h.result().output_ids_delta for h in handles]
        assert all(len(s) == 6 for s in sync)
        (victim,) = eng.submit(eng.expand_requests([[2, 3, 4]], {"max_new_tokens": 10_000 // 10, "ignore_eos": True},
                                                   rid="bg"))
        eng.abort("bg")
        assert victim.done.wait(60) and victim.final.finish_reason.type == "abort"
    finally:
        eng.shutdown()
    eng.check_integrity()


def test_async_engine_generate():
    """The one async API: AsyncEngine.generate takes Engine.generate's arguments."""
    from impl import Engine
    from impl.server.async_engine import AsyncEngine
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    eng = Engine(tiny_checkpoint("noshare"), dtype="float32")
    aeng = AsyncEngine(eng)

    async def main():
        a, b = await asyncio.gather(
            aeng.generate(input_ids=[2, 5, 6], sampling_params=GREEDY),
            aeng.generate(input_ids=[2, 5, 7], sampling_params=GREEDY),
        )
        chunks = [c async for c in await aeng.generate(input_ids=[2, 5, 6], sampling_params=GREEDY, stream=True)]
        return a, b, chunks

    try:
        a, b, chunks = asyncio.run(main())
    finally:
        aeng.shutdown()
    assert a["output_ids"] == eng.generate(input_ids=[2, 5, 6], sampling_params=GREEDY)["output_ids"]
    assert chunks[-1]["output_ids"] == a["output_ids"] and len(b["output_ids"]) == 6
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(input_ids=[2, 3], sampling_params={"temperature": -1}), "temperature"),
        (dict(input_ids=[2, 3], sampling_params={"top_p": 0}), "top_p"),
        (dict(input_ids=[2, 3], sampling_params={"bogus": 1}), "bogus"),
        (dict(input_ids=[]), "empty"),
        (dict(input_ids=[2, 10**6]), "input_ids"),
        (dict(input_ids=[2] * 5000), "prompt has 5000 tokens"),
        (dict(prompt="a", input_ids=[2]), "exactly one"),
        (dict(input_ids=[[2], [3]], sampling_params=[{}]), "sampling_params has 1 entries"),
        (dict(input_ids=[2, 3], return_logprob=True, logprob_start_len=2), "logprob_start_len"),
    ],
)
def test_bad_requests_raise_value_error_naming_the_problem(kwargs, match):
    eng = engine("e2b")
    with pytest.raises(ValueError, match=match):
        eng.generate(**kwargs)
    assert not eng.scheduler.has_work


def test_bad_server_args_and_startup_log():
    from impl import Engine

    with pytest.raises(ValueError, match="no_such_flag"):
        Engine(no_such_flag=1)
    eng = engine("e2b")
    log = "\n".join(eng.startup_log)
    assert "15 of 35 layers hold KV" in log and "bytes per token" in log
    from impl.kernels import cpu_fused

    if cpu_fused.load() is not None:
        assert ("CPU kernels: fused decoder layers (35 of 35, float32 weights) and sliding-window attention (C++ extension, "
                f"{cpu_fused.load().simd_isa()} build); linear layers: ATen mm (weights too small for oneDNN)") in log
    else:
        assert f"CPU kernels: torch ops (fused kernels unavailable: {cpu_fused.error()})" in log
    info = eng.get_server_info()
    assert info["num_kv_layers"] == 15 and info["attention_backend"] == "triton"  # the Gemma-4 default
    if cpu_fused.load() is not None:  # the tiny e2b's weights are under oneDNN's size floor
        assert info["cpu_linear"] == {"mode": "mkl", "reason": "weights too small for oneDNN", "dtype": "float32",
                                      "packed_dots": False}
        assert info["cpu_kernels"]["layers"] == {"fused": 35} and info["cpu_kernels"]["weight_dtype"] == "float32"
        assert info["cpu_kernels"]["routes"] == {"fused, mkl": list(range(35))}  # which path serves which layer
    assert set(eng.work_counters()) >= {"prefill_tokens", "decode_tokens", "cached_tokens", "cross_decoder_rows"}
