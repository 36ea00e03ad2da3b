"""The drain loop of a long-lived worker: passes back to back while there is a backlog, a
poll interval's sleep when idle, until asked to stop."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from .drainer import Drainer, Pass

log = logging.getLogger(__name__)


def run(drainer: Drainer) -> None:
    """Drain until ``drainer.request_stop()``; then finish or release what is held."""
    log.info("worker %s started", drainer.worker)
    try:
        if drainer.pipelined:
            _run_pipelined(drainer)
        else:
            _run_sequential(drainer)
    finally:
        drainer.close()
        log.info("worker %s stopped", drainer.worker)


def _run_sequential(d: Drainer) -> None:
    """One pass at a time (SQLite: every phase writes behind the same lock anyway)."""
    poll = d.settings.poll_interval_seconds
    while not d.stopping.is_set():
        try:
            summary = d.drain_once()
        except Exception:
            log.exception("drain pass failed; retrying after the poll interval")
            d.stopping.wait(poll)
            continue
        full = summary.claimed >= d.settings.batch_size and not summary.released
        if not full:
            d.stopping.wait(poll)


def _run_pipelined(d: Drainer) -> None:
    """``drain_once`` in a loop, with its three phases overlapped across batches: while
    batch N is being sent, batch N+1 is claimed (a claimer thread) and batch N-1's outcomes
    are recorded (a recorder thread), each on a connection of its own.

    The guarantees are the sequential loop's: a batch is sent only after the previous one's
    calls have all returned and its lanes were released, so lanes never overlap; every write
    is still token-guarded; a batch claimed ahead is released untouched when the worker stops
    or its current batch met a systemic answer (an operator's pause takes effect at the next
    claim, as in the sequential loop, so after at most the two batches held). Claiming ahead
    happens only after a full, clean batch (a backlog), never while probing or with the
    breaker not closed.
    """
    poll = d.settings.poll_interval_seconds
    claimer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-claim")
    recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-record")
    ahead: Future[Pass] | None = None
    recording: Future[None] | None = None
    try:
        while not d.stopping.is_set():
            with d.pass_lock:
                try:
                    if ahead is not None:
                        p, ahead = ahead.result(), None
                    else:
                        p = d.begin()
                except Exception:
                    log.exception("drain pass failed; retrying after the poll interval")
                    d.stopping.wait(poll)
                    continue
                if p.claim is None or not p.claim.events:
                    d.stopping.wait(poll)
                    continue
                backlog = (p.events >= d.settings.batch_size and not p.probing
                           and d.breaker.allow_batch() is None)
                if backlog:
                    ahead = claimer.submit(d.begin, ahead=True)
                try:
                    d.send(p)
                except Exception:
                    log.exception("sending a batch failed; what was sent is recorded, the "
                                  "rest returns to the queue when its claim expires")
                if p.sent.aborted and ahead is not None:
                    _release_ahead(d, ahead)  # sending was paused while it was claimed
                    ahead = None
                if recording is not None:
                    _await_record(recording)
                recording = recorder.submit(d.finish, p)
            if ahead is None and (not backlog or p.sent.released_any()):
                d.stopping.wait(poll)
    finally:
        if ahead is not None:
            _release_ahead(d, ahead)
        if recording is not None:
            _await_record(recording)
        claimer.shutdown(wait=True)
        recorder.shutdown(wait=True)


def _release_ahead(d: Drainer, ahead: Future[Pass]) -> None:
    """Return a batch claimed ahead to the queue untouched."""
    try:
        p = ahead.result()
    except Exception:
        log.exception("claiming ahead failed")
        return
    d.release_pass(p)


def _await_record(recording: Future[None]) -> None:
    try:
        recording.result()
    except Exception:
        log.exception("recording a batch failed; its events return to the queue when their "
                      "claim expires")
