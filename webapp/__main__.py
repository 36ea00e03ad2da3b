"""``python -m webapp`` is ``billing-outbox``."""

from .cli import main

main()
