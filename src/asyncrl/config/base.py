"""The base of every config section and the helpers of variant sections (one model per ``kind``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeAlias, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Tag
from pydantic.fields import FieldInfo

from asyncrl.credentials import check_url_syntax
from asyncrl.errors import UserError


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, fields carry docstrings."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


def kind_of(default: str) -> Callable[[Any], Any]:
    """Discriminator of a variant section: its ``kind``, or ``default`` where a mapping has none.

    Variant sections (``transport``, ``weights``, ``rollout.engine``, ``env.latency``, ``credit.value``,
    ``launcher``, ``control.state``) are unions of one model per ``kind``, each with only the fields that
    mean something for that kind; a field of another kind is an error (see :func:`format_validation_error`).
    """

    def kind(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return getattr(value, "kind", None)
        if isinstance(value, dict):
            return value.get("kind", default)
        return default  # not a mapping: the default kind's model reports the type error

    return kind


def variants(field: FieldInfo) -> dict[str, type[BaseModel]]:
    """``{kind: model}`` of a variant-section field; empty for any other field."""
    if not any(isinstance(m, Discriminator) for m in field.metadata):
        return {}
    out: dict[str, type[BaseModel]] = {}
    for arg in get_args(field.annotation):
        cls, *meta = get_args(arg)
        out[next(m.tag for m in meta if isinstance(m, Tag))] = cls
    return out


def default_kind(field: FieldInfo) -> str | None:
    """The ``kind`` a variant-section field takes when none is given (its default model's)."""
    factory = field.default_factory
    if isinstance(factory, type) and issubclass(factory, BaseModel):
        return str(factory.model_fields["kind"].default)
    return None


def drop_stale_defaults(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the fields of another kind that hold that field's default, in every variant section.

    A resolved config written before the variant sections (a run directory's ``config.yaml``) holds every
    field of every kind at its default (``transport: {kind: embedded, redis_url: redis://127.0.0.1:6379/0}``);
    those say nothing and are dropped so such a run can be resumed and reported. A field of another kind
    with any other value stays, and is refused with a message naming its kind."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for name, field in model.model_fields.items():
        sub = out.get(name)
        if not isinstance(sub, dict):
            continue
        kinds = variants(field)
        if kinds:
            cls = kinds.get(str(sub.get("kind", default_kind(field))))
            if cls is None:
                continue
            stale = [
                key
                for key, value in sub.items()
                if key not in cls.model_fields
                and any(
                    key in other.model_fields and other.model_fields[key].default == value
                    for other in kinds.values()
                )
            ]
            out[name] = drop_stale_defaults(cls, {k: v for k, v in sub.items() if k not in stale})
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out[name] = drop_stale_defaults(field.annotation, sub)
    return out


def default_of(model: type[BaseModel], field: str) -> Any:
    """The default of ``model.field``, for a constructor that is also called without its config section
    (tests, benches): the number is still written once, in the config, next to its documentation."""
    return model.model_fields[field].get_default(call_default_factory=True)


def check_redis_url(url: str) -> str:
    """Reject a malformed Redis URL at load time (the message shows it masked)."""
    try:
        check_url_syntax(url, "the URL")
    except UserError as exc:
        raise ValueError(str(exc)) from None
    return url


RedisUrl: TypeAlias = Annotated[str, AfterValidator(check_redis_url)]
"""A Redis URL field: checked at load time (:func:`check_redis_url`)."""


def ordered(low: str, lo: float, high: str, hi: float, strict: bool = False) -> None:
    """Raise the ``ValueError`` of a section whose field ``low`` must be at most (``strict``: below) ``high``."""
    if lo > hi or (strict and lo == hi):
        raise ValueError(f"{low} ({lo}) must be {'below' if strict else 'at most'} {high} ({hi})")
