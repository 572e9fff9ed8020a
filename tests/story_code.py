"""The code a puzzle's story invites a learner to type, found and run (tests/test_story_code.py holds it to run).

Issue 30: p13's hint said "`chunks = t.view(-1).chunk(N)`: N views of t ...; adding into chunks[j] (+=) changes
t", and `chunk` returns a tuple: the learner who followed it met a TypeError. Two kinds of code are run:

    a `>>>` example      indented under its text, doctest's form (the lines after it are its output): code to
                         type, with what it shows; run as written, in the puzzle file's own names, output compared.
                         The notebook shows it as Python (notebooks/story.py).
    a backticked span    `code` in a story (the puzzle file's docstrings), a function's docstring, or a hint of
                         the puzzle's spec: run in the puzzle's context, the names its story gives them
                         (tests/test_story_code.py, CONTEXTS), on every rank of a simulated world.

A span is not code to type, and is not run, when it is
    words              not Python: a signature (`f(x) -> y`), a fragment (`.clone()`, `dst=`), a sum in words
    a name             a name or an attribute (`dist`, `w.grad`, `torch.optim.Adam`)
    a method named     a bare name called with no arguments (`step()`, `backward()`): the method, not a call
    a template         it holds `...` (`dtype=...`)
    a keyword          `name=value`, no spaces (`async_op=True`)
    a raise            `raise NotImplementedError`: the stub's line, named
    a signature        a call of one of the puzzle's entries (`gpipe_step(dist, layers, ...)`): how the grader
                       calls what the learner writes, which the grader's own tests run
Everything else is run. A span with a `return` runs as a function's body.
"""

from __future__ import annotations

import ast
import doctest
import re
import textwrap
from dataclasses import dataclass

SPAN = re.compile(r"`([^`]+)`")
EXAMPLE = re.compile(r"^\s*>>> ", re.M)


@dataclass(frozen=True)
class Span:
    code: str  # the span's text, its line breaks joined with a space
    where: str  # "the story", "ClassName's docstring", "the spec's hint 2"

    def __str__(self):
        return f"`{self.code}` ({self.where})"


def _without_examples(text: str) -> str:
    """The text without its `>>>` examples and their output (doctest's own parser finds where each ends)."""
    kept, skip_indent = [], None
    for line in text.splitlines():
        stripped, indent = line.lstrip(), len(line) - len(line.lstrip())
        if stripped.startswith((">>> ", "... ")) or stripped == ">>>":
            skip_indent = indent
            continue
        if skip_indent is not None and stripped and indent >= skip_indent:
            continue  # the example's output, up to a blank line
        skip_indent = None
        kept.append(line)
    return "\n".join(kept)


def spans_in(text: str, where: str) -> list[Span]:
    return [Span(re.sub(r"\s*\n\s*", " ", m.group(1)).strip(), where)
            for m in SPAN.finditer(_without_examples(text))]


def docstrings(source: str) -> list[tuple[str, str]]:
    """(where, text) of a puzzle file's docstrings: the story, then each function's and class's."""
    tree = ast.parse(source)
    out = [("the story", ast.get_docstring(tree, clean=True) or "")]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                out.append((f"{node.name}'s docstring", doc))
    return out


def kind(code: str, entries=()) -> str:
    """'run', or why the span is not code to type (the module's docstring lists the kinds)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        try:  # a `return` is a function's line: it parses as one
            tree = ast.parse("def _():\n" + textwrap.indent(code, "    ")).body[0]
        except SyntaxError:
            return "words"
    body = tree.body
    if len(body) == 1 and isinstance(body[0], ast.Expr):
        value = body[0].value
        if isinstance(value, (ast.Name, ast.Attribute)):
            return "a name"
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            if not value.args and not value.keywords:
                return "a method named"
            if value.func.id in entries:
                return "a signature"
    if len(body) == 1 and isinstance(body[0], ast.Raise):
        return "a raise"
    if any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(tree)):
        return "a template"
    if len(body) == 1 and isinstance(body[0], ast.Assign) and re.fullmatch(r"[\w.]+=\S+", code):
        return "a keyword"
    return "run"


def runnable(code: str) -> str:
    """The span as a program: a `return` runs as the body of a function, called at once."""
    try:
        compile(code, "<span>", "exec")  # ast.parse takes a `return` anywhere; compile does not
        return code
    except SyntaxError:
        return "def _span():\n" + textwrap.indent(code, "    ") + "\n_span()"


def run_spans(spans: list[Span], setup: str, namespace: dict, around: dict[str, str]) -> None:
    """Run `setup`, then each span in a copy of the names setup made (so that no span changes what the next one
    sees but through a tensor it writes in place), wrapped in its `around` template ("with torch.no_grad():\\n
    {code}") where the story says so. The first span that raises fails, naming itself."""
    base = dict(namespace)
    exec(compile(textwrap.dedent(setup), "<the story's context>", "exec"), base)
    for span in spans:
        program = runnable(span.code)
        if span.code in around:
            program = around[span.code].format(code=textwrap.indent(program, "    ").lstrip())
        try:
            exec(compile(program, f"<{span.code}>", "exec"), dict(base))
        except Exception as exc:
            raise AssertionError(f"{span} raised {type(exc).__name__}: {exc}") from exc


def examples(text: str) -> list[doctest.Example]:
    return doctest.DocTestParser().get_examples(text)


def run_examples(text: str, namespace: dict, name: str) -> tuple[int, str]:
    """(failures, doctest's report) for the `>>>` examples of `text`, run in a copy of `namespace`."""
    test = doctest.DocTestParser().get_doctest(text, dict(namespace), name, None, 0)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=report.append, clear_globs=False)
    return runner.failures, "".join(report)
