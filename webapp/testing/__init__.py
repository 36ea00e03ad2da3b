"""Test helpers: a loopback fake of Stripe's meter-event endpoint (:mod:`.fake_stripe`)."""
