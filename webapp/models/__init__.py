"""The tables. Datetimes are timezone-aware (UTC) on both databases.

``outbox`` (events, attempts, tenants, the switch), ``rollups``, ``reports`` (prepared usage
reports), ``people`` (users, audit), ``billing`` (Stripe's subscriptions and invoices) and
``stripe_sync`` (what is kept of Stripe's side:
meters, its events, reconciliation).
"""

from .base import NAMING, Base, BigID, UTCDateTime, utcnow
from .billing import (
    BillingWatch,
    LateLine,
    LateUsage,
    LineEvent,
    StripeInvoice,
    StripeInvoicePeriod,
    StripeSubscription,
    StripeSubscriptionItem,
    UnbilledUsage,
)
from .limits import TEXT_LIMIT, clean, fit, fit_json_list, fit_key, fits, limit_of
from .notify import NotifyAlert, NotifyDelivery
from .outbox import (
    DEAD_FITS_SQL,
    DEAD_OUTSIZE_SQL,
    IN_FLIGHT_SQL,
    INVOICE_FIRST_SQL,
    WAITING_IDLE_SQL,
    Control,
    DeliveryAttempt,
    DrainerHeartbeat,
    OutboxEvent,
    Tenant,
)
from .people import AuditEntry, AuditEvent, LoginThrottle, User
from .producers import IngestToken, OutboxSetting
from .reports import REPORT_STATUSES, UsageReport, UsageReportRow
from .rollups import (
    AttemptRollup,
    PrunedUsageRollup,
    RollupState,
    SentUsageDay,
    SentUsageMonthly,
    SentUsageRollup,
    SentUsageYearly,
)
from .stripe_sync import (
    ReconciledDay,
    ReconciledMeterDay,
    ReconciledMonth,
    ReconciliationMismatch,
    ReconciliationRun,
    StreamRequest,
    StripeCustomerCheck,
    StripeErrorSample,
    StripeEvent,
    StripeMeter,
    SyncState,
)

__all__ = [
    "DEAD_FITS_SQL", "DEAD_OUTSIZE_SQL", "IN_FLIGHT_SQL", "INVOICE_FIRST_SQL", "NAMING",
    "REPORT_STATUSES",
    "WAITING_IDLE_SQL",
    "AttemptRollup", "AuditEntry", "AuditEvent",
    "Base", "BigID", "BillingWatch", "Control", "DeliveryAttempt", "DrainerHeartbeat",
    "IngestToken", "LateLine", "LateUsage", "LineEvent",
    "LoginThrottle", "NotifyAlert", "NotifyDelivery",
    "OutboxEvent", "OutboxSetting",
    "PrunedUsageRollup", "ReconciledDay", "ReconciledMeterDay", "ReconciledMonth",
    "ReconciliationMismatch",
    "ReconciliationRun", "RollupState", "SentUsageDay", "SentUsageMonthly", "SentUsageRollup",
    "SentUsageYearly",
    "StripeCustomerCheck", "StripeErrorSample", "StripeEvent", "StripeInvoice",
    "StripeInvoicePeriod", "StripeSubscription", "StripeSubscriptionItem",
    "StripeMeter", "StreamRequest", "SyncState", "TEXT_LIMIT", "Tenant", "UTCDateTime",
    "UsageReport",
    "UnbilledUsage", "UsageReportRow", "User", "clean", "fit",
    "fit_json_list", "fit_key", "fits", "limit_of", "utcnow",
]
