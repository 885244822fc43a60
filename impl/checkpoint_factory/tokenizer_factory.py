"""Train the tiny byte-level BPE tokenizer that every tiny checkpoint ships.

Ids of the special tokens match the model configs (pad 0, eos 1, bos 2) and
Gemma's chat markers exist as single special tokens. Training is
deterministic: the same corpus gives byte-identical ``tokenizer.json``.
"""

from __future__ import annotations

import json
import os

from impl.checkpoint_factory.corpus import CORPUS

# id order matters: it is the order the trainer assigns ids in.
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")
PAD_ID, EOS_ID, BOS_ID, UNK_ID, START_OF_TURN_ID, END_OF_TURN_ID = range(len(SPECIAL_TOKENS))
TOKENIZER_VOCAB_SIZE = 512
# generation stops on <eos> and on the end of a chat turn, like Gemma's generation_config
GENERATION_EOS_IDS = (EOS_ID, END_OF_TURN_ID)

# Gemma-style chat template: roles user/model, a system message folded into the
# first user turn, roles must alternate, and the prompt for the model's turn.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] | trim ~ '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' ~ role ~ '\n' ~ (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def train_tokenizer(corpus: str = CORPUS, vocab_size: int = TOKENIZER_VOCAB_SIZE):
    """Return a trained ``tokenizers.Tokenizer`` (byte-level BPE, bos prepended by its post-processor)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"tokenizer training assigned {name} id {tok.token_to_id(name)}, expected {i}")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    return tok


def widen_tokenizer(tok, vocab_size: int):
    """``tok`` (the trained byte-level BPE) grown to exactly ``vocab_size`` entries, deterministically.

    The trained merges keep their ranks (corpus text tokenizes as before wherever they apply); the
    new entries come after them: every pair of byte symbols not yet in the vocabulary, then each
    two-symbol token extended by one byte symbol, in id order, until the size is reached. So a
    full-size vocabulary (Gemma-4's 262,144) exists without a corpus that large: most entries are
    2- and 3-byte pieces, many of them partial UTF-8 characters, which is what a detokenizer and stop
    strings must cope with when a random-weight model emits them.
    """
    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    merges: list = spec["model"]["merges"]
    if vocab_size < len(vocab):
        raise ValueError(f"widen_tokenizer: the trained vocabulary already has {len(vocab)} > {vocab_size} entries")
    # the byte-level alphabet in id order (single-character, non-special entries)
    special = set(SPECIAL_TOKENS)
    alphabet = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if len(t) == 1 and t not in special]

    def add(a: str, b: str) -> bool:
        token = a + b
        if token not in vocab:
            vocab[token] = len(vocab)
            merges.append([a, b])
        return len(vocab) >= vocab_size

    done = len(vocab) >= vocab_size
    for a in alphabet:
        for b in alphabet:
            if done or add(a, b):
                done = True
                break
        if done:
            break
    pairs = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if len(t) == 2]
    for p in pairs:
        if done:
            break
        for b in alphabet:
            if add(p, b):
                done = True
                break
    if len(vocab) != vocab_size:
        raise ValueError(f"widen_tokenizer: cannot reach {vocab_size} entries from a {len(alphabet)}-symbol alphabet")
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))


def tokenizer_config(model_max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "chat_template": GEMMA_CHAT_TEMPLATE,
    }


def generation_config() -> dict:
    return {"bos_token_id": BOS_ID, "eos_token_id": list(GENERATION_EOS_IDS), "pad_token_id": PAD_ID}


def write_tokenizer_files(folder: str, model_max_length: int = 4096, vocab_size: int = TOKENIZER_VOCAB_SIZE) -> None:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json into ``folder``
    (a ``vocab_size`` above the trained 512: ``widen_tokenizer``)."""
    tok = train_tokenizer()
    if vocab_size != TOKENIZER_VOCAB_SIZE:
        tok = widen_tokenizer(tok, vocab_size)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=True))
    _write_json(os.path.join(folder, "tokenizer_config.json"), tokenizer_config(model_max_length))
    _write_json(os.path.join(folder, "generation_config.json"), generation_config())


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
