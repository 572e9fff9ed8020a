"""The nbgrader convention: a solution region between `# BEGIN SOLUTION` and `# END SOLUTION` lines becomes one
`raise NotImplementedError(...)` line in the learner's stub. Each stub records a digest of its own body, so that
a stub the learner has edited can be told from one generated from an older solution.

A puzzle that hands the learner a broken program to fix (Part IV) follows its solution region at once with the
program as handed out, each of its lines commented ("# " before the code), between a `# BEGIN HANDED OUT: <what
is wrong with it>` line and a `# END HANDED OUT` line (solutions/p20_hang.py shows one). The stub then holds the
broken program itself, uncommented, behind one line that keeps it from running until the learner deletes it (a
stub as generated is "not attempted", as every other puzzle's is):

    raise NotImplementedError("p20: this step hangs: delete this line to run it as handed out, then fix it")
    <the broken program>
"""

from __future__ import annotations

import hashlib
import re

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
HANDED_OUT, END_HANDED_OUT = "# BEGIN HANDED OUT", "# END HANDED OUT"
HEADER = ("# Generated from solutions/{name} by `python -m grader build`: fill in the code marked "
          "NotImplementedError, then run `python -m grader`. (stub digest {digest})\n")
_DIGEST = re.compile(r"\(stub digest ([0-9a-f]{12})\)")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)")


class BuildError(Exception):
    pass


def stub_body(source: str, name: str) -> str:
    """The solution with every solution region replaced by a NotImplementedError naming what to write
    ("p4: write CopyToTensorParallel.backward"), or, where a handed-out region follows it, by the program handed
    out behind a NotImplementedError that says what is wrong with it."""
    out, inside, current = [], None, None  # inside: None, "solution" or "handed out"
    scopes: list[tuple[int, str]] = []  # (indent, name) of the enclosing defs and classes
    puzzle = name.split("_", 1)[0]
    replaced = None  # (index in out, indent, what) of the last solution region's NotImplementedError line
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        mark = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if inside is None:
            m = _DEF.match(line)
            if m:
                scopes = [(i, n) for i, n in scopes if i < len(indent)] + [(len(indent), m.group(1))]
                current = ".".join(n for _, n in scopes)
        if mark == BEGIN:
            if inside is not None:
                raise BuildError(f"{name}:{number}: {BEGIN} inside another region")
            inside = "solution"
            replaced = (len(out), indent, current)
            out.append(f'{indent}raise NotImplementedError("{puzzle}: write {current}")\n')
        elif mark == END:
            if inside != "solution":
                raise BuildError(f"{name}:{number}: {END} without {BEGIN}")
            inside = None
        elif mark.startswith(HANDED_OUT):
            if inside is not None or replaced is None or replaced[0] != len(out) - 1:
                raise BuildError(f"{name}:{number}: {HANDED_OUT} must follow a solution region at once")
            what = mark[len(HANDED_OUT):].lstrip(": ").strip() or "this is the program as handed out"
            inside = "handed out"
            out[-1] = (f'{replaced[1]}raise NotImplementedError("{puzzle}: {what}: delete this line to run it as '
                       f'handed out, then fix it")\n')
        elif mark == END_HANDED_OUT:
            if inside != "handed out":
                raise BuildError(f"{name}:{number}: {END_HANDED_OUT} without {HANDED_OUT}")
            inside = None
        elif inside == "handed out":
            out.append(_uncommented(line, replaced[1], name, number))
        elif inside is None:
            out.append(line)
    if inside is not None:
        raise BuildError(f"{name}: a {'solution' if inside == 'solution' else 'handed-out'} region is never closed")
    return "".join(out)


def _uncommented(line: str, indent: str, name: str, number: int) -> str:
    """A line of a handed-out region, "<indent># code", as the stub's "<indent>code" (a bare "#" is a blank line)."""
    body = line.rstrip("\n")
    if body.strip() == "#":
        return "\n"
    if not body.startswith(indent + "# "):
        raise BuildError(f"{name}:{number}: a handed-out line is the program's line behind '{indent}# ', got {body!r}")
    return indent + body[len(indent) + 2:] + "\n"


def digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def stub(source: str, name: str) -> str:
    body = stub_body(source, name)
    return HEADER.format(name=name, digest=digest(body)) + body


def learner_edited(text: str) -> bool:
    """True when a generated stub no longer matches the digest it was written with."""
    first, _, body = text.partition("\n")
    m = _DIGEST.search(first)
    return m is None or digest(body) != m.group(1)
