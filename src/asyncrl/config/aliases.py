"""Renamed config paths: each old dotted path still works for one release, with a one-line warning;
retired fields (:data:`RETIRED`) are dropped where they hold their old default.

The sections are named after the package that enforces them (docs/configuration.md#renamed-fields):
the staleness bound is ``control``'s (:mod:`asyncrl.control`), the rules the orchestrator runs are
``orchestrator``'s (:mod:`asyncrl.orchestrator`). A YAML file, a resolved ``config.yaml`` of an older
run, or a ``--set`` may still use an old path: it is moved to the new one and a warning names the new
path. A section given under both names is merged; a field given under both is an error (which one was
meant cannot be told).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

log = logging.getLogger("asyncrl.config")

RENAMED: dict[str, str] = {
    "orchestrator.mode": "control.mode",
    "orchestrator.max_staleness": "control.max_staleness",
    "orchestrator.stale_policy": "control.stale_policy",
    "orchestrator.governor_window": "orchestrator.governor.window",
    "orchestrator.governor_fill_window": "orchestrator.governor.fill_window",
    "orchestrator.governor_low_fill": "orchestrator.governor.low_fill",
    "control.curriculum": "orchestrator.curriculum",
    "control.breaker": "orchestrator.breaker",
    "control.drift": "orchestrator.drift",
    "control.exploration": "orchestrator.exploration",
    "control.elastic": "orchestrator.elastic",
}
"""Old dotted path -> new dotted path (a section's rename covers every field under it)."""


RETIRED: dict[str, tuple[Any, str]] = {
    "rollout.engine.compile_decode": (
        False,
        "the torch.compile'd decode step measured 0.66x as fast as the default fused step "
        "(docs/engines.md#cpu-decoding-packed-weights-a-fused-step)",
    ),
    "rollout.engine.shared_prefix_attention": (
        False,
        "the shared-prefix decode attention did not shorten the demo-real RL phase in two rounds of runs "
        "(docs/engines.md#cpu-decoding-packed-weights-a-fused-step)",
    ),
    "rollout.engine.continuous_batching": (
        False,
        "continuous batching did not shorten the demo-real RL phase (1.02x and 1.05x the call-by-call "
        "time, each decode step 1.15-1.28x as long) (docs/engines.md#continuous-batching)",
    ),
}
"""Retired dotted path -> (its old default, why it went). A resolved ``config.yaml`` of an older run holds
every field at its value: a retired one at its old default is dropped (it said nothing), one set otherwise
is refused with the reason."""


def drop_retired(data: Any) -> Any:
    """``data`` (a run config mapping) without the :data:`RETIRED` fields that hold their old default.

    Raises ``ValueError`` naming the field and why it went when one is set to anything else."""
    if not isinstance(data, dict):
        return data
    out = data
    for path, (default, why) in RETIRED.items():
        *sections, key = path.split(".")
        node: Any = out
        for part in sections:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or key not in node:
            continue
        if node[key] != default:
            raise ValueError(f"{path} was retired: {why}; remove it from the config")
        if out is data:
            out = copy.deepcopy(data)  # the caller's mapping is left as it was
            node = out
            for part in sections:
                node = node[part]
        del node[key]
    return out


def _warn(old: str, new: str) -> None:
    log.warning("config: %s is deprecated, use %s (the old name goes in the next release)", old, new)


def renamed_path(parts: list[str]) -> list[str]:
    """The new path of a ``--set`` key (``control.breaker.probes`` -> ``orchestrator.breaker.probes``),
    with the warning; any other key unchanged."""
    for old, new in RENAMED.items():
        head = old.split(".")
        if parts[: len(head)] == head:
            rest = parts[len(head) :]
            _warn(".".join([old, *rest]), ".".join([new, *rest]))
            return [*new.split("."), *rest]
    return parts


def move_renamed(data: Any) -> Any:
    """``data`` (a run config mapping) with every old path moved to its new one, with the warning.

    Raises ``ValueError`` when a field is given under both names (a section under both is merged)."""
    if not isinstance(data, dict) or not any(
        isinstance(data.get(s), dict) for s in ("orchestrator", "control")
    ):
        return data
    out = copy.deepcopy(data)  # the caller's mapping is left as it was
    for old, new in RENAMED.items():
        (old_sec, old_key), new_parts = old.split("."), new.split(".")
        section = out.get(old_sec)
        if not isinstance(section, dict) or old_key not in section:
            continue
        node = out
        for part in new_parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ValueError(f"{part} must be a mapping (it receives {old}, renamed {new})")
            node = child
        value = section.pop(old_key)
        node[new_parts[-1]] = _merge(value, node[new_parts[-1]], old, new) if new_parts[-1] in node else value
        _warn(old, new)
    return out


def _merge(old_value: Any, new_value: Any, old: str, new: str) -> Any:
    """A renamed section given under both names is merged; a field given under both is an error."""
    if not (isinstance(old_value, dict) and isinstance(new_value, dict)):
        raise ValueError(f"{new} is given twice, also under its old name {old}: keep only {new}")
    merged = dict(new_value)
    for key, value in old_value.items():
        merged[key] = _merge(value, merged[key], f"{old}.{key}", f"{new}.{key}") if key in merged else value
    return merged
