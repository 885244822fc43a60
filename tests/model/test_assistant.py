"""The MTP assistant: one draft step over the target's pooled K/V equals transformers' Gemma4AssistantForCausalLM."""

from __future__ import annotations

import functools
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from impl.forward_batch import pack_forward_batch
from impl.model.assistant import draft_span
from impl.model.loader import load_model
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from impl.checkpoint_factory.hf_quirks import assistant_kv_sharing_patch
from tests.helpers.model import ours, prompt, tolerance
from tests.helpers.session import Session

# The draft step itself differs from transformers only in float32 rounding (~3e-6), but it
# reads the target's K/V and hidden state, whose rounding differs too (windowed vs dense
# attention); the bound is the target's: max(10 x transformers' own fp32-vs-fp64 error, 1e-4).


@functools.lru_cache(maxsize=None)
def _hf(name: str):
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    target = Gemma4ForCausalLM.from_pretrained(tiny_checkpoint("e2b"), dtype=torch.float32).eval()
    with assistant_kv_sharing_patch():
        assistant = Gemma4AssistantForCausalLM.from_pretrained(tiny_checkpoint(name), dtype=torch.float32).eval()
    return target, assistant


def _hf_draft(name: str, toks: list[int], steps: int):
    """transformers' candidate-generator recipe: constant position, the target's stored K/V."""
    target, assistant = _hf(name)
    with torch.no_grad():
        o = target(torch.tensor([toks]), output_hidden_states=True, return_shared_kv_states=True)
        hidden, tok, outs = o.hidden_states[-1][:, -1:], torch.tensor([[toks[-1]]]), []
        for _ in range(steps):
            x = torch.cat([target.get_input_embeddings()(tok), hidden], dim=-1)
            a = assistant(inputs_embeds=x, position_ids=torch.tensor([[len(toks) - 1]]), shared_kv_states=o.shared_kv_states)
            outs.append(a)
            tok, hidden = a.logits.argmax(-1), a.last_hidden_state
    return outs


@pytest.mark.parametrize("name", ["assistant", "assistant_ordered"])
@pytest.mark.parametrize("n", [10, 40])  # shorter / longer than the sliding window (16)
def test_draft_steps_match_transformers(name, n):
    target = ours("e2b")
    assistant = load_model(tiny_checkpoint(name))
    assistant.attach_target(target)
    toks = prompt(n, 100 + n)
    s = Session(target)
    out = s.step([("a", toks)])
    r = s.reqs["a"]
    fb = pack_forward_batch([draft_span(r.row, r.length, toks[-1])], "cpu", req_to_token_pool=s.req_pool,
                            token_to_kv_pool=s.kv_pool, attn_backend=s.backend)
    refs = _hf_draft(name, toks, steps=2)
    hidden = out.hidden_states
    tol = tolerance("e2b", [toks])
    for step, ref in enumerate(refs):
        d = assistant(fb, hidden)
        assert (d.logits - ref.logits[0]).abs().max().item() <= tol, f"step {step} logits"
        assert (d.hidden_states - ref.last_hidden_state[0]).abs().max().item() <= tol, f"step {step} hidden"
        fb.input_ids = d.logits.argmax(-1)
        hidden = d.hidden_states


def test_assistant_reads_target_producers_and_checks_shapes():
    target = ours("e2b")
    assistant = load_model(tiny_checkpoint("assistant"))
    assistant.attach_target(target)
    # [s, s, s, f] read the target's last non-shared sliding (13) and full (14) layers
    assert [al.kv_layer_id for al in assistant.attention_layers] == [13, 13, 13, 14]
    assert all(al.is_kv_shared for al in assistant.attention_layers)
    with pytest.raises(ValueError, match="backbone_hidden_size 64 != target hidden_size"):
        assistant.attach_target(SimpleNamespace(config=replace(target.config, hidden_size=48)))
