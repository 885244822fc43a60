"""Model folders (config.json only) the argument contracts check against.

Neutral HF config dicts with the shapes of public checkpoints; written once per
process into a temp folder named after the model, so log lines name the model
the way an operator would see it.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from typing import Any

SLIDING, FULL = "sliding_attention", "full_attention"


def _pattern(n_sliding: int, reps: int) -> list[str]:
    return ([SLIDING] * n_sliding + [FULL]) * reps


def _gemma4_text(layers: int, shared: int, pattern: list[str], **kw: Any) -> dict[str, Any]:
    cfg = {
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "vocab_size": 262144,
        "hidden_size": 1536,
        "intermediate_size": 6144,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "layer_types": pattern,
        "sliding_window": 512,
        "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": 256,
        "vocab_size_per_layer_input": 262144,
        "use_double_wide_mlp": shared > 0,
        "final_logit_softcapping": 30.0,
    }
    cfg.update(kw)
    return cfg


MODELS: dict[str, dict[str, Any]] = {
    # E2B shapes: 35 layers, 20 KV-shared, [s x4, f] x7
    "gemma-4-E2B-it": _gemma4_text(35, 20, _pattern(4, 7)),
    # E4B shapes: 42 layers, 18 KV-shared, [s x5, f] x7
    "gemma-4-E4B-it": _gemma4_text(42, 18, _pattern(5, 7), hidden_size=2560, num_key_value_heads=2),
    # 31B shapes: 60 layers, no KV sharing
    "gemma-4-31B-it": _gemma4_text(
        60, 0, _pattern(5, 10), hidden_size=5376, num_attention_heads=32, num_key_value_heads=16,
        num_global_key_value_heads=4, attention_k_eq_v=True, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, sliding_window=1024,
    ),
    # multimodal wrapper: text model under text_config
    "gemma-4-E2B-mm": {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": _gemma4_text(35, 20, _pattern(4, 7)),
        "vision_config": {"model_type": "gemma4_vision"},
    },
    "gemma-4-E2B-it-assistant": {
        "model_type": "gemma4_assistant",
        "architectures": ["Gemma4AssistantForCausalLM"],
        "backbone_hidden_size": 1536,
        "text_config": _gemma4_text(
            4, 4, [SLIDING, SLIDING, SLIDING, FULL], hidden_size=256, intermediate_size=1024,
            hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, use_double_wide_mlp=False,
        ),
    },
    "Llama-3.1-8B-Instruct": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    },
    "Qwen2.5-7B-Instruct": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064, "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    },
    "DeepSeek-V3": {
        "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 129280,
        "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    },
    # EAGLE / EAGLE3 draft heads for gemma-4-E2B-it (one Llama decoder layer at the target's hidden size and vocab):
    # the vllm subject's translation of `--speculative-algorithm EAGLE` / `EAGLE3` without a draft
    # (contracts/adapters/vllm_options.py), since vLLM's EAGLE needs a draft model where SGLang's rule does not.
    "EAGLE-gemma-4-E2B-it": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 262144, "hidden_size": 1536,
        "intermediate_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 1,
        "max_position_embeddings": 131072,
    },
    "EAGLE3-gemma-4-E2B-it": {
        "model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 262144, "hidden_size": 1536,
        "intermediate_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 1,
        "max_position_embeddings": 131072,
    },
    # Seed 004 (KV-cache rules): K and V rows of different widths (192 / 128), hybrid sliding window, not MLA.
    "MiMo-V2-Flash": {
        "model_type": "mimo_v2_flash", "architectures": ["MiMoV2FlashForCausalLM"], "vocab_size": 152576,
        "hidden_size": 4096, "num_hidden_layers": 12, "num_attention_heads": 64, "num_key_value_heads": 4,
        "head_dim": 192, "v_head_dim": 128, "swa_head_dim": 192, "swa_v_head_dim": 128,
        "layer_types": _pattern(5, 2), "sliding_window": 128,
        # MiMo's own encoding of the same layer pattern (1 = sliding window), which SGLang reads
        "hybrid_layer_pattern": [1 if t == SLIDING else 0 for t in _pattern(5, 2)],
    },
    # Seed 004: an MLA model with hybrid sliding-window layers (config-only, for the unified-memory DCP rules).
    "MLA-hybrid-SWA-test": {
        "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 129280,
        "hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "layer_types": _pattern(3, 2), "sliding_window": 4096,
        "is_hybrid_swa": True,  # how a config opts into hybrid SWA for an architecture SGLang does not list
    },
}

# Which fixtures are Gemma-4 targets with KV sharing (for oracles in tests).
KV_SHARED_GEMMA4 = ("gemma-4-E2B-it", "gemma-4-E4B-it", "gemma-4-E2B-mm")
GEMMA4_NO_SHARING = ("gemma-4-31B-it",)
NOT_GEMMA4 = ("Llama-3.1-8B-Instruct", "Qwen2.5-7B-Instruct", "DeepSeek-V3")
ASSISTANTS = ("gemma-4-E2B-it-assistant",)


def model_dir(name: str) -> str:
    """Folder holding ``config.json`` for fixture ``name`` (written on first use, and again when the fixture changed)."""
    root = os.path.join(tempfile.gettempdir(), f"yoco-contract-models-{os.getuid()}")
    path = os.path.join(root, name)
    cfg_path = os.path.join(path, "config.json")
    text = json.dumps(MODELS[name], indent=1)
    try:
        with open(cfg_path) as f:
            current = f.read()
    except OSError:
        current = None
    if current != text:
        os.makedirs(path, exist_ok=True)
        tmp = cfg_path + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, cfg_path)
    return path


def argv_for(model: str, *flags: str, draft: str | None = None) -> list[str]:
    argv = ["--model-path", model_dir(model), *flags]
    if draft is not None:
        argv += ["--speculative-draft-model-path", model_dir(draft)]
    return argv


def vocab_size(model_path: str) -> int:
    """vocab_size of the checkpoint folder's config.json (text_config for multimodal/assistant configs)."""
    with open(os.path.join(model_path, "config.json")) as f:
        raw = json.load(f)
    return int(raw.get("vocab_size") or raw["text_config"]["vocab_size"])


