"""``python -m tests.support.fake_stripe``: serve a fake until SIGTERM."""

from .fake import main

raise SystemExit(main())
