"""xgrammar's token table from our tokenizers: byte-level and byte-fallback vocabularies, special tokens never
allowed, LM-head padding masked."""

from __future__ import annotations

import torch

from impl.constrained import bitmask as bm
from impl.constrained.grammar import GrammarBackend, GrammarKey
from impl.constrained.tokenizer_info import build_tokenizer_info
from impl.model.tokenizer import Tokenizer
from impl.checkpoint_factory.checkpoints import tiny_checkpoint


def _byte_fallback_tokenizer() -> Tokenizer:
    """A Gemma-style BPE: ``▁`` for spaces, ``<0xNN>`` byte tokens, special tokens."""
    from tokenizers import Tokenizer as Backend, decoders, models, normalizers

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 3}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "a", "b", "{", "}", '"', ":", "▁a", "ab", "1", "2"]:
        vocab[piece] = len(vocab)
    tok = Backend(models.BPE(vocab=vocab, merges=[("▁", "a"), ("a", "b")], byte_fallback=True, unk_token=None))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(["<pad>", "<eos>", "<bos>", "<start_of_turn>"])
    return Tokenizer(path="memory", backend=tok, eos_token_ids=frozenset({1}))


def test_byte_fallback_pieces_decode_to_their_bytes():
    import xgrammar as xgr

    tok = _byte_fallback_tokenizer()
    info = build_tokenizer_info(tok, tok.vocab_size, [1])
    assert info.vocab_type == xgr.VocabType.BYTE_FALLBACK
    dv = info.decoded_vocab
    assert dv[tok.token_to_id("<0x41>")] == b"A" and dv[tok.token_to_id("▁a")] == b" a"
    assert set(info.special_token_ids) >= {0, 2, 3}  # never allowed as text


def test_byte_level_table_of_the_tiny_checkpoint():
    import xgrammar as xgr

    tok = Tokenizer.from_pretrained(tiny_checkpoint("e2b"))
    info = build_tokenizer_info(tok, 512, [1, 5])
    assert info.vocab_type == xgr.VocabType.BYTE_LEVEL and info.stop_token_ids == [1, 5]


def test_special_tokens_and_lm_head_padding_are_masked():
    tok = Tokenizer.from_pretrained(tiny_checkpoint("e2b"))
    backend = GrammarBackend(tok, 600, [1, 5])  # an LM head 88 columns wider than the tokenizer
    state = backend.new_state(GrammarKey("regex", "<start_of_turn>|[a-z]+"))
    mask = bm.allocate(1, backend.vocab_size)
    state.fill(mask, 0)
    allowed = set(bm.allowed_ids(mask[0], 600))
    assert allowed and max(allowed) < 512 and tok.token_to_id("<start_of_turn>") not in allowed
    logits = torch.zeros(1, 640)  # wider still than the table: the extra columns are masked too
    bm.apply_bitmask(logits, mask, [0])
    assert torch.isinf(logits[0, 512:]).all() and set(torch.nonzero(logits[0] == 0).flatten().tolist()) == allowed
