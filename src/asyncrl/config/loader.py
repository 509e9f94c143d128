"""Loading a run configuration: YAML files, dotted ``--set`` overrides, and errors meant for people."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from asyncrl.config.aliases import renamed_path
from asyncrl.config.base import variants
from asyncrl.config.run import RunConfig
from asyncrl.credentials import mask_secrets
from asyncrl.errors import UserError


class ConfigError(UserError, ValueError):
    """A user mistake in a config file or override; the message is meant for people."""


def _describe_allowed(err: ErrorDetails) -> str:
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key (check spelling; `asyncrl config explain` lists the fields)"
    if kind == "literal_error":
        return f"allowed values: {ctx.get('expected')}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le")), "?")
        return f"must be {bounds[kind]} {limit}"
    return str(err["msg"])


def _walk(loc: tuple[int | str, ...], root: type[BaseModel]) -> tuple[str, str | None]:
    """The dotted field path of an error location (variant tags left out), and for an unknown key
    directly inside a variant section, why it is wrong when another kind has that field."""
    parts: list[str] = []
    model: type[BaseModel] | None = root
    wrong_kind: str | None = None
    i = 0
    while i < len(loc):
        name = loc[i]
        parts.append(str(name))
        field = model.model_fields.get(str(name)) if model is not None else None
        i += 1
        if field is None:
            model = None
            continue
        kinds = variants(field)
        if kinds and i < len(loc) and loc[i] in kinds:
            kind = str(loc[i])
            model = kinds[kind]
            i += 1
            if i == len(loc) - 1 and str(loc[i]) not in model.model_fields:
                owners = [k for k, cls in kinds.items() if str(loc[i]) in cls.model_fields]
                if owners:
                    section = ".".join(parts)
                    wrong_kind = (
                        f"only for {section}.kind {' or '.join(repr(k) for k in owners)}, not for "
                        f"{section}.kind {kind!r} (set {section}.kind, or remove the field)"
                    )
            continue
        ann = field.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return ".".join(parts), wrong_kind


def format_validation_error(exc: ValidationError, source: str, root: type[BaseModel] | None = None) -> str:
    """One line per error: the field path, the bad value and what is allowed (no traceback)."""
    lines = [f"invalid configuration ({mask_secrets(source)}):"]
    for err in exc.errors():
        path, wrong_kind = _walk(err["loc"], root or RunConfig)
        path = path or "(root)"
        value = err.get("input")
        shown = mask_secrets(repr(value)) if not isinstance(value, dict) else "{...}"
        if len(shown) > 60:
            shown = shown[:57] + "..."
        if wrong_kind is not None:
            lines.append(f"  {path}: {wrong_kind}")
        elif err["type"] == "union_tag_invalid":
            tag = mask_secrets(repr((err.get("ctx") or {}).get("tag")))
            lines.append(
                f"  {path}.kind = {tag}: allowed values: {(err.get('ctx') or {}).get('expected_tags')}"
            )
        elif err["type"] == "value_error":
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(
                f"  {path}: {msg}" if err["loc"] else f"  {msg}"
            )  # a cross-section rule names its fields
        elif err["type"] == "missing":
            lines.append(f"  {path}: required field is missing")
        else:
            lines.append(f"  {path} = {shown}: {_describe_allowed(err)}")
    return mask_secrets("\n".join(lines))  # a password in a URL never reaches an error message


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML (numbers, booleans, lists, null)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value, e.g. trainer.lr=1e-5")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def _variant_kinds(parts: list[str]) -> dict[str, type[BaseModel]]:
    """``{kind: model}`` when ``parts`` names a variant section (``["env", "latency"]``), else empty."""
    model: type[BaseModel] = RunConfig
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return {}
        kinds = variants(field)
        if kinds:
            return kinds if i == len(parts) - 1 else {}
        if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return {}
        model = field.annotation
    return {}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides in order. Setting a variant section's ``kind`` switches the section to that
    kind: fields given so far (in the file or earlier overrides) that the new kind does not have are
    dropped, so ``--set env.latency.kind=none`` turns off a file's Pareto latency; a field of another kind
    given after it is still an error."""
    for text in overrides:
        parts, value = parse_override(text)
        parts = renamed_path(parts)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        if parts[-1] == "kind" and (target := _variant_kinds(parts[:-1]).get(str(value))) is not None:
            for key in [k for k in node if k not in target.model_fields]:
                del node[key]
        node[parts[-1]] = value
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory; give the path of a YAML file in it")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r}); "
            "save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(p)!r} must hold a mapping at top level, got {type(data).__name__}"
        )
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (or the defaults when ``path`` is None) and apply dotted overrides."""
    data = load_yaml(path) if path is not None else {}
    data = apply_overrides(data, list(overrides or []))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        source = str(path) if path is not None else "defaults"
        if overrides:
            source += " with --set " + " ".join(overrides)
        raise ConfigError(format_validation_error(exc, source)) from None


def dump_yaml(cfg: BaseModel) -> str:
    """The config as YAML, with passwords in URLs masked (``***``; see :mod:`asyncrl.credentials`)."""
    return mask_secrets(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


def config_hash(*parts: BaseModel) -> str:
    """Stable short hash of config sections (used to key caches)."""
    import hashlib
    import json

    blob = json.dumps([p.model_dump(mode="json") for p in parts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
