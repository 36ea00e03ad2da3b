"""``python -m webapp`` is ``billing-outbox``."""

from .main import main

main()
