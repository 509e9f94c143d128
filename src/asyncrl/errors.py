"""Errors meant for people: the CLI prints their message and exits with code 2, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """Base class of every error caused by user input (config, paths, plugins, checkpoints).

    Subclasses in other modules (``ConfigError``, ``EnvPluginError``, ``PolicyLoadError`` ...)
    are registered here by inheriting from it, so the CLI needs one ``except``.
    """
