"""A Gemma-4 MTP assistant distilled from its tiny target, so speculative acceptance is real.

Recipe (seeded, deterministic, a few seconds on 2 cores):

1. the target writes greedy continuations of seeded random prompts (our engine);
2. one target pass over each whole sequence gives, for every row, the final-normed
   hidden state and the K/V of the producer layers the assistant reads;
3. the assistant (started from the random ``init`` checkpoint) is trained to draft
   what it drafts at serving time: at position ``p`` over keys ``0..p`` (the window
   ``p - W .. p`` in sliding layers), from (token ``x[p+1]``, target hidden of row
   ``p``) predict ``x[p+2]``; then, feeding its own projected hidden and (teacher
   forced) ``x[p+2]``, predict ``x[p+3]``, and so on for ``STEPS`` steps. Labels are
   the target's greedy tokens (only generated positions are used);
4. the weights are written through transformers into the HF format (like every
   tiny checkpoint).

``draft_forward`` is a differentiable, dense restatement of the assistant's step
(``impl/model/assistant.py``); ``tests/engine/test_spec_distill.py`` checks that the
two agree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from impl.config.model_config import ModelConfig
from impl.model import rope as rope_mod

STEPS = 3
NUM_PROMPTS = 24
PROMPT_LENS = (1, 40)  # uniform in this range
NEW_TOKENS = 48
TRAIN_ITERS = 120
LR = 3e-3
STEP_WEIGHTS = (1.0, 0.8, 0.6)


@dataclass
class Trace:
    """One sequence through the target: tokens, per-row hidden, producer K/V per assistant layer type."""

    tokens: torch.Tensor  # [L] int64
    first_generated: int  # index of the first generated token
    hidden: torch.Tensor  # [L, backbone] final-normed
    embeds: torch.Tensor  # [L, backbone] target input embeddings (scaled)
    kv: dict[str, tuple[torch.Tensor, torch.Tensor]]  # layer type -> K, V [L, Hkv, D]


def producer_of(draft: ModelConfig, target: ModelConfig, layer_type: str) -> int:
    """The target layer whose K/V an assistant layer of ``layer_type`` reads (last non-shared of that type)."""
    return [j for j in range(target.first_kv_shared_layer) if target.layer_types[j] == layer_type][-1]


@torch.no_grad()
def target_traces(target, draft_config: ModelConfig, seqs: list[list[int]], first_generated: list[int]) -> list[Trace]:
    from impl.attention.torch_native import TorchNativeAttnBackend
    from impl.cache.kv_pool import ReqToTokenPool, TokenToKVPool
    from impl.forward_batch import ForwardBatch, ForwardMode

    cfg = target.config
    total = sum(len(s) for s in seqs)
    kv_pool = TokenToKVPool(cfg, total + 1, target.dtype, "cpu")
    req_pool = ReqToTokenPool(len(seqs), max(len(s) for s in seqs) + 1, "cpu")
    backend = TorchNativeAttnBackend(cfg, kv_pool, req_pool, "cpu")
    slot, rows, locs = 1, [], []
    ids: list[int] = []
    pos: list[int] = []
    for s in seqs:
        r = req_pool.alloc()
        sl = torch.arange(slot, slot + len(s))
        req_pool.req_to_token[r, : len(s)] = sl
        slot += len(s)
        rows.append(r)
        locs.append(sl)
        ids += s
        pos += range(len(s))
    lens = [len(s) for s in seqs]
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND, input_ids=t(ids), positions=t(pos), req_pool_indices=t(rows),
        seq_lens=t(lens), extend_prefix_lens=t([0] * len(seqs)), extend_seq_lens=t(lens), out_cache_loc=torch.cat(locs),
        logits_indices=torch.arange(total), logits_lens_cpu=lens, req_to_token_pool=req_pool, token_to_kv_pool=kv_pool,
        attn_backend=backend,
    )
    out = target.forward(fb)
    embeds = target.embed(fb.input_ids)
    traces, start = [], 0
    for s, sl, g in zip(seqs, locs, first_generated):
        kv = {}
        for lt in set(draft_config.layer_types):
            k_buf, v_buf = kv_pool.get_kv_buffer(producer_of(draft_config, cfg, lt))
            kv[lt] = (k_buf[sl].clone(), v_buf[sl].clone())
        traces.append(Trace(t(s), g, out.hidden_states[start : start + len(s)].clone(),
                            embeds[start : start + len(s)].clone(), kv))
        start += len(s)
    return traces


def _norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def draft_forward(P: dict[str, torch.Tensor], cfg: ModelConfig, emb: torch.Tensor, hidden: torch.Tensor,
                  positions: torch.Tensor, kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
                  masks: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One assistant step for ``B x n`` queries. emb/hidden [B, n, backbone]; positions [B, n]; kv: layer type
    -> K, V [B, L, Hkv, D]; masks: layer type -> [B, n, L] bool (keys each query sees).
    Returns (logits [B, n, V], next hidden [B, n, backbone])."""
    eps = cfg.rms_norm_eps
    h = F.linear(torch.cat([emb, hidden], dim=-1), P["pre_projection.weight"])
    b, n = h.shape[:2]
    rope = {}
    for i, lt in enumerate(cfg.layer_types):
        if lt not in rope:
            inv = rope_mod.rope_inv_freq(cfg.rope[lt], cfg.layer_head_dims[i])
            cos, sin = rope_mod.prepare_rope(*rope_mod.rope_cos_sin(positions.reshape(-1), inv, h.dtype))
            rope[lt] = (cos.view(b, n, 1, -1), sin.view(b, n, 1, -1))
    for i, lt in enumerate(cfg.layer_types):
        pre = f"layers.{i}."
        d, heads = cfg.layer_head_dims[i], cfg.num_attention_heads
        x = _norm(h, P[pre + "input_layernorm.weight"], eps)
        q = F.linear(x, P[pre + "self_attn.q_proj.weight"]).view(b, n, heads, d)
        q = rope_mod.apply_rope_prepared(_norm(q, P[pre + "self_attn.q_norm.weight"], eps), *rope[lt])
        k, v = kv[lt]  # [B, L, Hkv, D]
        g = heads // k.shape[2]
        k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)  # [B, L, H, D]
        scores = torch.einsum("bnhd,blhd->bhnl", q, k).masked_fill(~masks[lt][:, None], float("-inf"))
        a = torch.einsum("bhnl,blhd->bnhd", torch.softmax(scores, dim=-1), v).reshape(b, n, heads * d)
        a = F.linear(a, P[pre + "self_attn.o_proj.weight"])
        h = h + _norm(a, P[pre + "post_attention_layernorm.weight"], eps)
        m = _norm(h, P[pre + "pre_feedforward_layernorm.weight"], eps)
        m = F.linear(F.gelu(F.linear(m, P[pre + "mlp.gate_proj.weight"]), approximate="tanh")
                     * F.linear(m, P[pre + "mlp.up_proj.weight"]), P[pre + "mlp.down_proj.weight"])
        h = (h + _norm(m, P[pre + "post_feedforward_layernorm.weight"], eps)) * P[pre + "layer_scalar"]
    h = _norm(h, P["norm.weight"], eps)
    head = P["embed_tokens.weight"] if cfg.tie_word_embeddings else P["lm_head.weight"]
    return F.linear(h, head), F.linear(h, P["post_projection.weight"])


