"""Where the project's own tests spend their time: per file, from a run of the suite (or from its JUnit XML).

    python bench/bench_suite.py                        # runs `pytest tests` with --junitxml, then prints the table
    python bench/bench_suite.py -- tests -m slow       # the slow step instead (anything after -- goes to pytest)
    python bench/bench_suite.py --read run.xml         # the table of a run made before
    python bench/bench_suite.py --keep run.xml         # keep the run's JUnit XML (each test's time)

The table gives, per test file, the seconds its tests took (setup, call and teardown, summed over the tests: with
pytest-xdist the workers run in parallel, so the sum is more than the wall time), how many tests ran, and its
share of the sum. The wall time of the run and the machine's load before and after it are printed under the
table, with the CPU time of every process of the run (less at the mercy of other work than wall time), since a shared
machine's figures mean little without them. docs/development.md records the tables.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def per_file(xml_path: Path) -> dict[str, tuple[float, int]]:
    """{test file: (seconds, tests)} from pytest's JUnit XML."""
    seconds, count = defaultdict(float), defaultdict(int)
    for case in ET.parse(xml_path).iter("testcase"):
        module = case.get("classname", "").split(".")
        name = module[1] if module[0] == "tests" and len(module) > 1 else module[0]
        seconds[name] += float(case.get("time") or 0)
        count[name] += 1
    return {name: (seconds[name], count[name]) for name in seconds}


def slowest(xml_path: Path, n: int) -> str:
    """The n slowest tests, as `seconds  file::test`."""
    cases = [(float(c.get("time") or 0), f"{c.get('classname', '').split('.')[-1]}::{c.get('name')}")
             for c in ET.parse(xml_path).iter("testcase")]
    return "\n".join(f"{s:8.1f} s  {name}" for s, name in sorted(cases, reverse=True)[:n])


def table(rows: dict[str, tuple[float, int]], top: int = 0) -> str:
    total = sum(s for s, _ in rows.values()) or 1.0
    ordered = sorted(rows.items(), key=lambda kv: -kv[1][0])
    lines = ["| file | seconds | tests | share |", "| --- | ---: | ---: | ---: |"]
    shown = ordered[:top] if top else ordered
    for name, (s, n) in shown:
        lines.append(f"| {name} | {s:,.1f} | {n:,} | {100 * s / total:.1f}% |")
    if top and len(ordered) > top:
        rest = ordered[top:]
        lines.append(f"| {len(rest)} other files | {sum(s for _, (s, _) in rest):,.1f} | "
                     f"{sum(n for _, (_, n) in rest):,} | {100 * sum(s for _, (s, _) in rest) / total:.1f}% |")
    lines.append(f"| **all** | **{total:,.1f}** | **{sum(n for _, n in rows.values()):,}** | 100% |")
    return "\n".join(lines)


def _children_cpu() -> float:
    """CPU seconds of the finished children (and theirs): less at the mercy of a shared machine than wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--read", metavar="XML", help="a JUnit XML file from an earlier run (no new run)")
    parser.add_argument("--top", type=int, default=0, help="the N slowest files, the rest summed in one row")
    parser.add_argument("--keep", metavar="XML", help="keep the run's JUnit XML here (its per-test times)")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest (default: tests)")
    parser.add_argument("--tests", type=int, default=0, metavar="N", help="with --read: also the N slowest tests")
    args = parser.parse_args(argv)
    if args.read:
        print(table(per_file(Path(args.read)), args.top))
        if args.tests:
            print("\n" + slowest(Path(args.read), args.tests))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(args.keep).resolve() if args.keep else Path(tmp) / "run.xml"
        command = [sys.executable, "-m", "pytest", *(args.pytest_args or ["tests"]), "-q", "-p", "no:cacheprovider",
                   f"--junitxml={xml}"]
        load = os.getloadavg()[0]
        started, cpu_before = time.perf_counter(), _children_cpu()
        status = subprocess.run(command, cwd=ROOT).returncode
        wall, cpu = time.perf_counter() - started, _children_cpu() - cpu_before
        print(table(per_file(xml), args.top))
    print(f"\n`{' '.join(['pytest', *command[3:-1]])}`: exit status {status}, {wall / 60:.1f} min wall, "
          f"{cpu / 60:.1f} min of CPU (user + system, every process of the run); load average {load:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after ({os.cpu_count()} cores)")
    return status


if __name__ == "__main__":
    sys.exit(main())
