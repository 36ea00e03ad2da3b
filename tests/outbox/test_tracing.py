"""Which events of a stream request a sample naming it singles out (``outbox.tracing``): each
rule, and that nothing is picked when nothing singles an event out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from webapp.outbox.customers import ACTIVE, DELETED, MISSING, CustomerCheck
from webapp.outbox.tracing import (
    BY_CUSTOMER,
    BY_REQUEST,
    Carried,
    StreamRequestRecord,
    identifier_tag,
    parse_carried,
    single_out,
)

SENT_AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ev(i: int, customer: str = "cus_a", meter: str = "api", *,
       occurred: datetime = SENT_AT - timedelta(hours=1), ident: str | None = None) -> Any:
    return SimpleNamespace(id=i, sent_as=ident or f"k{i}", meter=meter,
                           stripe_customer_id=customer, occurred_at=occurred)


def request(*events: Any) -> StreamRequestRecord:
    return StreamRequestRecord("bo-stream-x", SENT_AT, None,
                               tuple(Carried(e.id, identifier_tag(e.sent_as)) for e in events))


def pick(code: str | None, message: str | None, events: list[Any], *, meter: str | None = None,
         customers: dict[str, CustomerCheck] | None = None) -> tuple[list[int], str, list[int]]:
    traced = single_out(code, message, request(*events), {e.id: e for e in events},
                        meter=meter, customers=customers or {})
    return ([e.id for e in traced.events], traced.found_by,
            [e.id for e in traced.candidates])


def test_a_customer_stripe_lacks_or_deleted_refuses_each_of_its_events() -> None:
    events = [ev(1, "cus_a"), ev(2, "cus_b"), ev(3, "cus_c"), ev(4, "cus_b")]
    checks = {"cus_a": CustomerCheck("cus_a", ACTIVE), "cus_b": CustomerCheck("cus_b", MISSING),
              "cus_c": CustomerCheck("cus_c", DELETED)}
    assert pick("meter_event_customer_not_found", "not found", events, customers=checks) == (
        [2, 3, 4], BY_CUSTOMER, [])


def test_a_customer_named_in_the_message_needs_no_asking() -> None:
    events = [ev(1, "cus_a"), ev(2, "cus_ab"), ev(3, "cus_ab")]
    assert pick("meter_event_customer_not_found", "No such customer: 'cus_ab'.", events) == (
        [2, 3], BY_REQUEST, [])


def test_unasked_customers_single_nothing_out() -> None:
    events = [ev(1, "cus_a"), ev(2, "cus_b")]
    assert pick("meter_event_customer_not_found", "not found", events) == ([], BY_REQUEST, [1, 2])


def test_the_reports_meter_narrows_and_one_left_is_the_one() -> None:
    events = [ev(1, meter="api"), ev(2, meter="tokens"), ev(3, meter="api")]
    assert pick("meter_event_invalid_value", "bad", events, meter="tokens") == (
        [2], BY_REQUEST, [])
    assert pick("meter_event_invalid_value", "bad", events, meter="api") == ([], BY_REQUEST,
                                                                            [1, 3])


def test_an_identifier_named_in_the_message_is_the_one() -> None:
    events = [ev(1), ev(2), ev(3)]
    assert pick("meter_event_invalid_value", "event k2 has a bad value", events) == (
        [2], BY_REQUEST, [])
    assert pick("meter_event_invalid_value", "event k22 has a bad value", events)[0] == []


def test_meter_level_codes_refuse_every_event_of_the_one_meter() -> None:
    events = [ev(1, meter="api"), ev(2, meter="api", customer="cus_b")]
    for code in ("no_meter", "archived_meter", "meter_event_no_customer_defined"):
        assert pick(code, "x", events)[0] == [1, 2]
    two = [ev(1, meter="api"), ev(2, meter="tokens")]
    assert pick("no_meter", "no meter", two)[0] == []
    assert pick("no_meter", "No meter was found for event_name 'tokens'.", two)[0] == [2]


def test_timestamps_out_of_range_are_singled_out_by_the_request_time() -> None:
    events = [ev(1), ev(2, occurred=SENT_AT - timedelta(days=35, seconds=1)),
              ev(3, occurred=SENT_AT + timedelta(minutes=6))]
    assert pick("timestamp_too_far_in_past", "old", events)[0] == [2]
    assert pick("timestamp_in_future", "ahead", events)[0] == [3]


def test_an_event_requeued_under_a_new_identifier_is_not_the_one_carried() -> None:
    old = ev(1, ident="k1")
    record = request(old)
    now = {1: ev(1, ident="k1~r1")}
    traced = single_out("meter_event_invalid_value", "bad", record, now, meter=None,
                        customers={})
    assert traced.events == [] and traced.stale


def test_one_left_is_not_the_one_while_a_requeued_or_pruned_sibling_could_be() -> None:
    """A request carried a ghost customer's event and a known customer's; the ghost's was
    requeued since. Stripe says the known customer exists: the survivor is not refused."""
    ghost, ok = ev(1, "cus_ghost", ident="k1"), ev(2, "cus_ok", ident="k2")
    record = request(ghost, ok)
    now = {1: ev(1, "cus_ghost", ident="k1~r1"), 2: ok}
    checks = {"cus_ok": CustomerCheck("cus_ok", ACTIVE)}
    for code in ("meter_event_customer_not_found", "meter_event_invalid_value"):
        traced = single_out(code, "refused", record, now, meter=None, customers=checks)
        assert traced.events == [] and [e.id for e in traced.candidates] == [2]
    # pruned since: the same
    traced = single_out("meter_event_invalid_value", "bad", record, {2: ok}, meter=None,
                        customers=checks)
    assert traced.events == [] and [e.id for e in traced.candidates] == [2]
    # a sibling of another meter than the report's cannot be it: the survivor is the one
    other = ev(1, "cus_ghost", meter="tokens", ident="k1~r1")
    traced = single_out("meter_event_invalid_value", "bad", record, {1: other, 2: ok},
                        meter="api", customers=checks)
    assert [e.id for e in traced.events] == [2]
    # and the ghost's customer, when Stripe lacks it, still singles out a live event of it
    both = {1: ghost, 2: ok}
    checks["cus_ghost"] = CustomerCheck("cus_ghost", MISSING)
    traced = single_out("meter_event_customer_not_found", "x", record, both, meter=None,
                        customers=checks)
    assert [e.id for e in traced.events] == [1] and traced.found_by == BY_CUSTOMER


def test_the_kept_list_of_events_reads_back() -> None:
    assert parse_carried("12:0a0b0c0d,13:ffffffff") == (Carried(12, "0a0b0c0d"),
                                                       Carried(13, "ffffffff"))
    assert parse_carried("") == ()
