"""The nbgrader convention: a solution region between `# BEGIN SOLUTION` and `# END SOLUTION` lines becomes one
`raise NotImplementedError(...)` line in the learner's stub. Each stub records a digest of its own body, so that
a stub the learner has edited can be told from one generated from an older solution."""

from __future__ import annotations

import hashlib
import re

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
HEADER = ("# Generated from solutions/{name} by `python -m grader build`: fill in the code marked "
          "NotImplementedError, then run `python -m grader`. (stub digest {digest})\n")
_DIGEST = re.compile(r"\(stub digest ([0-9a-f]{12})\)")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)")


class BuildError(Exception):
    pass


def stub_body(source: str, name: str) -> str:
    """The solution with every solution region replaced by a NotImplementedError naming what to write
    ("p4: write CopyToTensorParallel.backward")."""
    out, inside, current = [], False, None
    scopes: list[tuple[int, str]] = []  # (indent, name) of the enclosing defs and classes
    puzzle = name.split("_", 1)[0]
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        mark = line.strip()
        if not inside:
            m = _DEF.match(line)
            if m:
                indent = len(line) - len(line.lstrip())
                scopes = [(i, n) for i, n in scopes if i < indent] + [(indent, m.group(1))]
                current = ".".join(n for _, n in scopes)
        if mark == BEGIN:
            if inside:
                raise BuildError(f"{name}:{number}: {BEGIN} inside another solution region")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f'{indent}raise NotImplementedError("{puzzle}: write {current}")\n')
        elif mark == END:
            if not inside:
                raise BuildError(f"{name}:{number}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise BuildError(f"{name}: {BEGIN} is never closed")
    return "".join(out)


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
