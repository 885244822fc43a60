"""Tokenizer: an HF ``tokenizer.json`` loaded with the ``tokenizers`` library.

Reads ``tokenizer.json`` (required), ``tokenizer_config.json`` (special tokens,
``add_bos_token``, chat template), ``chat_template.jinja`` and the eos ids of
``generation_config.json`` / ``config.json`` from one folder. transformers is
not used here (it is a test-only dependency).

Chat templates are rendered with jinja2 in a sandboxed environment, with the
same settings and helpers HF templates expect (``trim_blocks``,
``lstrip_blocks``, ``raise_exception``, ``strftime_now``).
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Iterable, Mapping, Sequence

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


@dataclass
class Tokenizer:
    """Text <-> token ids for one model, plus its chat template and special ids."""

    path: str
    backend: Any  # tokenizers.Tokenizer
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    add_bos_token: bool | None = None  # None: leave it to tokenizer.json's post-processor
    chat_template: str | None = None

    # ---------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path: str) -> "Tokenizer":
        """Load from a model (or ``--tokenizer-path``) folder."""
        from tokenizers import Tokenizer as Backend

        if not os.path.isdir(path):
            raise ValueError(f"tokenizer path {path!r} is not a folder; pass --tokenizer-path (or --model-path) "
                             "to a folder holding tokenizer.json")
        tok_file = os.path.join(path, TOKENIZER_FILE)
        if not os.path.isfile(tok_file):
            raise ValueError(
                f"tokenizer folder {path!r} has no {TOKENIZER_FILE}; pass --tokenizer-path to a folder holding an HF "
                f"{TOKENIZER_FILE} (a SentencePiece-only tokenizer.model is not supported)"
            )
        try:
            backend = Backend.from_file(tok_file)
        except Exception as e:  # the Rust error text is useful, the traceback is not
            raise ValueError(f"{tok_file!r} could not be parsed as an HF tokenizer.json: {e}") from e

        tcfg = _read_json(os.path.join(path, TOKENIZER_CONFIG_FILE))
        gcfg = _read_json(os.path.join(path, "generation_config.json"))
        mcfg = _read_json(os.path.join(path, "config.json"))
        mcfg = {**mcfg.get("text_config", {}), **{k: v for k, v in mcfg.items() if k != "text_config"}}

        def token(key: str) -> str | None:
            v = tcfg.get(key)
            if isinstance(v, Mapping):  # {"content": "<bos>", ...}
                v = v.get("content")
            return v if isinstance(v, str) else None

        def token_id(tok: str | None, *fallbacks: Any) -> int | None:
            found = backend.token_to_id(tok) if tok is not None else None
            if found is not None:
                return int(found)
            for fb in fallbacks:
                ids = _as_ids(fb)
                if ids:
                    return ids[0]
            return None

        bos, eos, pad, unk = token("bos_token"), token("eos_token"), token("pad_token"), token("unk_token")
        eos_ids: set[int] = set()
        eos_id = backend.token_to_id(eos) if eos is not None else None
        if eos_id is not None:
            eos_ids.add(int(eos_id))
        eos_ids.update(_as_ids(gcfg.get("eos_token_id")))
        eos_ids.update(_as_ids(mcfg.get("eos_token_id")))

        return cls(
            path=path,
            backend=backend,
            bos_token=bos,
            eos_token=eos,
            pad_token=pad,
            unk_token=unk,
            bos_token_id=token_id(bos, gcfg.get("bos_token_id"), mcfg.get("bos_token_id")),
            pad_token_id=token_id(pad, gcfg.get("pad_token_id"), mcfg.get("pad_token_id")),
            eos_token_ids=frozenset(eos_ids),
            add_bos_token=tcfg.get("add_bos_token") if isinstance(tcfg.get("add_bos_token"), bool) else None,
            chat_template=_find_chat_template(path, tcfg),
        )

    # ---------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    @cached_property
    def max_token_chars(self) -> int:
        """Characters of the longest vocabulary entry: a text of C characters has at least C / this many tokens
        (a bound the server uses to refuse an oversized prompt before tokenizing it)."""
        return max((len(t) for t in self.backend.get_vocab(with_added_tokens=True)), default=1) or 1

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    # ---------------------------------------------------------- encode / decode
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` a bos is prepended (once) like Gemma's tokenizer."""
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a string, got {type(text).__name__}")
        # encode_batch releases the GIL while the Rust tokenizer runs (encode holds it): the HTTP
        # server tokenizes on a worker thread and its event loop must keep answering meanwhile.
        ids = list(self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ---------------------------------------------------------- chat
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        template: str | None = None,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> str:
        """Render ``messages`` with the model's chat template (or ``template``: a template string or file path).
        ``continue_final_message`` (vLLM's and SGLang's): the text ends with the final message's own text, open for
        the model to continue (the final message is the assistant's, its turn not closed; no generation prompt)."""
        if continue_final_message:
            if add_generation_prompt:
                raise ValueError("continue_final_message continues the final message; it cannot be combined with "
                                 "add_generation_prompt (send add_generation_prompt: false)")
            final = normalize_messages(messages)[-1] if messages else {}
            if final.get("role") != "assistant" or not final.get("content", "").strip():
                raise ValueError("continue_final_message needs a final assistant message with text to continue")
        source = load_chat_template(template) if template is not None else self.chat_template
        if source is None:
            raise ValueError(
                f"tokenizer {self.path!r} has no chat template (no 'chat_template' in {TOKENIZER_CONFIG_FILE}, "
                f"no {CHAT_TEMPLATE_FILE}); pass --chat-template FILE or use the completions API"
            )
        normalized = normalize_messages(messages)
        context = dict(
            messages=normalized,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            pad_token=self.pad_token or "",
            unk_token=self.unk_token or "",
        )
        context.update(extra)
        import jinja2

        try:
            text = _compile(source).render(**context)
        except ChatTemplateError as e:
            raise ValueError(f"chat template rejected the messages: {e}") from None
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template failed to render: {e}") from None
        if continue_final_message:  # cut what the template writes after the final message's text (its turn's end)
            content = normalized[-1]["content"].strip()  # (templates often trim it)
            at = text.rfind(content)
            if at < 0:
                raise ValueError("continue_final_message: the chat template does not write the final message's text "
                                 "as given, so the prompt cannot end with it")
            text = text[: at + len(content)]
        return text

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, template: str | None = None,
        continue_final_message: bool = False, **extra: Any,
    ) -> list[int]:
        """Ids of the rendered chat prompt; the template supplies bos (added only if it did not). ``extra``: more
        template variables (``tools``)."""
        ids = self.encode(self.apply_chat_template(messages, add_generation_prompt, template, continue_final_message,
                                                   **extra), add_special_tokens=False)
        if self.add_bos_token and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids.insert(0, self.bos_token_id)
        return ids


