"""What a run prints: bars that keep the last accuracy, logging through the bar, no misleading verl warning."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from dataflex_rl.tinylm.progress import progress_bar, show_latest


def test_postfix_keeps_the_last_finite_value_between_evaluations():
    with progress_bar(total=3, desc="GRPO") as bar:
        show_latest(bar, reward=0.5, acc=0.25)
        show_latest(bar, reward=0.75, acc=float("nan"))  # no evaluation at this step
        assert bar.postfix == "reward=0.750, acc=0.250"
        show_latest(bar, reward=None, acc=0.5)
        assert bar.postfix == "reward=0.750, acc=0.500"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream", ["stderr", "stdout"])
def test_log_lines_go_through_the_bar_in_a_terminal(monkeypatch, stream):
    """The console handler writes to stdout (Hydra's job logging) or stderr; either way a record logged while the bar
    is open prints on its own line, whole (no wrap at the terminal's width), above the bar."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(sys, "stdout", terminal)  # one terminal, as in a shell
    root = logging.getLogger()  # where the job logging puts its console handler
    handler = logging.StreamHandler(getattr(sys, stream))
    root.addHandler(handler)
    message = "a log line " + "long " * 40
    try:
        with progress_bar(total=2, desc="SFT") as bar:
            assert handler.stream is not terminal  # it writes through the live display while the bar is open
            logging.getLogger("dataflex_rl.test_progress").warning(message)
            bar.update(1)
        assert handler.stream is terminal  # restored afterwards
    finally:
        root.removeHandler(handler)
    # the display erases the bar's line, prints the message on its own line, then redraws the bar below it
    output = terminal.getvalue()
    assert "\r\x1b[2K" + message + "\n" in output
    assert output.index("a log line") < output.rindex("1/2")


def test_verl_cpu_only_actor_warning_is_dropped_on_the_local_backend(caplog):
    import dataflex_rl.local.train  # noqa: F401  (installs the filter)

    platform = logging.getLogger("verl.plugin.platform.platform_manager")
    with caplog.at_level(logging.WARNING, logger=platform.name):
        platform.warning("No supported accelerator detected. Registered: ('nvidia',). Falling back to 'nvidia'.")
        platform.warning("Platform 'nvidia' is registered but not available. This may be due to this ray actor "
                         "being a CPU-only actor.")
        platform.warning("something else")
    assert [record.getMessage() for record in caplog.records] == ["something else"]
