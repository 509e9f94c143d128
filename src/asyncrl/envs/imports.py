"""Importing user code named ``package.module:NAME`` (plugin environments, scorers), with errors in words."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Any

from asyncrl.errors import UserError

__all__ = ["EnvPluginError", "import_object"]


class EnvPluginError(UserError, ValueError):
    """A plugin environment could not be loaded, built, or does not follow the contract.

    A :class:`~asyncrl.errors.UserError`: the CLI prints the message without a traceback."""


def import_object(path: str, *, what: str = "ClassName") -> Any:
    """Import ``package.module:NAME`` (the current directory is searched too, after installed
    packages); :class:`EnvPluginError` for a malformed path, a missing module, an import that fails
    inside the module or a missing attribute. ``what`` names NAME in the messages."""
    parts = [s.strip() for s in path.split(":")] if isinstance(path, str) else []
    module_name, attr = parts if len(parts) == 2 else ("", "")
    if not module_name or not attr:
        raise EnvPluginError(f"plugin path {path!r} must look like 'package.module:{what}'")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        # Console scripts do not put the working directory on sys.path; a plugin module next to
        # the user's config should still be found (appended, so it never shadows a package).
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise EnvPluginError(
                f"module {module_name!r} not found (is the package installed, or on PYTHONPATH?)"
            ) from None
        raise EnvPluginError(
            f"importing {module_name!r} failed: it needs module {missing!r}, which is not installed"
        ) from None
    except SyntaxError as exc:
        raise EnvPluginError(
            f"importing {module_name!r} failed: syntax error in {exc.filename}, line {exc.lineno}: {exc.msg}"
        ) from None
    except Exception as exc:
        raise EnvPluginError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise EnvPluginError(f"{module_name!r} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    return obj
