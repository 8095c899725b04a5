"""A griffe extension (mkdocs.yml loads it) that makes comlrl's free-form, Sphinx-flavoured docstrings read as Markdown.

The docstrings are written for ``help()`` and Sphinx-like readers; mkdocstrings renders them as Markdown
(``docstring_style: null``). Four things differ, and this rewrites them before rendering, the source untouched:

* roles: ``:func:`x``` / ``:mod:`.x``` / ``:class:`x``` ... become the code span ``x`` (the role prefix dropped);
* literal blocks: a paragraph ending in ``::`` ends in ``:``, and its indented block becomes a fenced code block;
* simple tables (rows between ``=====  ====`` rules) become fenced text blocks, so their columns stay aligned
  (``x`` in a cell loses its backticks);
* ``a[i][j]`` outside code reads as a Markdown reference link to mkdocs-autorefs (an unresolved cross-reference, a
  warning under ``--strict``): its ``][`` is escaped.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|mod|class|meth|attr|data|obj|exc|const|ref):(`[^`]+`)")
TABLE_RULE = re.compile(r"^\s*=+(?: +=+)+\s*$")
DOUBLE_TICKS = re.compile(r"``([^`]+)``")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")


def escape_brackets(line: str) -> str:
    """``][`` -> ``]\\[`` outside code spans."""
    out, last = [], 0
    for match in CODE_SPAN.finditer(line):
        out.append(line[last : match.start()].replace("][", "]\\["))
        out.append(match.group(0))
        last = match.end()
    out.append(line[last:].replace("][", "]\\["))
    return "".join(out)


def table_row(row: str, starts: list[int]) -> str:
    """A simple table's row with ``x`` in its cells as x, each cell padded back to its column's width."""
    if TABLE_RULE.match(row):
        return row
    bounds = [*starts[1:], None]
    cells = [DOUBLE_TICKS.sub(r"\1", row[a:b]) for a, b in zip(starts, bounds)]
    return "".join(c.rstrip().ljust(b - a) if b else c for c, a, b in zip(cells, starts, bounds)).rstrip()


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def to_markdown(text: str) -> str:
    """The docstring ``text`` with roles, literal blocks, simple tables and ``][`` rewritten as described above."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):  # already a fenced block (Markdown in the source): copied as is
            end = i + 1
            while end < len(lines) and not lines[end].lstrip().startswith("```"):
                end += 1
            out += lines[i : end + 1]
            i = end + 1
            continue
        if TABLE_RULE.match(line):  # a simple table: three rules (top, under the header, bottom)
            end, rules = i, 0
            while end < len(lines) and rules < 3:
                rules += bool(TABLE_RULE.match(lines[end]))
                end += 1
            starts = [m.start() for m in re.finditer(r"=+", line)]
            out += ["```text", *(table_row(row, starts) for row in lines[i:end]), "```"]
            i = end
            continue
        if line.rstrip().endswith("::"):  # a literal block follows
            head = line.rstrip()[:-2].rstrip()
            if head:
                out.append(escape_brackets(ROLE.sub(r"\1", head)) + ":")
            base, j = indent_of(line), i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            block = []
            while j < len(lines) and (not lines[j].strip() or indent_of(lines[j]) > base):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            if block:
                cut = min(indent_of(b) for b in block if b.strip())
                out += ["", "```text", *(b[cut:] for b in block), "```", ""]
                i = j
                continue
            i += 1
            continue
        out.append(escape_brackets(ROLE.sub(r"\1", line)))
        i += 1
    return "\n".join(out)


class SphinxToMarkdown(griffe.Extension):
    """Rewrites every docstring griffe loads (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
