"""mqserver.runtime.soon: calls in the reactor's next turn, on the spinning reactor and elsewhere."""

from twisted.internet.task import Clock

from mqserver.runtime.reactor import SpinningEPollReactor
from mqserver.runtime.soon import call_soon


def test_call_soon_runs_in_the_next_turn_in_order_and_cancelled_calls_do_not():
    reactor = SpinningEPollReactor(spin=0)
    ran = []
    first = call_soon(reactor, ran.append, 1)
    dropped = call_soon(reactor, ran.append, 2)
    call_soon(reactor, ran.append, 3)
    assert ran == [] and first.active()
    dropped.cancel()
    assert not dropped.active()
    reactor.iterate(0)
    assert ran == [1, 3]
    assert not first.active()
    first.cancel()  # already ran: nothing happens, as for a DelayedCall checked first
    reactor.iterate(0)
    assert ran == [1, 3]


def test_a_call_queued_by_a_call_runs_without_the_poll_waiting():
    """A call queued while the queue runs (or by a timer) makes the next poll return at
    once: the reactor's timeout is 0 while anything is queued."""
    reactor = SpinningEPollReactor(spin=0)
    ran = []
    call_soon(reactor, lambda: call_soon(reactor, ran.append, "again"))
    reactor.callLater(60, ran.append, "timer")  # the poll would wait a minute for it
    reactor.iterate(0)
    assert reactor.timeout() == 0.0
    reactor.iterate(reactor.timeout())
    assert ran == ["again"]
    assert reactor.timeout() > 1


def test_an_error_in_one_call_is_logged_and_the_others_run():
    reactor = SpinningEPollReactor(spin=0)
    ran = []
    call_soon(reactor, lambda: 1 / 0)
    call_soon(reactor, ran.append, "after")
    errors = []
    from twisted.python import log

    log.addObserver(errors.append)
    try:
        reactor.iterate(0)
    finally:
        log.removeObserver(errors.append)
    assert ran == ["after"]
    assert any(e.get("isError") and "ZeroDivisionError" in str(e.get("failure")) for e in errors)


def test_other_reactors_get_call_later_zero():
    clock = Clock()
    ran = []
    call = call_soon(clock, ran.append, 1)
    assert call.active()
    clock.advance(0)
    assert ran == [1] and not call.active()