def query_masks(cfg: ModelConfig, positions: torch.Tensor, key_valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """[B, n, L] keys each query at ``positions`` [B, n] sees: ``j <= p`` and, in sliding layers,
    ``j >= p - W`` (see assistant.py); ``key_valid`` [B, L] masks padding."""
    j = torch.arange(key_valid.shape[1])[None, None, :]
    p = positions[:, :, None]
    out = {}
    for i, lt in enumerate(cfg.layer_types):
        if lt not in out:
            m = (j <= p) & key_valid[:, None, :]
            window = cfg.sliding_window if cfg.is_sliding(i) else None
            if window is not None:
                m = m & (j >= p - window)
            out[lt] = m
    return out


@dataclass
class Batch:
    """Every trace padded to one length; queries (seed rows) padded to one count."""

    positions: torch.Tensor  # [B, n]
    valid: torch.Tensor  # [B, n] real queries
    hidden: torch.Tensor  # [B, n, backbone] seed hidden (row p)
    embeds: torch.Tensor  # [B, n, STEPS, backbone] inputs of each step: x[p+1], x[p+2], ...
    labels: torch.Tensor  # [B, n, STEPS] x[p+2], x[p+3], ...
    kv: dict[str, tuple[torch.Tensor, torch.Tensor]]  # [B, L, Hkv, D]
    masks: dict[str, torch.Tensor]  # [B, n, L]


def make_batch(traces: list[Trace], cfg: ModelConfig) -> Batch:
    """Queries: seed rows p whose labels x[p+2 .. p+1+STEPS] are all generated tokens."""
    L = max(len(t.tokens) for t in traces)
    qs = [torch.arange(max(t.first_generated - 1, 0), len(t.tokens) - 1 - STEPS) for t in traces]
    n = max(len(q) for q in qs)
    B = len(traces)
    pos = torch.zeros(B, n, dtype=torch.int64)
    valid = torch.zeros(B, n, dtype=torch.bool)
    key_valid = torch.zeros(B, L, dtype=torch.bool)
    D = traces[0].hidden.shape[-1]
    hidden = torch.zeros(B, n, D)
    embeds = torch.zeros(B, n, STEPS, D)
    labels = torch.zeros(B, n, STEPS, dtype=torch.int64)
    kv = {lt: (torch.zeros(B, L, *k.shape[1:]), torch.zeros(B, L, *v.shape[1:])) for lt, (k, v) in traces[0].kv.items()}
    for b, (t, q) in enumerate(zip(traces, qs)):
        m = len(q)
        pos[b, :m], valid[b, :m] = q, True
        key_valid[b, : len(t.tokens)] = True
        hidden[b, :m] = t.hidden[q]
        for k in range(STEPS):
            embeds[b, :m, k] = t.embeds[q + 1 + k]
            labels[b, :m, k] = t.tokens[q + 2 + k]
        for lt, (kk, vv) in t.kv.items():
            kv[lt][0][b, : len(t.tokens)] = kk
            kv[lt][1][b, : len(t.tokens)] = vv
    return Batch(pos, valid, hidden, embeds, labels, kv, query_masks(cfg, pos, key_valid))


def distill(target_path: str, init_path: str, seed: int, language_seed: int | None = None) -> dict[str, torch.Tensor]:
    """Train the assistant at ``init_path`` on ``target_path``'s greedy continuations; its state (our names).
    Prompts: uniform random tokens, or sentences of ``MarkovLanguage(vocab, language_seed)`` when given
    (the language the target was trained on, ``impl/checkpoint_factory/markov_language.py``)."""

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order: the build is deterministic
    try:
        return _distill(target_path, init_path, seed, language_seed)
    finally:
        torch.set_num_threads(threads)


def _distill(target_path: str, init_path: str, seed: int, language_seed: int | None) -> dict[str, torch.Tensor]:
    from impl import Engine
    from impl.model.loader import load_model
    from impl.checkpoint_factory.markov_language import MarkovLanguage

    torch.manual_seed(seed)
    rng = random.Random(seed)
    engine = Engine(target_path, attention_backend="torch_native", disable_radix_cache=True, random_seed=seed)
    vocab = engine.model_config.vocab_size
    if language_seed is None:
        prompts = [[rng.randrange(8, vocab) for _ in range(rng.randint(*PROMPT_LENS))] for _ in range(NUM_PROMPTS)]
    else:
        lens = [rng.randint(*PROMPT_LENS) for _ in range(NUM_PROMPTS)]
        prompts = MarkovLanguage(vocab, language_seed).prompts(lens, seed)
    sp = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
    outs = engine.generate(input_ids=prompts, sampling_params=[sp] * len(prompts))
    engine.shutdown()
    target = engine.runner.model
    draft = load_model(init_path)
    cfg = draft.config
    traces = target_traces(target, cfg, [p + o["output_ids"] for p, o in zip(prompts, outs)], [len(p) for p in prompts])
    batch = make_batch(traces, cfg)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in draft.state_dict().items()
              if v.is_floating_point() and not k.startswith("masked_embedding.") and "._" not in k}
    opt = torch.optim.Adam(params.values(), lr=LR)
    for _ in range(TRAIN_ITERS):
        opt.zero_grad()
        step_loss(params, cfg, batch).backward()
        opt.step()
    return {k: v.detach() for k, v in params.items()}


