"""A stop held while a step's record is written: delivered once the block ends, to the handler in place before."""

from __future__ import annotations

import signal

import pytest

from dataflex_rl.interrupts import held_interrupts, raise_on_sigterm


@pytest.fixture
def restore_handlers():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_inside_the_block_is_delivered_after_it(restore_handlers, signum):
    raise_on_sigterm()
    before = signal.getsignal(signum)
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts():
            signal.raise_signal(signum)  # to this thread: delivered now, not to a helper thread later
            finished.append("rest of the block")  # not cut short by the signal
    assert finished == ["rest of the block"]
    assert signal.getsignal(signum) is before


def test_no_stop_no_interrupt_and_handlers_restored(restore_handlers):
    raise_on_sigterm()
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with held_interrupts():
        pass
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_a_stop_during_a_block_that_raised_is_still_delivered(restore_handlers):
    raise_on_sigterm()
    with pytest.raises(KeyboardInterrupt) as caught:
        with held_interrupts():
            signal.raise_signal(signal.SIGTERM)
            raise OSError("disk full")
    assert isinstance(caught.value.__context__, OSError)  # the block's own error is chained, not lost


def test_sigterm_raises_keyboard_interrupt_after_install(restore_handlers):
    raise_on_sigterm()
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        signal.raise_signal(signal.SIGTERM)


def test_nested_blocks_deliver_once_when_the_outer_one_ends(restore_handlers):
    raise_on_sigterm()
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts():
            with held_interrupts():
                signal.raise_signal(signal.SIGTERM)
            reached.append("after the inner block")  # the inner block handed the signal to the outer one
    assert reached == ["after the inner block"]


def test_an_ignored_sigint_does_not_swallow_a_held_sigterm(restore_handlers):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup
    raise_on_sigterm()
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        with held_interrupts():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
