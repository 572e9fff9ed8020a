"""The progress line (grader/frontends/progress.py) that batch and mutate draw for a person at a terminal: counts,
a bar and the time left, redrawn in place; log lines above it; and nothing but the log lines off a terminal."""

import io

import pytest

from grader.frontends import progress as progress_mod
from grader.frontends.progress import ERASE, Progress, duration, on_a_terminal


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_off_a_terminal_only_the_log_lines_are_written():
    out = io.StringIO()
    with Progress(3, "submissions", out) as bar:  # a StringIO is no terminal: decided by the streams
        bar.advance()
        bar.write("[1/3] alice: 19 passed")
        bar.advance(2)
    assert out.getvalue() == "[1/3] alice: 19 passed\n"


def test_the_line_counts_and_estimates_the_time_left():
    clock = Clock()
    bar = Progress(4, "submissions", io.StringIO(), enabled=True, clock=clock, bar_width=8)
    assert bar.line() == "0/4 submissions  [........]  0%  0:00 so far"  # no estimate before one is done
    clock.now += 10
    bar.advance()
    assert bar.line() == "1/4 submissions  [##......]  25%  0:10 so far, about 0:30 left"
    clock.now += 50
    bar.advance(3)
    assert bar.line() == "4/4 submissions  [########]  100%  1:00 so far"
    bar.restart(45, "mutants", label="p6")
    assert bar.line() == "p6  0/45 mutants  [........]  0%  0:00 so far"


def test_on_a_terminal_the_line_is_redrawn_in_place_and_erased_at_the_end():
    out, clock = Terminal(), Clock()
    with Progress(2, "mutants", out, enabled=True, clock=clock, bar_width=4, label="p3") as bar:
        clock.now += 2
        bar.advance()
        bar.write("p3 swap-args, line 12: survived")
        bar.write("p3 drop-wait, line 20: survived", advance=1)
    drawn = out.getvalue()
    assert drawn == ("\rp3  0/2 mutants  [....]  0%  0:00 so far" + ERASE +
                     "\rp3  1/2 mutants  [##..]  50%  0:02 so far, about 0:02 left" + ERASE +
                     "\r" + ERASE + "p3 swap-args, line 12: survived\n" +
                     "\rp3  1/2 mutants  [##..]  50%  0:02 so far, about 0:02 left" + ERASE +
                     "\r" + ERASE + "p3 drop-wait, line 20: survived\n" +
                     "\rp3  2/2 mutants  [####]  100%  0:02 so far" + ERASE +
                     "\r" + ERASE)


def test_the_line_is_never_wider_than_the_terminal(monkeypatch):
    monkeypatch.setattr(progress_mod.shutil, "get_terminal_size", lambda fallback: __import__("os").terminal_size(
        (30, 24)))
    out = Terminal()
    Progress(10, "submissions", out, enabled=True)
    line = out.getvalue().strip("\r").replace(ERASE, "")
    assert len(line) == 29 and line.startswith("0/10 submissions"), repr(line)


@pytest.mark.parametrize("stream_tty, stdout_tty, expected", [(True, True, True), (True, False, False),
                                                              (False, True, False)])
def test_only_a_terminal_on_both_streams_draws(stream_tty, stdout_tty, expected, monkeypatch):
    class Stream(io.StringIO):
        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setattr(progress_mod.sys, "stdout", Stream(stdout_tty))
    assert on_a_terminal(Stream(stream_tty)) is expected


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (41.4, "0:41"), (725, "12:05"), (3723, "1:02:03")])
def test_durations_read_as_a_clock_does(seconds, text):
    assert duration(seconds) == text


def test_nothing_is_drawn_while_there_is_nothing_to_count():
    out = Terminal()
    bar = Progress(0, "mutants", out, enabled=True)  # mutate, before its first puzzle's mutants are made
    bar.advance()
    bar.close()
    assert out.getvalue() == ""
