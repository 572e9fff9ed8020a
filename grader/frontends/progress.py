"""A progress line for a person watching a long run at a terminal: batch over a class, mutate over its mutants
and predict over its simulated runs.

    with Progress(total=40, unit="submissions", stream=sys.stderr) as bar:
        ...
        bar.write("[3/40] alice: 19 passed")     # a line of the log, printed above the progress line
        bar.advance()                            # one more done: the line is drawn again
        bar.write("[4/40] bob: 3 passed", advance=1)   # both at once
        bar.restart(45, "mutants", label="p6")   # a new phase: a count of its own, its own estimate

On a terminal the last line of the screen reads

    p6  12/45 mutants  [#########.......................]  27%  0:41 so far, about 1:52 left

and is redrawn in place (a carriage return, then the line, then an erase to its end), never wider than the
terminal; `write` prints its line above it and draws it again; `close` (or the end of the `with`) erases it, so
that what stays on the screen is the log and the report. The estimate is the time so far per unit done, times
the units left: none before the first unit is done.

Nothing is drawn unless both the stream and stdout are terminals: a log, a pipe or `--json` get what they got
before, the `write` lines alone. `enabled=` decides it for a test; `clock=` gives the seconds (time.monotonic).
The standard library is enough for this (tqdm would be a dependency of every learner's install for one line).
"""

from __future__ import annotations

import shutil
import sys
import time

ERASE = "\x1b[K"  # erase to the end of the line (every terminal pip and Jupyter's terminal know it)


def on_a_terminal(stream) -> bool:
    """Whether a person is likely watching: both `stream` and stdout are terminals."""
    return all(getattr(s, "isatty", lambda: False)() for s in (stream, sys.stdout))


def duration(seconds: float) -> str:
    """0:41, 12:05, 1:02:03."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    def __init__(self, total: int, unit: str, stream=None, *, label: str = "", enabled: bool | None = None,
                 clock=time.monotonic, bar_width: int = 32):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = on_a_terminal(self.stream) if enabled is None else enabled
        self.clock, self.bar_width = clock, bar_width
        self.unit, self.label, self.drawn = unit, label, False
        self.restart(total)

    def restart(self, total: int, unit: str | None = None, *, label: str | None = None) -> None:
        """A new phase: `total` units (of `unit`, and under `label`, when given), none done, its clock started now."""
        self.total, self.done, self.started = max(0, total), 0, self.clock()
        self.unit = self.unit if unit is None else unit
        self.label = self.label if label is None else label
        self._draw()

    def advance(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        self._draw()

    def write(self, line: str, advance: int = 0) -> None:
        """A line of the log, above the progress line (printed as it is when nothing is drawn); `advance` units
        done with it (a submission graded and its line, in one redraw)."""
        self._erase()
        print(line, file=self.stream, flush=True)
        self.done = min(self.total, self.done + advance)
        self._draw()

    def line(self) -> str:
        """The progress line as it stands (what is drawn)."""
        elapsed = self.clock() - self.started
        share = self.done / self.total if self.total else 1.0
        filled = int(share * self.bar_width)
        left = (f", about {duration(elapsed / self.done * (self.total - self.done))} left"
                if 0 < self.done < self.total else "")
        head = f"{self.label}  " if self.label else ""
        return (f"{head}{self.done}/{self.total} {self.unit}  [{'#' * filled}{'.' * (self.bar_width - filled)}]  "
                f"{share:.0%}  {duration(elapsed)} so far{left}")

    def close(self) -> None:
        self._erase()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _draw(self) -> None:
        if not self.enabled or not self.total:  # nothing to count yet (mutate, before its first puzzle's mutants)
            return
        width = shutil.get_terminal_size((100, 24)).columns - 1  # the last column would wrap on some terminals
        self.stream.write("\r" + self.line()[:width] + ERASE)
        self.stream.flush()
        self.drawn = True

    def _erase(self) -> None:
        if self.enabled and self.drawn:
            self.stream.write("\r" + ERASE)
            self.stream.flush()
            self.drawn = False