def step_loss(P, cfg: ModelConfig, batch: Batch) -> torch.Tensor:
    hidden = batch.hidden
    total = torch.zeros(())
    for k in range(STEPS):
        # the bonus, then (teacher forced) the tokens the draft should have drafted; the draft's own hidden
        logits, hidden = draft_forward(P, cfg, batch.embeds[:, :, k], hidden, batch.positions, batch.kv, batch.masks)
        ce = F.cross_entropy(logits[batch.valid], batch.labels[:, :, k][batch.valid])
        total = total + STEP_WEIGHTS[k] * ce
    return total


def build_distilled(out_dir: str, target_path: str, init_path: str, seed: int, language_seed: int | None = None) -> None:
    """Write the distilled assistant (HF format, float32) into ``out_dir``."""
    from transformers import Gemma4AssistantForCausalLM

    from impl.checkpoint_factory.hf_quirks import assistant_kv_sharing_patch
    from impl.model.loader import text_name

    state = distill(target_path, init_path, seed, language_seed)
    with assistant_kv_sharing_patch():
        model = Gemma4AssistantForCausalLM.from_pretrained(init_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.state_dict().items():
            ours = text_name(name, False)
            if ours in state:
                p.copy_(state[ours].reshape(p.shape))
        copied = {text_name(name, False) for name in model.state_dict()} & set(state)
    missing = set(state) - copied
    if missing:
        raise RuntimeError(f"distilled weights without a checkpoint name: {sorted(missing)}")
    model.save_pretrained(out_dir, safe_serialization=True)
