"""``python -m webapp`` is ``billing-outbox``."""

from .web.cli import main

main()
