"""``POST /stripe/webhook``: Stripe's event destination pushes thin events here. The view only
verifies the signature (through the SDK, with ``STRIPE_WEBHOOK_SECRET``) and hands the event
on, read in full, to the same store the poll uses (an invoice or subscription event: that
invoice or subscription, read and kept as the billing refresher keeps it; a deleted draft is
kept as deleted); no session, no CSRF token (Stripe signs
instead). Without a secret the route does not exist (404) and polling alone is used."""

from __future__ import annotations

import logging

from flask import Blueprint, abort, jsonify, request
from flask.typing import ResponseReturnValue

from ..db import reading
from ..outbox.error_reports import REPORT_TYPES
from ..outbox.invoices import mark_deleted
from ..outbox.rejections import is_stored
from ..stripe_gateway import InvalidSignature, StripeCallFailed
from ..worker import (
    INVOICE_DELETED,
    INVOICE_EVENT_TYPES,
    SUBSCRIPTION_TYPES,
    MeterRefresher,
    customer_directory,
    receive_invoice,
    receive_report,
    receive_subscription,
)
from .common import now, svc

bp = Blueprint("webhook", __name__)
log = logging.getLogger(__name__)


@bp.post("/stripe/webhook")
def receive() -> ResponseReturnValue:
    """400 (nothing stored) on a missing or bad signature; 200 on a duplicate or a type the
    outbox does not read; 503 when the event cannot be read from Stripe (it pushes again)."""
    settings = svc().settings
    secret = settings.stripe_webhook_secret
    gateway = svc().gateway()
    if not secret or gateway is None:
        abort(404)
    try:
        thin = gateway.parse_notification(request.get_data(cache=False),
                                          request.headers.get("Stripe-Signature"), secret)
    except InvalidSignature:
        log.warning("webhook: a push with a missing or bad signature was refused")
        return jsonify(status="error", message="bad signature"), 400
    if thin.type == INVOICE_DELETED and thin.related_id:
        mark_deleted(svc().engine, [thin.related_id])
        return jsonify(status="stored", id=thin.id, type=thin.type)
    if thin.type in INVOICE_EVENT_TYPES and thin.related_id:
        what = "subscription" if thin.type in SUBSCRIPTION_TYPES else "invoice"
        receive = receive_subscription if what == "subscription" else receive_invoice
        try:
            kept = receive(svc().engine, gateway, thin.related_id, now=now())
        except StripeCallFailed as exc:
            log.warning("webhook: %s %s could not be read from Stripe: %s", what,
                        thin.related_id, exc)
            return jsonify(status="error",
                           message=f"could not read the {what}; push again"), 503
        return jsonify(status="stored" if kept else "ignored", id=thin.id, type=thin.type)
    if thin.type not in REPORT_TYPES:
        return jsonify(status="ignored", id=thin.id, type=thin.type)
    with reading(svc().engine) as conn:
        if is_stored(conn, thin.id):
            return jsonify(status="duplicate", id=thin.id)
    try:
        report = gateway.retrieve_event(thin.id)
    except StripeCallFailed as exc:
        log.warning("webhook: event %s could not be read from Stripe: %s", thin.id, exc)
        return jsonify(status="error", message="could not read the event; push again"), 503
    meters = MeterRefresher(svc().engine, gateway, clock=svc().clock)
    applied = receive_report(svc().engine, report, source="webhook", now=now(),
                           on_meter_codes=meters.run_once,
                           customers=customer_directory(svc().engine, gateway, settings,
                                                        clock=svc().clock))
    return jsonify(status="stored" if applied.stored else "duplicate", id=thin.id,
                   rejected=applied.rejected, unmatched=applied.unmatched)
