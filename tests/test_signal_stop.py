"""A signal stops a member even when it lands inside the main thread's own Event.wait."""

import signal
import threading

from p2p.training.signal_stop import SignalStop


def test_a_signal_sets_the_event_and_close_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    event = threading.Event()
    stopper = SignalStop(event)
    assert signal.getsignal(signal.SIGTERM) is not before
    signal.raise_signal(signal.SIGTERM)
    assert event.wait(5.0)
    stopper.close()
    stopper.close()  # idempotent
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_handler_returns_while_the_events_lock_is_held():
    # What CI hit: SIGTERM arrived while the main thread was inside stop_event.wait(), holding
    # the event's condition lock; a handler calling Event.set() blocked on it forever. The
    # handler here must return at once, and the event be set once the lock is released.
    event = threading.Event()
    stopper = SignalStop(event)
    try:
        returned = threading.Event()
        with event._cond:  # the lock Event.wait holds around its checks
            handler = threading.Thread(target=lambda: (stopper._on_signal(signal.SIGTERM, None), returned.set()),
                                       daemon=True)
            handler.start()
            handler.join(5.0)
            assert returned.is_set(), "the signal handler blocked on the event's lock"
        assert event.wait(5.0)
    finally:
        stopper.close()
