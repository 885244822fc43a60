"""xgrammar's token table (``TokenizerInfo``) from our tokenizer, built once per engine.

The table maps each token id to the bytes it decodes to, so a grammar over
text becomes a mask over ids. Our tokenizers are HF ``tokenizer.json`` files
read with the ``tokenizers`` library (``impl/model/tokenizer.py``), not
transformers objects, so the table is built from the vocabulary directly:

* the encoding of the pieces: byte-level BPE (the tiny checkpoints' and GPT-2's
  ``Ġ`` pieces), byte-fallback BPE (Gemma's ``▁`` pieces and ``<0x0A>`` byte
  tokens), or raw; read from ``tokenizer.json`` by xgrammar's own detector, with
  our reading of the model / decoder entries as the fallback;
* added *special* tokens (``<bos>``, ``<start_of_turn>``, ...) are entered as
  empty pieces, which xgrammar treats as special and never allows: a JSON string
  must not contain a control token whose text the detokenizer drops. The stop
  tokens (the engine's EOS ids) are allowed exactly where the grammar may end;
  Gemma-4's tool-call markers stay text pieces, so a tool-call grammar can emit
  them;
* ids from the tokenizer's size up to the model's vocabulary size (padding
  columns of the LM head) are masked.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

# Special tokens a grammar may emit as text: Gemma-4's function-call markers.
GRAMMAR_TEXT_SPECIALS = frozenset({"<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_response>", "<tool_response|>"})


def vocab_encoding(tokenizer_json: str) -> tuple[Any, bool]:
    """(xgrammar VocabType, add_prefix_space) of a ``tokenizer.json`` document."""
    import xgrammar as xgr

    try:
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer_json)
        return meta["vocab_type"], bool(meta["add_prefix_space"])
    except Exception:  # noqa: BLE001 - fall back to reading the document ourselves
        pass
    doc = json.loads(tokenizer_json)
    model, decoder = doc.get("model") or {}, doc.get("decoder") or {}
    decoders = decoder.get("decoders", [decoder]) if isinstance(decoder, dict) else []
    kinds = {d.get("type") for d in decoders if isinstance(d, dict)}
    if model.get("byte_fallback") or "ByteFallback" in kinds:
        return xgr.VocabType.BYTE_FALLBACK, False
    if "ByteLevel" in kinds:
        return xgr.VocabType.BYTE_LEVEL, False
    return xgr.VocabType.RAW, False


def build_tokenizer_info(tokenizer: Any, model_vocab_size: int, stop_token_ids: Iterable[int]):
    """xgrammar ``TokenizerInfo`` for ``tokenizer`` (``impl.model.tokenizer.Tokenizer``) with the LM head's width
    ``model_vocab_size`` (>= the tokenizer's size; the extra ids are never allowed)."""
    import xgrammar as xgr

    backend = tokenizer.backend
    vocab = backend.get_vocab(with_added_tokens=True)  # piece -> id
    size = max(max(vocab.values(), default=-1) + 1, model_vocab_size)
    pieces = [""] * size
    for piece, i in vocab.items():
        pieces[i] = piece
    stops = sorted(set(int(t) for t in stop_token_ids))
    for i, added in backend.get_added_tokens_decoder().items():
        if added.special and added.content not in GRAMMAR_TEXT_SPECIALS and i not in stops:
            pieces[i] = ""
    vocab_type, prefix_space = vocab_encoding(backend.to_str())
    return xgr.TokenizerInfo(pieces, vocab_type, vocab_size=size, stop_token_ids=stops, add_prefix_space=prefix_space)
