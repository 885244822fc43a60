"""Gemma-4's function-call format: rendering, parsing (whole and streamed) and the forced-call grammar."""

from __future__ import annotations

import pytest

from impl.tool_calls.chat import prepare_messages
from impl.tool_calls.gemma4 import parse_call, render_call, render_response, split_calls
from impl.tool_calls.grammar import forced_call_grammar
from impl.tool_calls.stream import ToolCallStream

ARGS = {"city": "Paris, {FR} [x]", "days": 3, "ratio": 0.5, "ok": True, "none": None,
        "nested": {"list": [1, "two", False], "empty": {}}}


def test_render_then_parse_round_trips():
    text = "Let me check." + render_call("get_weather", ARGS) + render_call("now", {})
    content, calls = split_calls(text)
    assert content == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", ARGS), ("now", {})]


def test_a_malformed_block_stays_in_the_content():
    bad = "<|tool_call>weather{a:1}<tool_call|>"
    assert split_calls("x" + bad) == ("x" + bad, [])
    with pytest.raises(ValueError):
        parse_call("call:f{a:<|\"|>unterminated}")


@pytest.mark.parametrize("step", [1, 2, 5, 13])
def test_streamed_text_splits_like_the_whole_text(step):
    text = "Hi " + render_call("f", ARGS) + " bye <|tool_ca"
    s = ToolCallStream()
    content, calls = "", []
    for i in range(0, len(text), step):
        c, done = s.feed(text[i : i + step])
        content, calls = content + c, calls + done
    content += s.flush()
    assert (content, calls) == split_calls(text)


def test_tool_results_render_as_gemma4_responses():
    assert render_response("f", '{"t": 21}') == '<|tool_response>response:f{t:21}<tool_response|>'
    assert render_response("f", "sunny") == '<|tool_response>response:f{value:<|"|>sunny<|"|>}<tool_response|>'


def test_messages_without_a_tools_template_carry_declarations_calls_and_results():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    out, extra = prepare_messages(msgs, tools, "{{ messages }}")
    assert extra == {} and [m["role"] for m in out] == ["system", "user", "assistant"]
    assert out[0]["content"].startswith("<|tool>declaration:f{")
    assert out[2]["content"] == render_call("f", {"a": 1}) + render_response("f", "42")
    native, extra = prepare_messages(msgs, tools, "{% for t in tools %}{% endfor %}")
    assert extra == {"tools": tools} and native[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_a_tool_result_after_an_assistant_message_without_content_or_with_parts():
    """A tool result joins the assistant turn before it whatever that turn's content is: absent (a client sends no
    'content' key), or text parts (once a KeyError, a 500, found by the fuzzer)."""
    for prev in ({"role": "assistant"}, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}):
        out, _ = prepare_messages([{"role": "user", "content": "q"}, prev, {"role": "tool", "content": "42"}], [],
                                  "{{ messages }}")
        assert out[-1] == {"role": "assistant", "content": ("a" if "content" in prev else "") +
                           render_response("tool", "42")}


def test_forced_call_grammar_accepts_valid_calls_only():
    import xgrammar as xgr

    tools = [{"type": "function", "function": {"name": "w", "parameters": {
        "type": "object", "properties": {"c": {"enum": ["A", "B"]}, "n": {"type": "integer"}, "o": {"type": "boolean"}},
        "required": ["c"]}}}, {"type": "function", "function": {"name": "z"}}]
    info = xgr.TokenizerInfo([chr(i).encode() for i in range(32, 127)] + [b"<eos>"], vocab_size=96,
                             stop_token_ids=[95])
    g = xgr.GrammarCompiler(info).compile_grammar(forced_call_grammar(tools, None, parallel=False))

    def ok(s: str) -> bool:
        m = xgr.GrammarMatcher(g)
        return m.accept_string(s) and m.accept_token(95)

    assert ok(render_call("w", {"c": "A", "n": -12, "o": True}))
    assert ok(render_call("w", {"c": "B"})) and ok(render_call("z", {}))
    assert not ok(render_call("w", {"n": 1}))  # a required argument missing
    assert not ok(render_call("w", {"c": "C"}))  # outside the enum
    assert not ok(render_call("q", {}))  # an undeclared function
    assert not ok(render_call("z", {}) * 2)  # one call only
