"""How a message reaches people: a Slack incoming webhook (Block Kit), a signed JSON webhook,
and email over SMTP. Each ``send`` either returns the receiver's status or raises
:class:`DeliveryFailed` with one line a person can read; none of them ever says a channel's
secret (the Slack URL, the webhook secret, the SMTP password)."""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import smtplib
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

from ...config import CHANNEL_NAMES, Notify

SIGNATURE_HEADER = "Billing-Outbox-Signature"
USER_AGENT = "billing-outbox-notifier"
#: Slack's limits: a header block's text, a section's text.
SLACK_HEADER_MAX, SLACK_TEXT_MAX = 150, 3000
#: How each severity starts a line, where colour cannot be relied on.
MARKS = {"critical": "🔴", "warning": "🟠", "info": "🔵", "resolved": "✅", "test": "🧪"}


class DeliveryFailed(Exception):
    """A channel did not take the message: why, and the receiver's status where it gave one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# -- the words ------------------------------------------------------------------------------------

def headline(message: Mapping[str, Any]) -> str:
    """The one line that says what happened: its mark, whether it ended, and the title."""
    if message["kind"] == "test":
        return f"{MARKS['test']} {message['title']}"
    if message["state"] == "resolved":
        return f"{MARKS['resolved']} Resolved: {message['title']}"
    return f"{MARKS.get(message['severity'], MARKS['info'])} {message['title']}"


def _when(value: str | None) -> str:
    if not value:
        return ""
    at = datetime.fromisoformat(value)
    return at.strftime("%Y-%m-%d %H:%M UTC")


def facts(message: Mapping[str, Any]) -> str:
    """The exact facts under the words: kind, rows counted, since when, the message's id."""
    parts = [f"kind {message['kind']}"]
    if message.get("count"):
        parts.append(f"{message['count']:,} row(s)")
    if message.get("started_at"):
        parts.append(f"since {_when(message['started_at'])}")
    parts.append(f"id {message['id']}")
    return " · ".join(parts)


