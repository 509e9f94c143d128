"""HTML from Jinja2 templates: one environment per package that ships a ``templates/`` folder.

Autoescaped (run data is text, never markup) and strict (a misspelt variable is an error, not an
empty string). Used by the run report (``asyncrl.telemetry``) and the credit view (``asyncrl.jobs``).
"""

from __future__ import annotations

from functools import cache

import jinja2


@cache
def templates(package: str) -> jinja2.Environment:
    """The template environment of ``package`` (its ``templates/`` folder, shipped as package data)."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
