"""The prompt's token ids as the engine computes them, so the router can ask the precise index which of its blocks
a replica's cache holds (``KVBlockIndex.match_tokens``; docs/algorithms.md, the live precise index).

The tokenizer comes from the endpoint's model when it is a local directory (``tokenizer.json``, read by the
``tokenizers`` package, and the chat template from ``chat_template.jinja`` or ``tokenizer_config.json``), loaded
once per model and cached. A chat request is rendered as vLLM renders it (transformers' ``apply_chat_template``:
a sandboxed Jinja environment, ``trim_blocks``/``lstrip_blocks``, the special tokens and
``add_generation_prompt``) and then encoded without adding special tokens; a completion prompt is encoded with
them (vLLM's default), and a prompt of token ids is taken as is. Whatever this cannot reproduce exactly (no local
tokenizer, content parts, tools, a template that raises, a batch of prompts) gives None: the router then uses its
approximate index, as it does for a replica whose events are stale.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# A chat body with any of these renders differently (tools in the template, a continued message, extra
# variables): not reproduced, so it falls back.
_UNSUPPORTED_CHAT_FIELDS = ("tools", "continue_final_message", "chat_template", "chat_template_kwargs", "documents")


class PromptTokenizer:
    def __init__(self, directory: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = _json(directory / "tokenizer_config.json")
        template = config.get("chat_template")
        if (directory / "chat_template.jinja").is_file():
            template = (directory / "chat_template.jinja").read_text()
        self.specials = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        self.template = None
        if isinstance(template, str):
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.globals["raise_exception"] = _raise
            self.template = env.from_string(template)

    def chat_tokens(self, body: Mapping) -> list[int] | None:
        messages = body.get("messages")
        if self.template is None or not isinstance(messages, list) or any(k in body for k in _UNSUPPORTED_CHAT_FIELDS):
            return None
        if not all(isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in messages):
            return None
        text = self.template.render(
            messages=messages, add_generation_prompt=bool(body.get("add_generation_prompt", True)), **self.specials
        )
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def completion_tokens(self, body: Mapping) -> list[int] | None:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=bool(body.get("add_special_tokens", True))).ids
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return list(prompt)
        return None

    def tokens(self, kind: str, body: Mapping) -> list[int] | None:
        """The prompt's token ids, or None when they cannot be reproduced exactly."""
        try:
            return self.chat_tokens(body) if kind == "chat" else self.completion_tokens(body)
        except Exception as exc:  # noqa: BLE001 - a template error or odd input: the approximate index answers
            log.debug("prompt not tokenized: %s", exc)
            return None


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken-shaped object."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise(message: str):
    raise ValueError(message)


class TokenizerCache:
    """One ``PromptTokenizer`` per model directory (None: the model has no local tokenizer), loaded once."""

    def __init__(self) -> None:
        self._by_dir: dict[str, PromptTokenizer | None] = {}
        self._lock = threading.Lock()

    def cached(self, directory: str) -> PromptTokenizer | None | bool:
        """The loaded tokenizer (None: there is none), or False when it has not been loaded yet."""
        return self._by_dir.get(directory, False)

    def get(self, directory: str | None) -> PromptTokenizer | None:
        if not directory:
            return None
        if directory in self._by_dir:
            return self._by_dir[directory]
        with self._lock:
            if directory not in self._by_dir:
                self._by_dir[directory] = self._load(Path(directory))
        return self._by_dir[directory]

    @staticmethod
    def _load(directory: Path) -> PromptTokenizer | None:
        if not (directory / "tokenizer.json").is_file():
            return None
        try:
            return PromptTokenizer(directory)
        except Exception:  # noqa: BLE001 - a broken tokenizer: routing falls back to the approximate index
            log.exception("cannot load the tokenizer in %s", directory)
            return None
