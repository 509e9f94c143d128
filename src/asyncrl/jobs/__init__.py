"""Offline jobs: work a user starts on a config outside a run's roles (``asyncrl env signal``)."""
