"""``python -m asyncrl.cli``: the ``asyncrl`` command."""

from asyncrl.cli import main

raise SystemExit(main())