def random_prompts(model_path: str, lengths: list[int], seed: int) -> list[list[int]]:
    """Deterministic token-id prompts of the given lengths, skipping the first ids (pad/eos/bos/specials)."""
    rng = random.Random(seed)
    vocab = vocab_size(model_path)
    return [[rng.randrange(8, vocab) for _ in range(n)] for n in lengths]


# Fixture names the seed-004 (KV-cache) contracts use.
E2B = "gemma-4-E2B-it"  # MHA, hybrid sliding window, uniform K/V rows per layer type
DSV3 = "DeepSeek-V3"  # MLA
LLAMA = "Llama-3.1-8B-Instruct"  # MHA, full attention only
MIMO = "MiMo-V2-Flash"  # MHA, K/V rows 192 / 128
MLA_SWA = "MLA-hybrid-SWA-test"  # MLA with sliding-window layers

# argv fragments shared by the seed-004 contracts and their mutants.
UM = ("--enable-unified-memory",)
UM_TRITON = ("--enable-unified-memory", "--attention-backend", "triton")
PREFILL_ONLY_OK = (
    "--prefill-only-disable-kv-cache",
    "--is-embedding",
    "--chunked-prefill-size",
    "-1",
    "--disable-radix-cache",
    "--attention-backend",
    "fa4",  # an FA backend Gemma-4 serves in SGLang (its Gemma-4 backends: trtllm_mha, triton, fa4, ...)
)


def triton_prefill_argv(model_path: str, *flags: str) -> list[str]:
    """Prefill (extend and mixed batches, and a speculative verify) on triton, where fast prefill lives; pure decode
    batches (and draft steps) on torch_native, the fast CPU path, flag or no flag."""
    return ["--model-path", model_path, "--attention-backend", "triton", "--decode-attention-backend", "torch_native",
            *flags]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first step where two token lists differ (None: one is a prefix of the other)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
