"""``GET /api/openapi.json``: the ingest API described as OpenAPI 3.1, kept true by a test that
drives the served app with schemathesis (no 5xx; every answer as described)."""

from __future__ import annotations

from typing import Any

from ..outbox.enqueue import MAX_QUANTITY
from ..outbox.ids import TEXT_LIMIT

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def _problem(description: str, **headers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description,
                           "content": {"application/problem+json": {"schema": _PROBLEM_REF}}}
    if headers:
        out["headers"] = {k.replace("_", "-"): v for k, v in headers.items()}
    return out


def document(max_events: int, max_bytes: int) -> dict[str, Any]:
    text = {"type": "string", "minLength": 1, "maxLength": TEXT_LIMIT}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "billing-outbox ingest API",
            "version": "1",
            "description": "Usage events for Stripe, recorded with the outbox's rules. Not in "
                           "the producer's transaction: each event carries the producer's own "
                           "idempotency key, so a retry never counts twice.",
        },
        "paths": {"/api/v1/usage": {"post": {
            "operationId": "ingestUsage",
            "summary": "Record 1 to 1,000 usage events",
            "security": [{"ingestToken": []}],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Batch"}}}},
            "responses": {
                "200": {"description": "A result for each event, in the order sent.",
                        "content": {"application/json": {
                            "schema": {"$ref": "#/components/schemas/Results"}}}},
                "400": _problem("The body is not {\"events\": [ … ]} with at least one."),
                "401": _problem("No valid ingest token.", WWW_Authenticate={
                    "schema": {"type": "string"}}),
                "403": _problem("The token is revoked or has no ingest scope."),
                "405": _problem("Only POST is answered here."),
                "413": _problem(f"Over {max_events:,} events or {max_bytes:,} bytes."),
                "415": _problem("The body is not application/json."),
                "429": _problem("Past the token's rate.", Retry_After={
                    "schema": {"type": "string", "pattern": "^[0-9]+$"},
                    "description": "Seconds to wait."}),
            },
        }}},
        "components": {
            "securitySchemes": {"ingestToken": {
                "type": "http", "scheme": "bearer",
                "description": "A token from `billing-outbox tokens create NAME`."}},
            "schemas": {
                "Batch": {"type": "object", "required": ["events"],
                          "properties": {"events": {
                              "type": "array", "minItems": 1, "maxItems": max_events,
                              "items": {
                                  "description": "A UsageEvent. Each item stands alone: one "
                                                 "that is not a valid UsageEvent gets an "
                                                 "error result, the others are recorded.",
                                  "anyOf": [{"$ref": "#/components/schemas/UsageEvent"},
                                            {}]}}}},
                "UsageEvent": {
                    "type": "object", "additionalProperties": False,
                    "required": ["tenant_id", "quantity", "idempotency_key"],
                    "properties": {
                        "tenant_id": text,
                        "quantity": {"type": "integer", "minimum": 1,
                                     "maximum": MAX_QUANTITY},
                        "idempotency_key": {**text, "pattern": "^[ -~]+$",
                                            "description": "Derived from the producer's own "
                                                           "row, e.g. order:42."},
                        "meter": {"type": ["string", "null"], "minLength": 1,
                                  "maxLength": TEXT_LIMIT,
                                  "description": "Default: STRIPE_METER_EVENT_NAME."},
                        "occurred_at": {"type": ["string", "null"], "format": "date-time",
                                        "description": "RFC 3339 with its offset; at most "
                                                       "35 days old, 5 minutes ahead. "
                                                       "Default: now."},
                    }},
                "Results": {"type": "object", "required": ["results"], "properties": {
                    "results": {"type": "array",
                                "items": {"$ref": "#/components/schemas/Result"}}}},
                "Result": {
                    "type": "object", "required": ["idempotency_key", "status"],
                    "properties": {
                        "idempotency_key": {"description": "As sent (null when missing)."},
                        "status": {"enum": ["created", "duplicate", "error"]},
                        "id": {"type": "integer", "description": "The event's id."},
                        "error": {"type": "object", "required": ["field", "message"],
                                  "properties": {"field": {"type": "string"},
                                                 "message": {"type": "string"}}},
                    }},
                "Problem": {
                    "type": "object", "required": ["type", "title", "status", "detail"],
                    "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                                   "status": {"type": "integer"},
                                   "detail": {"type": "string"}}},
            },
        },
    }
