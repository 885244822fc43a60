"""A Gemma-style tokenizer for the full-size checkpoints that peers convert (``e2b-full-wc``).

The tiny checkpoints ship a byte-level BPE (``tokenizer_factory.py``: GPT-2's ``Ġ`` alphabet), which transformers
and this engine read but which is not what the published Gemma tokenizer is, so llama.cpp's converter takes it
for another family. This one has the published tokenizer's form:

* a BPE model with ``byte_fallback`` and merges, and the 256 byte pieces ``<0x00>`` .. ``<0xFF>`` in its
  vocabulary (ids 6 .. 261, after the specials), so any text encodes without ``<unk>``;
* spaces as ``▁`` (a ``Replace`` normalizer, no pre-tokenizer: pieces may span words, as SentencePiece's);
* a ``Sequence`` decoder: ``▁`` back to a space, ``ByteFallback`` (byte pieces to bytes), ``Fuse``;
* the specials at the model configs' ids (pad 0, eos 1, bos 2, unk 3, the chat markers 4 and 5), bos prepended.

Trained deterministically on the tiny corpus, then widened to the full vocabulary
(``tokenizer_factory.widen_tokenizer``: pairs and triples of the trained single-character pieces).
"""

from __future__ import annotations

import json
import os

from impl.checkpoint_factory.corpus import CORPUS
from impl.checkpoint_factory.tokenizer_factory import (
    BOS_ID,
    SPECIAL_TOKENS,
    _write_json,
    generation_config,
    tokenizer_config,
    widen_tokenizer,
)

SPACE = "\u2581"  # ▁
BYTE_PIECES = tuple(f"<0x{b:02X}>" for b in range(256))
TRAINED_VOCAB = 1024


def train_gemma_tokenizer(corpus: str = CORPUS, vocab_size: int = TRAINED_VOCAB):
    """A ``tokenizers.Tokenizer`` of the form above, trained on ``corpus`` to at most ``vocab_size`` entries."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=list(SPECIAL_TOKENS) + list(BYTE_PIECES), show_progress=False)
    tok.train_from_iterator([line for line in corpus.splitlines() if line.strip()], trainer=trainer)
    spec = json.loads(tok.to_str())
    # the byte pieces are vocabulary entries (as in the published tokenizer), not added tokens
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in SPECIAL_TOKENS]
    tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)])
    for i, name in enumerate(list(SPECIAL_TOKENS) + list(BYTE_PIECES)):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"tokenizer training assigned {name} id {tok.token_to_id(name)}, expected {i}")
    return tok


def write_gemma_tokenizer_files(folder: str, model_max_length: int, vocab_size: int) -> None:
    """tokenizer.json (``vocab_size`` entries), tokenizer_config.json and generation_config.json into ``folder``.

    Trained to at most ``vocab_size`` entries (a tiny checkpoint's 512 is below ``TRAINED_VOCAB``), then widened."""
    tok = widen_tokenizer(train_gemma_tokenizer(vocab_size=min(TRAINED_VOCAB, vocab_size)), vocab_size)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=True))
    _write_json(os.path.join(folder, "tokenizer_config.json"), tokenizer_config(model_max_length))
    _write_json(os.path.join(folder, "generation_config.json"), generation_config())
