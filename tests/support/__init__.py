"""Test support shared by the suite and the benchmarks: the loopback fake of Stripe
(:mod:`.fake_stripe`). Not part of the product: nothing under ``webapp/`` imports it."""
