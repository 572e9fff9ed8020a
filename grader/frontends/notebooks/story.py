"""A puzzle's story (its file's docstring, plain text written to read well in an editor) as notebook markdown.

The docstrings use three shapes, and each becomes what markdown has for it:
    paragraphs at the left margin          paragraphs (markdown reflows them: *emphasis* and `code` render)
    "  - item" / "  1. item" with its      list items; continuation lines aligned under the item's text join it
    continuation lines
    anything indented further than the     a fenced code block, dedented: ASCII diagrams, schedules and aligned
    text it belongs to                     formulas keep their columns and scroll instead of reflowing; a block
                                           that opens with ">>> " is code to type (a doctest example, which
                                           tests/test_story_code.py runs), fenced as Python
A fenced block inside a list item is indented to the item's content, so it stays part of the item.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

_ITEM = re.compile(r"^( *)(-|\d+\.) (.*)$")
_LEAD = re.compile(r"^(Checks|Hints)\b")  # the sections every story has: bold, so that they stand out


@dataclass
class Block:
    kind: str  # "p" (paragraph), "li" (list item), "pre" (preformatted)
    indent: int  # the markdown indentation of the block (its enclosing list items' content column)
    lines: list[str] = field(default_factory=list)
    marker: str = ""  # for "li": "-" or "1."


@dataclass
class _Item:
    source_indent: int  # where the marker stands in the docstring
    text_col: int  # where the item's text starts in the docstring (continuation lines start here)
    content: int  # the markdown column of the item's content


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def story_blocks(body: str) -> list[Block]:
    blocks: list[Block] = []
    items: list[_Item] = []  # the list items the current line may belong to, outermost first
    previous = "blank"  # the previous line: blank, item, text, pre, or pre-gap (a blank line inside a diagram)
    for line in body.splitlines():
        if not line.strip():
            previous = "pre-gap" if previous == "pre" else "blank"
            continue
        n, text = _indent(line), line.strip()
        item = _ITEM.match(line)
        after_blank = previous in ("blank", "pre-gap")
        if item and n < 8:
            while items and items[-1].source_indent >= n:
                items.pop()
            marker, outer = item.group(2), items[-1].content if items else 0
            blocks.append(Block("li", outer, [item.group(3)], marker))
            items.append(_Item(n, n + len(marker) + 1, outer + len(marker) + 1))
            previous = "item"
        elif items and n == items[-1].text_col:
            if previous in ("item", "text") and not after_blank:
                blocks[-1].lines.append(text)  # the next line of the item (or of its paragraph)
            else:
                blocks.append(Block("p", items[-1].content, [text]))  # a paragraph of the item, after a diagram
            previous = "text"
        elif n >= 4:  # preformatted: a diagram, a schedule, aligned formulas
            if previous == "pre" or (previous == "pre-gap" and blocks[-1].kind == "pre"):
                blocks[-1].lines += [""] * (previous == "pre-gap") + [line]
            else:
                while items and (n <= items[-1].text_col or after_blank and items[-1].source_indent >= n):
                    items.pop()
                blocks.append(Block("pre", items[-1].content if items else 0, [line]))
            previous = "pre"
        else:  # a paragraph at (or near) the margin
            if previous == "text" and not items and blocks[-1].kind == "p":
                blocks[-1].lines.append(text)
            else:
                items.clear()
                blocks.append(Block("p", 0, [_LEAD.sub(r"**\1**", text)]))
            previous = "text"
    return blocks


def render(blocks: list[Block]) -> str:
    out: list[str] = []
    for i, block in enumerate(blocks):
        pad = " " * block.indent
        follows_item = i > 0 and blocks[i - 1].kind == "li"
        if out and not (follows_item and (block.kind == "li" or block.indent > 0)):
            out.append("")  # a blank line between blocks, except inside a list (items, and what hangs from one)
        if block.kind == "li":
            hang = "\n" + pad + " " * (len(block.marker) + 1)
            out.append(f"{pad}{block.marker} " + hang.join(block.lines))
        elif block.kind == "p":
            out.append("\n".join(pad + line for line in block.lines))
        else:
            cut = min(_indent(line) for line in block.lines if line.strip())
            fence = "```python" if block.lines[0].lstrip().startswith(">>> ") else "```text"  # an example to type
            out += [pad + fence, *[(pad + line[cut:]) if line.strip() else "" for line in block.lines],
                    pad + "```"]
    return "\n".join(out)


def story_markdown(source: str) -> str:
    """A puzzle file's docstring as markdown: its first line a heading, the rest paragraphs, lists and diagrams."""
    doc = ast.get_docstring(ast.parse(source), clean=True) or ""
    title, _, body = doc.partition("\n")
    return f"## {title.strip().rstrip('.')}\n\n{render(story_blocks(body.strip()))}"
