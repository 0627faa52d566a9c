"""Helpers the proxy uses to build a ``RouteRequest`` from an OpenAI request (pure)."""

from collections.abc import Mapping


def prompt_text_of(body: Mapping) -> str:
    """The text prefix caching sees: chat messages as role-tagged text in order, or the completion prompt.

    Only the order and content matter (for chained block hashes); the exact chat template does not,
    as long as every request of an endpoint is rendered the same way.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            content = message.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
            parts.append(f"<|{message.get('role', '')}|>{content if isinstance(content, str) else ''}")
        return "".join(parts)
    prompt = body.get("prompt", body.get("input"))  # a completion's prompt, or an embedding's input
    if isinstance(prompt, list):
        return "".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else ""


def session_id_of(headers: Mapping[str, str], body: Mapping) -> str | None:
    """``x-session-id`` header, else the OpenAI ``user`` field; None when neither is given."""
    for key, value in headers.items():
        if key.lower() == "x-session-id" and value:
            return str(value)[:200]
    user = body.get("user")
    return str(user)[:200] if user else None
