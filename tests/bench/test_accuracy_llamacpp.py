"""llama.cpp on the accuracy yardstick (bench/accuracy_llamacpp.py): reading llama-server's answers and the
converter's folder copy, without llama.cpp."""

from __future__ import annotations

import json
import math
import os

import pytest

from bench.accuracy import score
from bench.accuracy_llamacpp import eog_count, gguf_ready_copy, llamacpp_dense, whole_piece_id
from bench.accuracy_settings import Setting


def answer(entries: list[tuple[int, float]], key: str = "top_logprobs") -> dict:
    """A /completion answer with one predicted token and its list (llama-server's field names)."""
    top = [{"id": i, "token": "x", "bytes": [120], "logprob" if key == "top_logprobs" else "prob": v}
           for i, v in entries]
    return {"tokens": [entries[0][0]], "completion_probabilities": [{"id": entries[0][0], "logprob": entries[0][1],
                                                                     key: top}]}


def test_a_full_list_becomes_logprobs_by_id_in_any_order():
    lp = [math.log(0.7), math.log(0.2), math.log(0.1)]
    assert llamacpp_dense(answer([(2, lp[0]), (0, lp[1]), (1, lp[2])]), 3) == [lp[1], lp[2], lp[0]]


def test_a_truncated_or_post_sampling_list_is_refused():
    with pytest.raises(ValueError, match="truncated"):
        llamacpp_dense(answer([(2, -0.1), (0, -2.4)]), 3)
    with pytest.raises(ValueError, match="post-sampling"):
        llamacpp_dense(answer([(0, 0.5), (1, 0.5)], key="top_probs"), 2)
    with pytest.raises(ValueError, match="no completion_probabilities"):
        llamacpp_dense({"tokens": [3], "content": "\ufffd"}, 2)  # a token held back inside a UTF-8 character


def test_score_takes_any_engines_paths_and_distributions():
    p, q = [math.log(0.9), math.log(0.1)], [math.log(0.6), math.log(0.4)]
    ref_paths, cand_paths = [[0, 0], [0, 0]], [[0, 0], [0, 1]]
    ref_tf = [(i, t, p) for i in range(2) for t in range(2)]
    cand_tf = [(i, t, p if i == 0 else q) for i in range(2) for t in range(2)]
    r = score(Setting("t", (), (), "test"), 2, ref_paths, cand_paths, ref_tf, cand_tf)
    assert r.identical == 0.5 and r.mean_prefix == 1.5 and r.first_token == 1.0
    kl = 0.9 * math.log(0.9 / 0.6) + 0.1 * math.log(0.1 / 0.4)
    assert r.mean_kl == pytest.approx(kl / 2) and r.max_kl == pytest.approx(kl)
    assert r.tf_top1 == 1.0 and r.reference_tf_top1 == 1.0


def test_eog_ids_on_the_paths_are_counted():
    assert eog_count([[8, 1, 9], [5, 5]], [1, 5]) == 3


def test_the_converter_copy_links_the_weights_and_has_a_gemma_tokenizer_of_the_same_size(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"vocab_size": 512, "max_position_embeddings": 2048}))
    (src / "model.safetensors").write_bytes(b"weights")
    (src / "tokenizer.json").write_text("{}")  # the byte-level one: not copied
    dest = gguf_ready_copy(str(src), str(tmp_path / "hf"), 512)
    assert os.path.realpath(os.path.join(dest, "model.safetensors")) == os.path.realpath(src / "model.safetensors")
    with open(os.path.join(dest, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    assert len(tok["model"]["vocab"]) == 512 and tok["model"]["byte_fallback"]
    assert "<0xEF>" in tok["model"]["vocab"]
    assert whole_piece_id(dest) == tok["model"]["vocab"]["a"]
    assert gguf_ready_copy(str(src), str(tmp_path / "hf"), 512) == dest  # made once
