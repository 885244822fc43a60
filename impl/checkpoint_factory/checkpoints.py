"""Deterministic tiny Gemma-4 checkpoints in HF format, built with transformers.

``tiny_checkpoint(name)`` returns the folder of a checkpoint (config.json,
model.safetensors in float32, tokenizer.json, tokenizer_config.json,
generation_config.json), building it on first use. Folders are cached under
``<repo>/.cache/checkpoints/<name>-<hash>`` (``$YOCO_CACHE_DIR/checkpoints``
when set); the hash covers the recipe, the source of the factory modules (this file,
tokenizer_factory.py, corpus.py) and the transformers version, so an edit to
any of them makes a new folder (old ones are left in place). Building is atomic (temp folder + ``os.rename``) and serialized
across processes with an ``fcntl`` lock.

Weights are seeded random, re-initialised so that activations and logits are
varied (fan-in scaled linears, norm scales near but not equal to 1,
``layer_scalar`` != 1, a spread-out MoE router) rather than transformers'
near-degenerate 0.02 init.

CLI: ``python -m impl.checkpoint_factory.checkpoints NAME...`` builds and prints paths.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from impl.envs import envs
from impl.checkpoint_factory.corpus import CORPUS
from impl.checkpoint_factory.tokenizer_factory import (
    BOS_ID,
    EOS_ID,
    GEMMA_CHAT_TEMPLATE,
    PAD_ID,
    TOKENIZER_VOCAB_SIZE,
    write_tokenizer_files,
)

# The server's default model is chosen in impl.models_builtin (what the launcher imports); named here too for the
# tests and the in-process contract subject, which build every checkpoint through this module.
from impl.models_builtin import DEFAULT_MODEL, default_model_path  # noqa: F401

if TYPE_CHECKING:
    import torch

FACTORY_VERSION = 1
CACHE_ENV = envs.YOCO_CACHE_DIR.name

S, F = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class CheckpointRecipe:
    """How to build one tiny checkpoint.

    ``text_config``: kwargs of ``Gemma4TextConfig`` (for an assistant, its
    text_config). ``assistant``: extra kwargs of ``Gemma4AssistantConfig``;
    empty for a text model. ``on_demand``: not built by ``build_all``.
    """

    # "text" | "assistant" | "distilled" (an assistant trained on its target, impl/checkpoint_factory/distill.py) |
    # "trained" (a text recipe trained on a synthetic Markov language, impl/checkpoint_factory/markov_language.py)
    kind: str
    text_config: Mapping[str, Any]
    assistant: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    on_demand: bool = False
    # write config.json the way published checkpoints do (global_head_dim and
    # num_global_key_value_heads, no per_layer_config) instead of transformers' form
    published_config_form: bool = False
    description: str = ""
    # dtype the weights are built and stored in: "bfloat16" halves the build's memory and the files
    # of the real-dimension recipes (the engine loads them in whatever --dtype asks for)
    dtype: str = "float32"
    # kind "distilled": (target checkpoint, initial assistant checkpoint); a "trained" target's
    # distillation prompts are sentences of its language
    distill_from: tuple[str, str] | None = None
    # kind "trained": the random-weight recipe it starts from (same text_config); seed = the language's
    train_from: str | None = None
    # kind "streamed" (impl/checkpoint_factory/full_size.py: written tensor by tensor, never held in memory):
    # {"vision": ..., "audio": ...} configs of small towers for the multimodal layout
    # (Gemma4ForConditionalGeneration, text weights under model.language_model.*); empty: text layout
    towers: Mapping[str, Any] = field(default_factory=dict)
    # kind "text": multipliers on reinit_weights' scales ("post_norm": the post_* norms, "qk_norm": q_norm /
    # k_norm, "embed": the token embeddings); empty: the default init. Kind "streamed": non-empty selects the
    # well-conditioned init (impl/checkpoint_factory/well_conditioned.py) with these of its scales changed
    init: Mapping[str, float] = field(default_factory=dict)
    # kind "streamed": "byte_level" (tokenizer_factory.py, the tiny checkpoints' byte-level BPE) or "gemma"
    # (gemma_tokenizer.py: BPE with byte fallback and '\u2581' for spaces, the published tokenizer's form)
    tokenizer: str = "byte_level"


def _text(**overrides: Any) -> dict[str, Any]:
    """Common tiny text config; every recipe states its shape-defining keys."""
    base: dict[str, Any] = dict(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        head_dim=16,
        global_head_dim=32,
        sliding_window=16,
        final_logit_softcapping=30.0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        tie_word_embeddings=True,
        attention_k_eq_v=False,
        enable_moe_block=False,
        use_double_wide_mlp=False,
        num_kv_shared_layers=0,
    )
    base.update(overrides)
    base["num_hidden_layers"] = len(base["layer_types"])
    return base


_E2B_LAYERS = [S, S, S, S, F] * 7

def _e2b_bench_text(hidden: int, head_dim: int, window: int, ple: int) -> dict[str, Any]:
    """The E2B structure (35 layers, 20 KV-shared, 8 query / 1 KV heads, double-wide shared MLPs) at a
    benchmark width: MLP 4x hidden, full-attention heads twice the sliding ones."""
    return _text(
        layer_types=_E2B_LAYERS,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=head_dim,
        global_head_dim=2 * head_dim,
        sliding_window=window,
        max_position_embeddings=8192,
        num_kv_shared_layers=20,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=ple,
        vocab_size_per_layer_input=TOKENIZER_VOCAB_SIZE,
    )


_E2B_TEXT = _text(
    layer_types=_E2B_LAYERS,
    num_key_value_heads=1,
    num_kv_shared_layers=20,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=TOKENIZER_VOCAB_SIZE,
)

# Both assistants share their text stack: 4 all-shared layers over the 'e2b' target's K/V.
_ASSISTANT_TEXT = _text(
    layer_types=[S, S, S, F],
    hidden_size=32,
    intermediate_size=64,
    num_key_value_heads=1,
    num_kv_shared_layers=4,
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=0,
)

# Gemma-4 E2B's layer dimensions (docs/full-size.md) with the tiny tokenizer's vocabulary:
# hidden 1536, 8 query heads / 1 KV head, head_dim 256 sliding / 512 full, MLP 6144 (12288 on the
# KV-shared layers), window 512, PLE 256, transformers' default Gemma-4 RoPE (sliding: default, theta
# 1e4; full: proportional, partial_rotary_factor 0.25, theta 1e6), final logit softcap 30.
_E2B_DIMS = dict(
    hidden_size=1536,
    intermediate_size=6144,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=256,
    global_head_dim=512,
    sliding_window=512,
    max_position_embeddings=8192,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=256,
    vocab_size_per_layer_input=TOKENIZER_VOCAB_SIZE,
)

# The published Gemma-4 E2B text model at full size (docs/full-size.md; transformers 5.23's
# Gemma4TextConfig defaults for the RoPE settings, stated explicitly): vocabulary 262144, PLE table
# 262144 x (35 * 256), 4.63 B parameters.
_E2B_FULL_TEXT: dict[str, Any] = dict(
    vocab_size=262_144,
    vocab_size_per_layer_input=262_144,
    hidden_size=1536,
    intermediate_size=6144,
    num_hidden_layers=35,
    layer_types=_E2B_LAYERS,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=256,
    global_head_dim=512,
    sliding_window=512,
    num_kv_shared_layers=20,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=256,
    final_logit_softcapping=30.0,
    rope_parameters={
        S: {"rope_type": "default", "rope_theta": 10_000.0},
        F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
    max_position_embeddings=131_072,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
    attention_k_eq_v=False,
    enable_moe_block=False,
    pad_token_id=PAD_ID,
    eos_token_id=EOS_ID,
    bos_token_id=BOS_ID,
)

# Small vision and audio towers for the multimodal layout (the loader skips them; what matters is that
# their tensors are there, named and shaped as transformers 5.23 saves Gemma4ForConditionalGeneration).
_SMALL_TOWERS: dict[str, Any] = {
    "vision": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, position_embedding_size=64),
    "audio": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[8, 4],
                  output_proj_dims=64),
}

TINY_CHECKPOINTS: dict[str, CheckpointRecipe] = {
    "e2b": CheckpointRecipe(
        kind="text",
        seed=1,
        description="E2B-shaped: 35 layers, 20 KV-shared, [s x4, f] x7, double-wide MLP, PLE, 1 KV head",
        text_config=_E2B_TEXT,
    ),
    "k_eq_v": CheckpointRecipe(
        kind="text",
        seed=2,
        published_config_form=True,
        description="attention_k_eq_v (global KV heads 1, sliding KV heads 2), 10 layers, 4 KV-shared, PLE",
        text_config=_text(
            layer_types=[S, S, S, S, F] * 2,
            num_key_value_heads=2,
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            num_kv_shared_layers=4,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=TOKENIZER_VOCAB_SIZE,
        ),
    ),
    "moe": CheckpointRecipe(
        kind="text",
        seed=3,
        published_config_form=True,
        description="MoE block (4 experts, top-2) beside the dense MLP, 6 layers, no sharing, no PLE",
        text_config=_text(
            layer_types=[S, S, F] * 2,
            num_key_value_heads=2,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=32,
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0,
        ),
    ),
    "noshare": CheckpointRecipe(
        kind="text",
        seed=4,
        description="no KV sharing, 6 layers, PLE",
        text_config=_text(
            layer_types=[S, S, F] * 2,
            num_key_value_heads=2,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=TOKENIZER_VOCAB_SIZE,
        ),
    ),
    "assistant": CheckpointRecipe(
        kind="assistant",
        seed=5,
        description="MTP assistant for 'e2b': 4 all-shared layers, hidden 32, backbone 64, plain LM head",
        text_config=_ASSISTANT_TEXT,
        assistant=dict(backbone_hidden_size=64, use_ordered_embeddings=False),
    ),
    "assistant_ordered": CheckpointRecipe(
        kind="assistant",
        seed=6,
        description="MTP assistant for 'e2b' with the ordered-embedding (centroid-masked) LM head",
        text_config=_ASSISTANT_TEXT,
        assistant=dict(
            backbone_hidden_size=64,
            use_ordered_embeddings=True,
            num_centroids=32,
            centroid_intermediate_top_k=4,
        ),
    ),
    "assistant_distilled": CheckpointRecipe(
        kind="distilled",
        seed=8,
        description="MTP assistant for 'e2b' distilled from it (the 'assistant' recipe trained on e2b's greedy continuations)",
        text_config=_ASSISTANT_TEXT,
        assistant=dict(backbone_hidden_size=64, use_ordered_embeddings=False),
        distill_from=("e2b", "assistant"),
    ),
    # The speculative benchmark's pair (make bench-spec): e2b trained on a synthetic language with
    # learnable structure, and the assistant distilled from it. On demand: ~1 min to build on one core.
    "e2b_markov": CheckpointRecipe(
        kind="trained",
        seed=12,
        on_demand=True,
        description="the 'e2b' checkpoint trained on MarkovLanguage(512, seed 12) (impl/checkpoint_factory/markov_language.py): "
        "predictable greedy continuations",
        text_config=_E2B_TEXT,
        train_from="e2b",
    ),
    "assistant_markov": CheckpointRecipe(
        kind="distilled",
        seed=13,
        on_demand=True,
        description="MTP assistant for 'e2b_markov' distilled from it on sentences of its language",
        text_config=_ASSISTANT_TEXT,
        assistant=dict(backbone_hidden_size=64, use_ordered_embeddings=False),
        distill_from=("e2b_markov", "assistant"),
    ),
    # The fp8 KV agreement contract's checkpoint: the random e2b turns any KV rounding into other greedy tokens
    # (bf16 KV against float32 KV: 3 of 24 sequences equal), the trained e2b_markov barely reads its KV (a
    # Markov language). This init keeps residual-dominated layers and moderate attention scores: bf16 vs
    # float32 KV 24 of 24, and a misread K scale still changes most outputs.
    "e2b_calm": CheckpointRecipe(
        kind="text",
        seed=14,
        description="the e2b structure with a well-conditioned random init (post-norm scales 1 instead of 3, "
        "q/k-norm scales 0.3, embeddings 3x): greedy outputs stable under KV rounding",
        text_config=_E2B_TEXT,
        init={"post_norm": 1.0 / 3.0, "qk_norm": 0.3, "embed": 3.0},
    ),
    "e2b_bench": CheckpointRecipe(
        kind="text",
        seed=7,
        on_demand=True,
        description="e2b structure at benchmark size: hidden 256, 8 heads, head_dim 32/64, window 128",
        text_config=_e2b_bench_text(hidden=256, head_dim=32, window=128, ple=16),
    ),
    "e2b_bench_wide": CheckpointRecipe(
        kind="text",
        seed=10,
        on_demand=True,
        description="e2b structure, wider (the peer benchmark's larger checkpoint): hidden 512, 8 heads, head_dim "
        "64/128, window 256, MLP 2048 (4096 shared), PLE 32",
        text_config=_e2b_bench_text(hidden=512, head_dim=64, window=256, ple=32),
    ),
    "e2b_bench_bf16": CheckpointRecipe(
        kind="text",
        seed=7,
        on_demand=True,
        dtype="bfloat16",
        description="e2b_bench with PLE 256, stored in bf16 (seconds to build): every linear weight is above oneDNN's "
        "size floor, so the CPU kernels take the prepacked bf16 matmul (--enable-deterministic-inference's tests)",
        text_config=_e2b_bench_text(hidden=256, head_dim=32, window=128, ple=256),
    ),
    # Benchmark checkpoints at real dimensions: on demand only (never built by make test / build_all).
    "e2b-dims": CheckpointRecipe(
        kind="text",
        seed=8,
        on_demand=True,
        dtype="bfloat16",
        description="Gemma-4 E2B layer dimensions, 35 layers / 20 KV-shared, [s x4, f] x7, vocabulary 512 (bf16 weights, "
        "3.7 GB; 7.4 GB loaded as float32)",
        text_config=_text(layer_types=_E2B_LAYERS, num_kv_shared_layers=20, **_E2B_DIMS),
    ),
    "e2b-dims-7l": CheckpointRecipe(
        kind="text",
        seed=9,
        on_demand=True,
        description="E2B layer dimensions in 7 layers (self: s s f, KV-shared: s s s f; the 15:20 split of 35 as 3:4): "
        "what a shared 2-core / 24 GB machine can load in float32 (1.5 GB)",
        text_config=_text(layer_types=[S, S, F, S, S, S, F], num_kv_shared_layers=4, **_E2B_DIMS),
    ),
    # The streamed writer's CI recipe: 'e2b' in the multimodal layout (towers skipped by the loader).
    "e2b-mm": CheckpointRecipe(
        kind="streamed",
        seed=1,
        description="'e2b' text shape in the multimodal layout (Gemma4ForConditionalGeneration, small towers), "
        "written by the streamed writer (impl/checkpoint_factory/full_size.py)",
        text_config=_E2B_TEXT,
        towers=_SMALL_TOWERS,
    ),
    # The 262144-entry vocabulary on a 2-layer model (sampling, logprobs, detokenizer and stop strings at
    # Gemma-4's vocabulary size, in CI): 34 MB.
    "vocab262k": CheckpointRecipe(
        kind="streamed",
        seed=23,
        description="2 layers, hidden 32, Gemma-4's 262144-entry vocabulary and a 262144-entry tokenizer",
        text_config=_text(
            layer_types=[S, F],
            vocab_size=262_144,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            global_head_dim=32,
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0,
        ),
    ),
    # Gemma-4 E2B at full size: on demand only (never built by make test / build_all; ~9.3 GB each, a few
    # minutes to write, under `flock -x` on shared machines).
    "e2b-full": CheckpointRecipe(
        kind="streamed",
        seed=22,
        on_demand=True,
        dtype="bfloat16",
        published_config_form=True,
        description="the published Gemma-4 E2B text shape at full size: vocabulary 262144, PLE 262144 x 8960, "
        "35 layers / 20 KV-shared, 4.63 B parameters, bf16 (9.3 GB), a 262144-entry tokenizer",
        text_config=_E2B_FULL_TEXT,
    ),
    # e2b-full's shape with weights drawn so the model is well conditioned (impl/checkpoint_factory/well_conditioned.py):
    # float32 rounding does not grow with the prompt, every layer matters, the next token is peaked. The
    # checkpoint `make parity-full` and the full-size accuracy yardstick run on; bench/conditioning.py measures it.
    "e2b-full-wc": CheckpointRecipe(
        kind="streamed",
        seed=24,
        on_demand=True,
        dtype="bfloat16",
        published_config_form=True,
        description="e2b-full's published shape (vocabulary 262144, 35 layers / 20 KV-shared, bf16, 9.3 GB) with "
        "well-conditioned weights (small attention logits, small per-layer residual contributions, a peaked "
        "LM head) and a Gemma-style tokenizer (BPE with byte fallback, '\u2581' for spaces)",
        text_config=_E2B_FULL_TEXT,
        init={"embed_std": 0.03},
        tokenizer="gemma",
    ),
    "e2b-full-mm": CheckpointRecipe(
        kind="streamed",
        seed=22,
        on_demand=True,
        dtype="bfloat16",
        description="e2b-full's weights in the published multimodal layout (Gemma4ForConditionalGeneration, "
        "text under model.language_model.*, small vision and audio towers), as transformers 5.23 saves it",
        text_config=_E2B_FULL_TEXT,
        towers=_SMALL_TOWERS,
    ),
    "assistant_bench": CheckpointRecipe(
        kind="assistant",
        seed=11,
        on_demand=True,
        description="MTP assistant for 'e2b_bench' (the serving campaign's MTP columns): 4 all-shared layers, "
        "hidden 64, backbone 256, its target's heads and window",
        text_config=_text(
            layer_types=[S, S, S, F],
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=32,
            global_head_dim=64,
            sliding_window=128,
            max_position_embeddings=8192,
            num_kv_shared_layers=4,
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0,
        ),
        assistant=dict(backbone_hidden_size=256, use_ordered_embeddings=False),
    ),
}

# the assistant recipes must fit the target they draft for
ASSISTANT_TARGETS = {"assistant": "e2b", "assistant_ordered": "e2b", "assistant_distilled": "e2b",
                     "assistant_bench": "e2b_bench", "assistant_markov": "e2b_markov"}


# ---------------------------------------------------------------- paths


def repo_root() -> str | None:
    """The folder holding pyproject.toml above this file, or None when installed elsewhere."""
    here = os.path.dirname(os.path.abspath(__file__))
    while True:
        if os.path.isfile(os.path.join(here, "pyproject.toml")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def cache_root() -> str:
    """``$YOCO_CACHE_DIR`` or ``<repo>/.cache`` (``~/.cache/yoco`` outside a checkout)."""
    env = envs.YOCO_CACHE_DIR.get()
    if env:
        return os.path.abspath(env)
    root = repo_root()
    return os.path.join(root, ".cache") if root else os.path.join(os.path.expanduser("~"), ".cache", "yoco")


def _transformers_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "absent"


def _factory_sources() -> str:
    """Source of the modules that build checkpoints: any edit to them means new folders."""
    import impl.checkpoint_factory.corpus as corpus_mod
    import impl.checkpoint_factory.distill as distill_mod
    import impl.checkpoint_factory.markov_language as markov_mod
    import impl.checkpoint_factory.tokenizer_factory as tok_mod

    texts = []
    for mod_file in (__file__, tok_mod.__file__, corpus_mod.__file__, distill_mod.__file__, markov_mod.__file__):
        with open(mod_file, encoding="utf-8") as f:
            texts.append(f.read())
    return "\n".join(texts)


def recipe_hash(name: str) -> str:
    """Short hash of everything that determines the files of checkpoint ``name``.

    Streamed recipes (the full-size ones) hash the recipe, the streamed writer's ``FORMAT_VERSION`` and
    the transformers version, not the factory's source: an unrelated edit must not rebuild 9 GB
    (``full_size.py`` says what guards the version instead)."""
    recipe = _recipe(name)
    if recipe.kind == "streamed":
        from impl.checkpoint_factory import full_size

        files = {k: v for k, v in asdict(recipe).items() if k not in ("description", "on_demand")}  # not in the files
        if files["tokenizer"] == "byte_level":  # the field's default: the recipes written before it keep their key
            del files["tokenizer"]
        payload = json.dumps({"name": name, "recipe": files, "format": full_size.FORMAT_VERSION,
                              "transformers": _transformers_version()}, sort_keys=True)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]
    payload = json.dumps(
        {
            "name": name,
            "recipe": asdict(recipe),
            "corpus": CORPUS,
            "chat_template": GEMMA_CHAT_TEMPLATE,
            "factory_version": FACTORY_VERSION,
            "factory_sources": hashlib.sha256(_factory_sources().encode("utf-8")).hexdigest(),
            "transformers": _transformers_version(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]


def checkpoint_dir(name: str) -> str:
    """Where checkpoint ``name`` lives (whether or not it is built yet)."""
    return os.path.join(cache_root(), "checkpoints", f"{name}-{recipe_hash(name)}")


def _recipe(name: str) -> CheckpointRecipe:
    if name not in TINY_CHECKPOINTS:
        raise ValueError(f"unknown tiny checkpoint {name!r}; choose one of {sorted(TINY_CHECKPOINTS)}")
    return TINY_CHECKPOINTS[name]


# ---------------------------------------------------------------- public API


def tiny_checkpoint(name: str) -> str:
    """Path of the tiny checkpoint ``name``, built (once, atomically) if missing."""
    final = checkpoint_dir(name)
    if os.path.isdir(final):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    with _file_lock(os.path.join(parent, f".{os.path.basename(final)}.lock")):
        if os.path.isdir(final):  # another process built it while we waited
            return final
        tmp = tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=parent)
        try:
            build_checkpoint(name, tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def build_all(include_on_demand: bool = False) -> dict[str, str]:
    return {n: tiny_checkpoint(n) for n, r in TINY_CHECKPOINTS.items() if include_on_demand or not r.on_demand}


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------- building


def build_checkpoint(name: str, out_dir: str) -> None:
    """Write checkpoint ``name`` into the existing folder ``out_dir`` (no caching)."""
    try:
        import torch
        from transformers import (
            Gemma4AssistantConfig,
            Gemma4AssistantForCausalLM,
            Gemma4ForCausalLM,
            Gemma4TextConfig,
        )
    except ImportError as e:  # transformers is a test dependency only
        raise ValueError(
            f"building the tiny checkpoint {name!r} needs transformers (pip install -e '.[test]'), "
            "or pass --model-path to an existing HF checkpoint"
        ) from e

    from impl.checkpoint_factory.hf_quirks import assistant_kv_sharing_patch

    recipe = _recipe(name)
    if recipe.kind == "streamed":
        from impl.checkpoint_factory import full_size

        full_size.check_room(recipe, out_dir)
        full_size.write_streamed(recipe, out_dir, log=lambda m: print(f"[{name}] {m}", file=sys.stderr, flush=True))
        return
    if recipe.kind == "distilled":
        from impl.checkpoint_factory.distill import build_distilled

        assert recipe.distill_from is not None  # a distilled recipe names its target and its init
        target, init = recipe.distill_from
        target_recipe = _recipe(target)
        language_seed = target_recipe.seed if target_recipe.kind == "trained" else None
        with _quiet_transformers():
            build_distilled(out_dir, tiny_checkpoint(target), tiny_checkpoint(init), recipe.seed, language_seed)
        write_tokenizer_files(out_dir, model_max_length=int(recipe.text_config["max_position_embeddings"]))
        return
    if recipe.kind == "trained":
        from impl.checkpoint_factory.markov_language import train_target

        assert recipe.train_from is not None, f"the trained recipe {name!r} names the checkpoint it trains from"
        with _quiet_transformers():
            train_target(tiny_checkpoint(recipe.train_from), out_dir, recipe.seed)
        write_tokenizer_files(out_dir, model_max_length=int(recipe.text_config["max_position_embeddings"]))
        return
    torch.manual_seed(recipe.seed)
    dtype = getattr(torch, recipe.dtype)
    text_config = Gemma4TextConfig(**dict(recipe.text_config))
    saved_default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the stored dtype: no float32 copy of a large model
    try:
        model: Gemma4ForCausalLM | Gemma4AssistantForCausalLM
        if recipe.kind == "text":
            model = Gemma4ForCausalLM(text_config)
        elif recipe.kind == "assistant":
            config = Gemma4AssistantConfig(text_config=text_config, **dict(recipe.assistant))
            with assistant_kv_sharing_patch():
                model = Gemma4AssistantForCausalLM(config)
        else:
            raise ValueError(f"recipe {name!r} has unknown kind {recipe.kind!r}")
    finally:
        torch.set_default_dtype(saved_default)
    model = model.to(dtype).eval()
    reinit_weights(model, seed=recipe.seed, init=recipe.init)
    model.config.dtype = dtype
    with _quiet_transformers():
        model.save_pretrained(out_dir, safe_serialization=True)
    if recipe.published_config_form:
        rewrite_published_config_form(os.path.join(out_dir, "config.json"), recipe.text_config)
    write_tokenizer_files(out_dir, model_max_length=int(text_config.max_position_embeddings))


def rewrite_published_config_form(config_path: str, text_config: Mapping[str, Any]) -> None:
    """Replace transformers' ``per_layer_config`` by the published top-level keys."""
    with open(config_path) as f:
        cfg = json.load(f)
    target = cfg.get("text_config", cfg)
    target.pop("per_layer_config", None)
    target["global_head_dim"] = text_config["global_head_dim"]
    if text_config.get("num_global_key_value_heads") is not None:
        target["num_global_key_value_heads"] = text_config["num_global_key_value_heads"]
    with open(config_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Hide transformers' per-shard progress bar while saving."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def init_rule(pname: str, shape) -> tuple:
    """How the factory draws the tensor ``pname`` of ``shape`` (see ``reinit_weights``):
    ``("normal", std)``: N(0, std^2); ``("scaled_one_plus", std, factor)``: factor * (1 + N(0, std^2));
    ``("uniform", lo, hi)``. The streamed full-size writer (``full_size.py``) uses the same rules."""
    leaf = pname.rsplit(".", 1)[-1]
    if pname.endswith("embed_tokens.weight"):
        return ("normal", 0.15)
    if pname.endswith("embed_tokens_per_layer.weight"):
        return ("normal", 0.3)
    if pname.endswith("router.proj.weight"):
        return ("normal", 1.0)
    if leaf == "per_expert_scale":
        return ("uniform", 0.5, 1.5)
    if pname.endswith("layer_scalar"):
        return ("uniform", 0.7, 1.3)
    if len(shape) <= 1:
        return ("scaled_one_plus", 0.1, 3.0 if ".post_" in f".{leaf_module(pname)}" else 1.0)
    return ("normal", 1.0 / math.sqrt(shape[-1]))


def draw(rule: tuple, shape, generator) -> "torch.Tensor":
    """Float32 values of ``rule`` (``init_rule``) from ``generator``."""
    import torch

    kind = rule[0]
    if kind == "uniform":
        lo, hi = rule[1], rule[2]
        return lo + (hi - lo) * torch.rand(shape, generator=generator, dtype=torch.float32)
    x = torch.randn(shape, generator=generator, dtype=torch.float32) * rule[1]
    if kind == "scaled_one_plus":
        x = 1.0 + x
        return x if rule[2] == 1.0 else rule[2] * x
    return x


def reinit_weights(model, seed: int, init: Mapping[str, float] | None = None) -> None:
    """Seeded re-initialisation that gives varied, non-degenerate activations (``init_rule``):

    - linear / expert weights: N(0, 1/fan_in) so projections keep unit scale;
    - token embeddings: N(0, 0.15^2) (tied LM head: logits spread over a few units,
      enough for the 30.0 softcap to matter at the tails); PLE table: N(0, 0.3^2);
    - 1-D scales (RMSNorm weights, router scale): 1 + N(0, 0.1^2), except the norms
      on a layer's outputs (``post_*``), 3 x that: each layer's contribution then
      outweighs the token's own embedding in the residual, which otherwise makes
      the shallow models greedily repeat their input token;
    - MoE router projection: N(0, 1) so expert scores are well separated;
      per-expert scale: U(0.5, 1.5); ``layer_scalar``: U(0.7, 1.3);
    - assistant ``token_ordering``: a random permutation of the vocabulary.

    ``init`` multiplies some of these (see ``CheckpointRecipe.init``).
    """
    mult = dict(init or {})
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.copy_(draw(init_rule(pname, tuple(p.shape)), p.shape, g) * _init_multiplier(pname, p.dim(), mult))
        for bname, b in model.named_buffers():
            if bname.endswith("layer_scalar"):
                b.copy_(draw(init_rule(bname, tuple(b.shape)), b.shape, g))
            elif bname.endswith("token_ordering"):
                b.copy_(torch.randperm(b.numel(), generator=g))


def _init_multiplier(pname: str, ndim: int, mult: Mapping[str, float]) -> float:
    """``CheckpointRecipe.init``'s factor on the tensor ``pname`` (1.0: the default init)."""
    if pname.endswith("embed_tokens.weight"):
        return mult.get("embed", 1.0)
    if ndim == 1 and ".post_" in f".{leaf_module(pname)}":
        return mult.get("post_norm", 1.0)
    if ndim == 1 and leaf_module(pname) in ("q_norm", "k_norm"):
        return mult.get("qk_norm", 1.0)
    return 1.0


def leaf_module(param_name: str) -> str:
    """``model.layers.3.post_attention_layernorm.weight`` -> ``post_attention_layernorm``."""
    parts = param_name.split(".")
    return parts[-2] if len(parts) >= 2 else parts[0]


# ---------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv)
    if not names:
        print(f"usage: python -m impl.checkpoint_factory.checkpoints NAME... (names: {', '.join(TINY_CHECKPOINTS)}; or 'all')")
        return 2
    if names == ["all"]:
        names = [n for n, r in TINY_CHECKPOINTS.items() if not r.on_demand]
    for n in names:
        try:
            print(f"{n}\t{tiny_checkpoint(n)}")
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
