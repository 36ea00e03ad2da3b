"""What `make run` prints before serving: the next steps for a new installation."""

from __future__ import annotations

import os

from .app import create_app
from .config import listen_address
from .read.users import user_count
from .services import services_of


def main() -> None:
    app = create_app(start_drainer=False)
    svc = services_of(app)
    where = listen_address()
    lines = ["", f"billing-outbox is starting on {where}", ""]
    if user_count(svc.engine) == 0:
        lines += ["No user exists yet. Create the first admin in another terminal:",
                  "  .venv/bin/billing-outbox users create you@example.com --role admin", ""]
    if not svc.settings.stripe_api_key:
        lines += ["STRIPE_API_KEY is not set: events are queued but nothing is sent.",
                  "  export STRIPE_API_KEY=sk_test_…  (then restart)", ""]
    lines += ["Map tenants to Stripe customers:",
              "  .venv/bin/billing-outbox tenants set TENANT --stripe-customer cus_…", ""]
    print("\n".join(lines), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
