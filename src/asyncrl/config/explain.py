"""``asyncrl config explain``: one row per field (path, type, default, documentation)."""

from __future__ import annotations

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from asyncrl.config.base import default_kind, variants


def _bound(m: object) -> str | None:
    match m:
        case Gt(gt=v):
            return f"> {v}"
        case Ge(ge=v):
            return f">= {v}"
        case Lt(lt=v):
            return f"< {v}"
        case Le(le=v):
            return f"<= {v}"
    return None


def _field_row(path: str, field: FieldInfo, note: str = "") -> tuple[str, str, str, str]:
    type_name = str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
    default = repr(field.get_default(call_default_factory=True))
    bounds = [b for m in field.metadata if (b := _bound(m))]
    doc = (field.description or "").strip().replace("\n", " ")
    if bounds:
        doc = f"{doc} [{', '.join(bounds)}]".strip()
    return path, type_name, default, f"{note}{doc}"


def _first_line(model: type[BaseModel]) -> str:
    return (model.__doc__ or "").strip().splitlines()[0]


def explain(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows (path, type, default, doc) for every field of ``model``, recursing into sections.

    A variant section lists its ``kind`` with every allowed value, then each field once; a field
    that only some kinds have is marked ``kind: X —``."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        kinds = variants(field)
        if kinds:
            base = next(iter(kinds.values())).__mro__[1]
            assert issubclass(base, BaseModel)
            rows.append((path, "section", "", _first_line(base)))
            tags = ", ".join(repr(k) for k in kinds)
            kind_doc = (base.model_fields["kind"].description or "").strip().replace("\n", " ")
            rows.append((f"{path}.kind", f"Literal[{tags}]", repr(default_kind(field)), kind_doc))
            seen: set[str] = {"kind"}
            for cls in kinds.values():
                for fname, f in cls.model_fields.items():
                    if fname in seen:
                        continue
                    seen.add(fname)
                    owners = [k for k, c in kinds.items() if fname in c.model_fields]
                    note = "" if len(owners) == len(kinds) else f"kind: {', '.join(owners)} — "
                    sub = f.annotation
                    if isinstance(sub, type) and issubclass(sub, BaseModel):
                        rows.append((f"{path}.{fname}", "section", "", note + _first_line(sub)))
                        rows.extend(explain(sub, f"{path}.{fname}."))
                    else:
                        rows.append(_field_row(f"{path}.{fname}", f, note))
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.append((path, "section", "", _first_line(ann)))
            rows.extend(explain(ann, path + "."))
            continue
        rows.append(_field_row(path, field))
    return rows