def slack_payload(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message as Slack Block Kit: a header, the text, the facts, a button to the rows
    (and ``text``, what notifications and old clients show)."""
    title = headline(message)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "emoji": True,
                                    "text": _cut(title, SLACK_HEADER_MAX)}},
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": _cut(_slack_escape(message["text"] or title),
                                                  SLACK_TEXT_MAX)}},
        {"type": "context", "elements": [{"type": "mrkdwn",
                                          "text": _slack_escape(facts(message))}]},
    ]
    if str(message.get("url") or "").startswith(("http://", "https://")):
        blocks.append({"type": "actions", "elements": [{
            "type": "button", "text": {"type": "plain_text", "text": "Open in the dashboard"},
            "url": message["url"]}]})
    return {"text": _cut(_slack_escape(title), SLACK_TEXT_MAX), "blocks": blocks}


def email_message(message: Mapping[str, Any], settings: Notify) -> EmailMessage:
    """The message as an email: a subject that says it all, a plain-text and an HTML part."""
    msg = EmailMessage()
    msg["Subject"] = f"[billing-outbox] {headline(message)}"
    msg["From"] = settings.email_from or ""
    msg["To"] = ", ".join(settings.email_to)
    msg["Message-ID"] = make_msgid(idstring=message["id"], domain="billing-outbox")
    link = message.get("url") or ""
    msg.set_content(f"{headline(message)}\n\n{message['text']}\n\n"
                    + (f"Open in the dashboard: {link}\n\n" if link else "")
                    + f"{facts(message)}\n")
    esc = html.escape
    paragraphs = "".join(f"<p>{esc(line)}</p>" for line in str(message["text"]).split("\n"))
    button = (f'<p><a href="{esc(link, quote=True)}">Open in the dashboard</a></p>'
              if link else "")
    msg.add_alternative(
        f"<!doctype html><html><body style=\"font-family:sans-serif;max-width:40em\">"
        f"<h2 style=\"font-size:1.2em\">{esc(headline(message))}</h2>{paragraphs}{button}"
        f"<p style=\"color:#555;font-size:.85em\">{esc(facts(message))}</p></body></html>",
        subtype="html")
    return msg


def _slack_escape(text: str) -> str:
    """Slack's mrkdwn reads &, < and > as markup: escaped, as Slack asks."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


# -- the signature --------------------------------------------------------------------------------

def signature(secret: str, body: bytes, *, timestamp: int) -> str:
    """``Billing-Outbox-Signature``'s value: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of
    "<t>.<body>">``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, *, tolerance: float = 300.0,
           now: float | None = None) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` and is at most ``tolerance`` seconds
    old: what a receiver does (constant-time comparison)."""
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        fields.setdefault(key, []).append(value)
    try:
        t = int(fields["t"][0])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance:
        return False
    expected = signature(secret, body, timestamp=t).split("v1=", 1)[1]
    return any(hmac.compare_digest(expected, v) for v in fields.get("v1", []))


# -- sending --------------------------------------------------------------------------------------

class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _post(url: str, body: bytes, headers: Mapping[str, str], *, timeout: float,
          who: str) -> int:
    # http(s) only: the URLs were checked when the settings were read.
    request = urllib.request.Request(url, data=body, method="POST", headers={  # noqa: S310
        "Content-Type": "application/json", "User-Agent": USER_AGENT, **headers})
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        said = exc.read(200).decode("utf-8", "replace").strip()
        raise DeliveryFailed(f"{who} answered HTTP {exc.code}" + (f": {said}" if said else ""),
                             exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryFailed(f"{who} could not be reached: {reason}") from None


def send_slack(message: Mapping[str, Any], settings: Notify) -> int:
    assert settings.slack_webhook_url
    body = json.dumps(slack_payload(message)).encode()
    return _post(settings.slack_webhook_url, body, {}, timeout=settings.timeout_seconds,
                 who="Slack")


def send_webhook(message: Mapping[str, Any], settings: Notify, *,
                 now: float | None = None) -> int:
    assert settings.webhook_url and settings.webhook_secret
    body = json.dumps(dict(message), separators=(",", ":")).encode()
    stamp = int(time.time() if now is None else now)
    return _post(settings.webhook_url, body,
                 {SIGNATURE_HEADER: signature(settings.webhook_secret, body, timestamp=stamp)},
                 timeout=settings.timeout_seconds, who="The webhook")


def send_email(message: Mapping[str, Any], settings: Notify) -> int:
    smtp = settings.smtp
    assert smtp is not None
    context = ssl.create_default_context()
    try:
        client: smtplib.SMTP = (
            smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=settings.timeout_seconds,
                             context=context) if smtp.tls
            else smtplib.SMTP(smtp.host, smtp.port, timeout=settings.timeout_seconds))
        with client:
            client.ehlo()
            if not smtp.tls and client.has_extn("starttls"):
                client.starttls(context=context)
                client.ehlo()
            if smtp.user:
                client.login(smtp.user, smtp.password or "")
            refused = client.send_message(email_message(message, settings))
            if refused:
                raise DeliveryFailed("The mail server refused "
                                     + ", ".join(sorted(refused)))
            return 250
    except smtplib.SMTPResponseException as exc:
        said = exc.smtp_error.decode("utf-8", "replace") if isinstance(
            exc.smtp_error, bytes) else str(exc.smtp_error)
        raise DeliveryFailed(f"The mail server answered {exc.smtp_code}: {said}",
                             exc.smtp_code) from None
    except smtplib.SMTPRecipientsRefused as exc:
        raise DeliveryFailed("The mail server refused "
                             + ", ".join(sorted(exc.recipients))) from None
    except (smtplib.SMTPException, OSError) as exc:
        raise DeliveryFailed(f"The mail server could not be reached: {exc}") from None


SENDERS = {"slack": send_slack, "webhook": send_webhook, "email": send_email}
NAMES = CHANNEL_NAMES


def send(channel: str, message: Mapping[str, Any], settings: Notify) -> int:
    """Send ``message`` on ``channel``; the receiver's status (HTTP, or 250 for mail)."""
    return SENDERS[channel](message, settings)
