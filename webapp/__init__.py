"""billing-outbox: usage reported to Stripe from a transactional outbox, and its dashboard.

``create_app`` (:mod:`webapp.app`) is the composition root; ``flask --app webapp`` finds it
here. Nothing starts at import time, and no module of the package imports this one back.
"""

from .app import create_app
from .config import ConfigError
from .services import Services, services_of

__all__ = ["ConfigError", "Services", "create_app", "services_of"]