# ---------------------------------------------------------------- helpers


class ChatTemplateError(Exception):
    """Raised by a template's ``raise_exception(...)``."""


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain dicts with string content; OpenAI text parts are joined with newlines."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} objects")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"message {i} must be an object with a string 'role', got {m!r}")
        msg = dict(m)
        content = msg.get("content")
        if content is None:
            msg["content"] = ""
        elif isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"message {i}: only text content parts are supported, got {part!r}")
                texts.append(part["text"])
            msg["content"] = "\n".join(texts)
        elif not isinstance(content, str):
            raise ValueError(f"message {i}: 'content' must be a string or a list of text parts")
        out.append(msg)
    return out


def load_chat_template(template: str) -> str:
    """``--chat-template`` value: a file path, or the template text itself."""
    if os.path.isfile(template):
        with open(template, encoding="utf-8") as f:
            return f.read()
    if "{{" in template or "{%" in template:
        return template
    raise ValueError(f"--chat-template {template!r} is neither a readable file nor a jinja template string")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(source: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template has a syntax error at line {e.lineno}: {e.message}") from None


def _find_chat_template(path: str, tcfg: Mapping[str, Any]) -> str | None:
    jinja_file = os.path.join(path, CHAT_TEMPLATE_FILE)
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            return f.read()
    tpl = tcfg.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, Mapping)}
        tpl = named.get("default") or next(iter(named.values()), None)
    return tpl if isinstance(tpl, str) else None


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path!r} is not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}


def _as_ids(v: Any) -> list[int]:
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []
