"""The progress line: shown on a terminal for long waits, silent otherwise."""

import io
import sys

from fxcc.client.remote import Progress


def test_progress_line_for_long_waits_only():
    out = io.StringIO()
    p = Progress("a" * 64, out)
    p.update({"state": "running", "stage": "lowering", "worker": "w1"}, 0.5)
    assert out.getvalue() == ""  # a quick compile says nothing
    p.update({"state": "running", "stage": "building", "worker": "w1"}, 3.2)
    p.update({"state": "done", "stage": "done", "worker": "w1"}, 4.0)
    p.close()
    text = out.getvalue()
    assert text.startswith("\rfxcc: compiling graph aaaaaaaaaaaa: building on w1") and text.endswith("\n")
    assert text.count("\r") == 2


def test_silent_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert Progress.for_stderr("k" * 64) is None
