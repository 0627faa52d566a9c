"""Request-body checks in vLLM 0.32's words (pure): the error shape, FastAPI/pydantic format errors, and
``VLLMValidationError`` messages.

A field of the wrong type is a pydantic error: status 400, ``type: "Bad Request"``, ``param: "body.<field>"`` and
a message listing each error as ``{'type': …, 'loc': …, 'msg': …, 'input': …}``. Pydantic's lax mode is mimicked
for the scalar fields vLLM declares: ``"5"`` and ``5.0`` are integers, ``"yes"`` and ``1`` are booleans. A value
of the right type that vLLM refuses is a ``BadRequestError`` whose message ends ``(parameter=…, value=…)``.
"""

from __future__ import annotations

import math


class BadRequest(ValueError):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind or {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")


def error_body(message: str, *, status: int, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def vllm_error(message: str, *, param: str | None = None, value=None, status: int = 400) -> BadRequest:
    """vLLM's ``VLLMValidationError``: the parameter and value are appended to the message when known."""
    extras = []
    if param is not None:
        extras.append(f"parameter={param}")
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return BadRequest(text, status=status, param=param)


def input_summary(value) -> str:
    """How vLLM echoes an offending value: containers described, everything else as ``str``."""
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


class FormatErrors:
    """Pydantic-style errors collected over a whole body, raised together as one 400 (as FastAPI does)."""

    def __init__(self) -> None:
        self.errors: list[dict] = []

    def add(self, kind: str, loc: str, msg: str, value, ctx: dict | None = None) -> None:
        error = {"type": kind, "loc": loc, "msg": msg, "input": input_summary(value)}
        if ctx:
            error["ctx"] = ctx
        self.errors.append(error)

    def raise_if_any(self) -> None:
        if (error := self.as_error()) is not None:
            raise error

    def as_error(self) -> BadRequest | None:
        if not self.errors:
            return None
        count = len(self.errors)
        label = "error" if count == 1 else "errors"
        lines = "".join(f"  {error}\n" for error in self.errors[:10])
        if count > 10:
            lines += f"  ...and {count - 10} more {label}\n"
        message = f"{count} validation {label}:\n{lines}".rstrip()
        return BadRequest(message, param=self.errors[0]["loc"], kind="Bad Request")


class _Invalid(Exception):
    def __init__(self, kind: str, msg: str):
        self.kind, self.msg = kind, msg


def lax_int(value) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) >= 2**63:
            raise _Invalid("int_parsing_size", "Unable to parse input string as an integer, exceeded maximum size")
        if value != int(value):
            raise _Invalid("int_from_float", "Input should be a valid integer, got a number with a fractional part")
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            number = None
        if number is not None and math.isfinite(number) and number == int(number) and "e" not in text.lower():
            return int(number)
        raise _Invalid("int_parsing", "Input should be a valid integer, unable to parse string as an integer")
    raise _Invalid("int_type", "Input should be a valid integer")


def lax_float(value) -> float:
    if isinstance(value, (bool, int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise _Invalid(
                "float_parsing", "Input should be a valid number, unable to parse string as a number"
            ) from None
    raise _Invalid("float_type", "Input should be a valid number")


_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def lax_bool(value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value in (0, 1):
            return bool(value)
        raise _Invalid("bool_parsing", "Input should be a valid boolean, unable to interpret input")
    if isinstance(value, float):
        if value in (0.0, 1.0):
            return bool(value)
        raise _Invalid("bool_type", "Input should be a valid boolean")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise _Invalid("bool_parsing", "Input should be a valid boolean, unable to interpret input")
    raise _Invalid("bool_type", "Input should be a valid boolean")


def strict_str(value) -> str:
    if isinstance(value, str):
        return value
    raise _Invalid("string_type", "Input should be a valid string")


class Body:
    """Typed access to a request body's fields; wrong types are collected, then raised by ``check()``."""

    def __init__(self, body: dict) -> None:
        self.body = body
        self.format = FormatErrors()

    def _get(self, name: str, convert, default):
        value = self.body.get(name)
        if value is None:
            return default
        try:
            return convert(value)
        except _Invalid as exc:
            self.format.add(exc.kind, f"body.{name}", exc.msg, value)
            return default

    def int(self, name: str, default: int | None = None) -> int | None:
        return self._get(name, lax_int, default)

    def float(self, name: str, default: float | None = None) -> float | None:
        return self._get(name, lax_float, default)

    def bool(self, name: str, default: bool | None = None) -> bool | None:
        return self._get(name, lax_bool, default)

    def str(self, name: str, default: str | None = None) -> str | None:
        return self._get(name, strict_str, default)

    def str_or_list(self, name: str) -> list[str]:
        """``stop``: a string or a list of strings (pydantic reports both branches of the union)."""
        value = self.body.get(name)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            bad = [i for i, item in enumerate(value) if not isinstance(item, str)]
            for i in bad:
                self.format.add("string_type", f"body.{name}.{i}", "Input should be a valid string", value[i])
            return [item for item in value if isinstance(item, str)]
        self.format.add("string_type", f"body.{name}", "Input should be a valid string", value)
        self.format.add("list_type", f"body.{name}", "Input should be a valid list", value)
        return []

    def object(self, name: str) -> dict | None:
        value = self.body.get(name)
        if value is None or isinstance(value, dict):
            return value
        self.format.add(
            "model_attributes_type",
            f"body.{name}",
            "Input should be a valid dictionary or object to extract fields from",
            value,
        )
        return None

    def check(self) -> None:
        self.format.raise_if_any()


def body_not_an_object(value) -> BadRequest:
    errors = FormatErrors()
    if value is None:
        errors.add("missing", "body", "Field required", None)
    else:
        errors.add(
            "model_attributes_type",
            "body",
            "Input should be a valid dictionary or object to extract fields from",
            value,
        )
    return errors.as_error()


def invalid_json(msg: str, pos: int) -> BadRequest:
    errors = FormatErrors()
    errors.add("json_invalid", f"body.{pos}", "JSON decode error", {}, ctx={"error": msg})
    return errors.as_error()
