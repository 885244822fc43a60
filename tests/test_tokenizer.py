"""Tokenizer loading, encode/decode, chat template and incremental detokenization."""

from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from impl.engine.detokenizer import IncrementalDetokenizer
from impl.model.tokenizer import Tokenizer
from impl.checkpoint_factory.tokenizer_factory import GEMMA_CHAT_TEMPLATE, write_tokenizer_files

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. 12345 + 3.14 = ?",
    "She ordered a café au lait; his plan was naïve.",
    "Emoji 😀🎉 and 👩‍💻, CJK 你好，世界 and Привет",
    "  leading spaces, tabs\tand\nnewlines\n",
    "",
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(str(d))
    return str(d)


@pytest.fixture(scope="module")
def tok(tok_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(tok_dir)


def test_special_tokens_and_vocab(tok):
    assert tok.vocab_size == 512
    assert (tok.pad_token_id, tok.bos_token_id) == (0, 2)
    assert tok.eos_token_ids == {1, 5}  # <eos> and <end_of_turn> (generation_config)
    assert [tok.id_to_token(i) for i in range(6)] == [
        "<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    assert tok.encode("<start_of_turn>user", add_special_tokens=False)[0] == 4


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id and tok.bos_token_id not in ids[1:]
    assert ids[1:] == tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=False) == "<bos>" + text


def test_matches_transformers_tokenizer(tok, tok_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tok_dir)
    for text in TEXTS:
        assert tok.encode(text) == hf(text).input_ids
    msgs = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "café?"}]
    assert tok.apply_chat_template(msgs) == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_chat_template_renders_gemma_turns(tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello! "},
        {"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}]},
    ]
    expected = (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nTwo\nparts<end_of_turn>\n"
    )
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == expected
    assert tok.apply_chat_template(msgs) == expected + "<start_of_turn>model\n"
    ids = tok.encode_chat(msgs)
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert ids.count(4) == 4 and ids.count(5) == 3  # turn markers are single special tokens
    assert tok.decode(ids, skip_special_tokens=False) == expected + "<start_of_turn>model\n"


def test_continue_final_message_ends_the_prompt_inside_the_assistant_turn(tok):
    """vLLM's / SGLang's continue_final_message: the rendered prompt stops after the final assistant message's text
    (no end of turn, no generation prompt), so the model continues that message."""
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The sea is "}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=False, continue_final_message=True)
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nThe sea is"
    ids = tok.encode_chat(msgs, False, None, True)
    assert tok.decode(ids, skip_special_tokens=False) == text
    for bad, words in (((msgs, True), "add_generation_prompt"), ((msgs[:1], False), "final assistant message"),
                       (([*msgs[:1], {"role": "assistant", "content": "  "}], False), "final assistant message")):
        with pytest.raises(ValueError, match=words):
            tok.apply_chat_template(bad[0], add_generation_prompt=bad[1], continue_final_message=True)


def test_chat_template_errors_are_clear(tok):
    with pytest.raises(ValueError, match="alternate"):
        tok.apply_chat_template([{"role": "assistant", "content": "first"}])
    with pytest.raises(ValueError, match="text content parts"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    with pytest.raises(ValueError, match="role"):
        tok.apply_chat_template([{"content": "no role"}])
    with pytest.raises(ValueError, match="neither a readable file"):
        tok.apply_chat_template([{"role": "user", "content": "x"}], template="/no/such/template.jinja")


def test_chat_template_override_from_file_and_missing_template(tok_dir, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    tok = Tokenizer.from_pretrained(tok_dir)
    assert tok.apply_chat_template([{"role": "user", "content": "hey"}], template=str(path)) == "[user] hey\n"
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*--chat-template"):
        tok.apply_chat_template([{"role": "user", "content": "hey"}])
    with open(os.path.join(tok_dir, "tokenizer_config.json")) as f:
        assert json.load(f)["chat_template"] == GEMMA_CHAT_TEMPLATE


def test_missing_tokenizer_json_names_the_folder(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path}.*tokenizer.json"):
        Tokenizer.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="not a folder"):
        Tokenizer.from_pretrained(str(tmp_path / "absent"))


def test_tokenizer_files_are_deterministic(tmp_path, tok_dir):
    write_tokenizer_files(str(tmp_path))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / f).read_bytes() == open(os.path.join(tok_dir, f), "rb").read()


# ---------------------------------------------------------------- incremental detokenizer


def _stream(tok, ids, chunks, prompt_ids=None, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tok, prompt_ids=prompt_ids, skip_special_tokens=skip_special_tokens)
    full = tok.decode(ids, skip_special_tokens=skip_special_tokens)
    deltas, pos = [], 0
    for n in chunks:
        deltas.append(detok.step(ids[pos : pos + n]))
        pos += n
        # emitted text is always a prefix of the final text: nothing is ever retracted
        assert full.startswith("".join(deltas))
    deltas.append(detok.finish())
    return full, deltas, detok


@settings(max_examples=150, deadline=None)
@given(
    ids=st.lists(st.integers(min_value=0, max_value=511), min_size=0, max_size=40),
    seed=st.integers(0, 2**16),
    skip=st.booleans(),
)
def test_incremental_detokenizer_equals_full_decode(tok, ids, seed, skip):
    rng = random.Random(seed)
    chunks, left = [], len(ids)
    while left:
        chunks.append(min(left, rng.randint(1, 4)))
        left -= chunks[-1]
    full, deltas, detok = _stream(tok, ids, chunks, skip_special_tokens=skip)
    assert "".join(deltas) == full == detok.text
    assert detok.output_ids == ids


@pytest.mark.parametrize("text", TEXTS[2:4])
def test_never_emits_partial_characters(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    full, deltas, _ = _stream(tok, ids, [1] * len(ids))
    assert full == text and "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    # multi-byte characters really are split over several tokens here, so hold-back was exercised
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_prompt_context_and_special_tokens(tok):
    prompt = tok.encode("User: hello")
    out = tok.encode(" café 😀", add_special_tokens=False) + [1]
    full, deltas, _ = _stream(tok, out, [1] * len(out), prompt_ids=prompt)
    assert "".join(deltas) == " café 😀" == full
    full, deltas, _ = _stream(tok, out, [len(out)], skip_special_tokens=False)
    assert "".join(deltas) == " café 😀<eos>"
