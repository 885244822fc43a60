"""The resolution framework (SGLang's ``arg_groups.overrides`` shape, our own code).

* ``resolving_view(args)``: what the user gave (the dataclass fields as set).
* ``declare_resolution(args, source, **fields)``: record an automatic change and
  who made it; the user's value stays readable through the resolving view.
* ``resolved_view(args)``: the user's values with every declaration applied.
* ``attention_backends_of(view) -> (prefill, decode)``.
* ``model_config_of`` / ``draft_model_config_of`` / ``platform_of``: the context
  ``check_server_args`` binds before running the rules.

Invariant: a field declared twice keeps the latest value; every declaration is
logged once at startup and stays readable (the server exposes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from impl.args.platform import Platform


@dataclass(frozen=True)
class Resolution:
    source: str
    field: str
    value: Any
    previous: Any

    def describe(self) -> str:
        return f"{self.field}={self.value!r} (was {self.previous!r}; by {self.source})"


@dataclass
class ResolutionContext:
    model_config: Any = None
    draft_model_config: Any = None
    platform: Platform = field(default_factory=Platform.cpu)
    resolutions: list[Resolution] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)


def context_of(args: Any) -> ResolutionContext:
    ctx = getattr(args, "_resolution_ctx", None)
    if ctx is None:
        ctx = ResolutionContext()
        object.__setattr__(args, "_resolution_ctx", ctx)
    return ctx


class View:
    """Read-only attribute view of server args (optionally with overrides)."""

    __slots__ = ("_args", "_overrides")

    def __init__(self, args: Any, overrides: dict[str, Any] | None):
        object.__setattr__(self, "_args", args)
        object.__setattr__(self, "_overrides", overrides or {})

    def __getattr__(self, name: str) -> Any:
        ov = object.__getattribute__(self, "_overrides")
        if name in ov:
            return ov[name]
        return getattr(object.__getattribute__(self, "_args"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"views are read-only; use declare_resolution(args, source, {name}=...)")


def resolving_view(args: Any) -> View:
    return View(args, None)


def resolved_view(args: Any) -> View:
    return View(args, context_of(args).overrides)


def declare_resolution(args: Any, source: str, **values: Any) -> None:
    ctx = context_of(args)
    known = {f.name for f in fields(args)}
    for name, value in values.items():
        if name not in known:
            raise AttributeError(f"declare_resolution: ServerArgs has no field {name!r}")
        previous = ctx.overrides.get(name, getattr(args, name))
        ctx.overrides[name] = value
        ctx.resolutions.append(Resolution(source, name, value, previous))


def resolutions_of(args: Any) -> list[Resolution]:
    return list(context_of(args).resolutions)


def attention_backends_of(view: Any) -> tuple[str | None, str | None]:
    """(prefill, decode): a role-specific backend wins over the general one."""
    prefill = view.prefill_attention_backend or view.attention_backend
    decode = view.decode_attention_backend or view.attention_backend
    return prefill, decode


def model_config_of(args: Any) -> Any:
    mc = context_of(args).model_config
    if mc is None:
        raise RuntimeError("model_config_of: check_server_args has not bound a model config yet")
    return mc


def draft_model_config_of(args: Any) -> Any:
    return context_of(args).draft_model_config


def platform_of(args: Any) -> Platform:
    return context_of(args).platform


def use_mla_backend(args: Any) -> bool:
    mc = context_of(args).model_config
    return bool(mc is not None and getattr(mc, "is_mla", False))
