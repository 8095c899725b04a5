"""Turning what small models really write into Python source, with ``ast`` and never ``exec``.

Model answers to "write a function" arrive as markdown fences with prose around them, the prompt's
signature echoed before the real definition, example calls and ``if __name__ == "__main__":`` blocks,
a body whose first line lost its indentation, or a bare function body. :func:`clean_code` keeps the
definitions (imports, functions, classes, constants) and drops the rest:

1. :func:`strip_fences` keeps the contents of markdown code blocks (an unclosed block runs to the end;
   a closing fence with no opening one means the answer started inside a block).
2. The text is split into top-level chunks (a chunk starts at each line with no indentation). A chunk
   that parses is kept when it is a definition and dropped when it is an expression, a test, a loop or
   a ``__main__`` block. A chunk that does not parse is merged with the next ones when that makes it
   parse (continuation lines at column 0), else kept verbatim when it starts with ``def``/``class``
   (a broken definition still counts as written, and then fails the syntax level), else dropped as prose.
3. A function defined twice keeps its last non-stub definition (a stub is a signature with only a
   docstring or ``pass``: the prompt echoed back).
4. When a signature is given and no ``def`` line is present, the answer is read as a function body:
   the first line's lost indentation is restored and the body is wrapped in the signature.

Everything is pure: text in, :class:`CleanCode` out.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from dataclasses import dataclass, field

from ...pyast import parse_quiet

_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+#.-]*)")
_NON_PYTHON_FENCES = {"bash", "sh", "shell", "console", "text", "txt", "output", "json", "plaintext", "none", "diff"}
_DEF_LINE = re.compile(r"^(async\s+def|def)\s+([A-Za-z_]\w*)\s*\(")
_CLASS_LINE = re.compile(r"^class\s+([A-Za-z_]\w*)\s*[(:]")
_IMPORT_LINE = re.compile(r"^(import\s+[\w.]+|from\s+[\w.]+\s+import\s+)")
_CONTINUATION = re.compile(r"^(\)|\]|\}|else\b|elif\b|except\b|finally\b)")
_STATEMENT_START = re.compile(
    r"^(@|(async\s+)?def\s|class\s|if\s|for\s|while\s|with\s|try:|import\s|from\s|[A-Za-z_][\w.]*\s*[=(\[])"
)
_KEEP_NODES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass(kw_only=True)
class FunctionInfo:
    """One top-level function of a cleaned answer."""

    name: str
    source: str
    parsed: bool  # the definition parses on its own
    returns: bool  # has ``return <value>`` or ``yield`` (outside nested functions)
    stub: bool  # body is only a docstring / ``pass`` / ``...``
    node: ast.FunctionDef | ast.AsyncFunctionDef | None = None


@dataclass(kw_only=True)
class CleanCode:
    """The definitions kept from one answer, in their original order."""

    chunks: list[str] = field(default_factory=list)
    functions: dict[str, FunctionInfo] = field(default_factory=dict)
    fenced: bool = False  # markdown fences were removed
    dropped: int = 0  # top-level chunks dropped (prose, example calls, __main__ blocks, tests)
    duplicates: int = 0  # extra definitions of an already defined function that were removed
    wrapped_body: bool = False  # a bare body was wrapped into the given signature
    removed: list[str] = field(default_factory=list)  # names removed by :meth:`without`

    @property
    def code(self) -> str:
        """The cleaned source ('' when nothing was kept)."""
        return "\n\n".join(c.strip("\n") for c in self.chunks if c.strip()).strip("\n")

    def without(self, names: set[str] | frozenset[str]) -> "CleanCode":
        """A copy with the top-level functions named in ``names`` removed (e.g. a redefined ``aux``)."""
        chunks, removed = [], []
        for chunk in self.chunks:
            name = _chunk_def_name(chunk)
            if name is not None and name in names:
                removed.append(name)
            else:
                chunks.append(chunk)
        functions = {k: v for k, v in self.functions.items() if k not in names}
        return CleanCode(
            chunks=chunks,
            functions=functions,
            fenced=self.fenced,
            dropped=self.dropped,
            duplicates=self.duplicates,
            wrapped_body=self.wrapped_body,
            removed=removed,
        )


def normalize_text(text: str | None) -> str:
    """Unify newlines and drop characters that only confuse the parser (BOM, NBSP, zero-width)."""
    if not text:
        return ""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    return text.replace("\u00a0", " ").replace("\u200b", "")


def strip_fences(text: str) -> tuple[str, bool]:
    """Contents of the markdown code blocks in ``text`` (joined), or ``text`` itself when it has none.

    Returns ``(code, fenced)``. Blocks tagged as a non-Python language (bash, text, json, ...) are skipped.
    """
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if _FENCE.match(line)]
    if not fences:
        return text, False
    # A closing fence before any opening one: the answer started inside a block (prompt ended in ```python).
    before = lines[: fences[0]]
    inside = len(fences) % 2 == 1 and any(_DEF_LINE.match(b) or _IMPORT_LINE.match(b) for b in before)
    blocks: list[list[str]] = [before] if inside else []
    in_block, keep, current = False, True, []
    for i, line in enumerate(lines):
        if i < fences[0] or (inside and i == fences[0]):
            continue
        match = _FENCE.match(line)
        if match and not in_block:
            in_block, current = True, []
            keep = match.group(2).lower() not in _NON_PYTHON_FENCES
        elif match and in_block:
            in_block = False
            if keep:
                blocks.append(current)
        elif in_block:
            current.append(line)
    if in_block and keep:  # unclosed block: truncated generation
        blocks.append(current)
    return "\n\n".join("\n".join(b) for b in blocks), True


def split_chunks(text: str) -> list[str]:
    """Split source text into top-level chunks: each starts at a non-blank line with no indentation.

    Decorators stay with the definition below them; ``else``/``except``/closing brackets at column 0
    stay with the chunk above.
    """
    chunks: list[list[str]] = []
    for line in text.split("\n"):
        starts = line.strip() != "" and not line[0].isspace() and not _CONTINUATION.match(line)
        prev_is_decorator = bool(chunks) and all(ln.startswith("@") or not ln.strip() for ln in chunks[-1])
        if starts and not (prev_is_decorator and chunks[-1]):
            chunks.append([line])
        elif chunks:
            chunks[-1].append(line)
        elif line.strip():
            chunks.append([line])  # indented text before any top-level line
    return ["\n".join(c).rstrip() for c in chunks if any(ln.strip() for ln in c)]


def compiles(source: str) -> str | None:
    """None when ``source`` compiles as a module, else the error message (with its line).

    Uses ``compile`` (which also catches ``return`` outside a function); nothing is executed.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<team program>", "exec", dont_inherit=True)
        return None
    except SyntaxError as exc:
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _chunk_def_name(chunk: str) -> str | None:
    for line in chunk.split("\n"):
        if line.startswith("@") or not line.strip():
            continue
        match = _DEF_LINE.match(line)
        return match.group(2) if match else None
    return None


def _looks_like_code(chunk: str) -> bool:
    first = next((ln for ln in chunk.split("\n") if ln.strip()), "")
    return bool(_DEF_LINE.match(first) or _CLASS_LINE.match(first) or first.startswith("@"))


def _keep_statement(node: ast.stmt, local_functions: set[str]) -> bool:
    """Definitions stay; example calls, prints, tests, loops and ``__main__`` blocks go."""
    if isinstance(node, _KEEP_NODES):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        # Constants such as ``R = 3`` or ``PATTERN = re.compile(...)`` stay; ``result = f(5)`` (a demo) goes.
        calls = [s.func.id for s in ast.walk(node.value) if isinstance(s, ast.Call) and isinstance(s.func, ast.Name)]
        return not any(name in local_functions or name in ("print", "input") for name in calls)
    if isinstance(node, ast.Try):  # ``try: import x`` / ``except ImportError: ...``
        return all(isinstance(s, (ast.Import, ast.ImportFrom, ast.Pass, ast.Assign)) for s in node.body)
    return False


def _merge_broken(chunks: list[str], start: int, limit: int = 4) -> int:
    """How many chunks after ``start`` to merge so that the merge parses (0: none works)."""
    for extra in range(1, min(limit, len(chunks) - start - 1) + 1):
        if parse_quiet("\n".join(chunks[start : start + extra + 1])) is not None:
            return extra
    return 0


def _explode(source: str, module: ast.Module) -> list[tuple[str, ast.Module]]:
    """One ``(source, module)`` per top-level statement of a parsed chunk."""
    lines = source.split("\n")
    out = []
    for node in module.body:
        first = node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
        out.append(("\n".join(lines[first - 1 : node.end_lineno]), ast.Module(body=[node], type_ignores=[])))
    return out


def _collect_chunks(text: str) -> tuple[list[tuple[str, ast.Module | None]], int]:
    """Top-level statements as ``(source, one-statement module or None if broken)``, and how many
    chunks of prose were dropped."""
    tree = parse_quiet(text)
    if tree is not None:  # fast path: the whole answer parses
        return _explode(text, tree), 0
    raw = split_chunks(text)
    out: list[tuple[str, ast.Module | None]] = []
    dropped, i = 0, 0
    while i < len(raw):
        module = parse_quiet(raw[i])
        # Only a chunk that starts like code can be completed by the chunks after it (prose cannot).
        extra = 0 if module is not None or not _STATEMENT_START.match(raw[i]) else _merge_broken(raw, i)
        if module is not None or extra > 0:
            source = "\n".join(raw[i : i + extra + 1])
            out.extend(_explode(source, module or parse_quiet(source)))
        elif _looks_like_code(raw[i]):
            out.append((raw[i], None))
        else:
            dropped += 1
        i += extra + 1
    return out, dropped


def _is_none(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is None


def function_returns(node: ast.AST) -> bool:
    """True when the function has ``return <value>`` or ``yield`` outside nested functions/classes."""
    stack = list(getattr(node, "body", []))
    while stack:
        sub = stack.pop()
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(sub, ast.Return) and sub.value is not None and not _is_none(sub.value):
            return True
        if isinstance(sub, (ast.Yield, ast.YieldFrom)):
            return True
        stack.extend(ast.iter_child_nodes(sub))
    return False


def is_stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """True when the body is only a docstring, ``pass``, ``...`` or ``raise NotImplementedError``."""
    for stmt in node.body:
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # docstring or ``...``
        if isinstance(stmt, ast.Raise) and stmt.exc is not None and "NotImplementedError" in ast.unparse(stmt.exc):
            continue
        return False
    return True


def _function_info(source: str, module: ast.Module | None) -> FunctionInfo | None:
    if module is not None:
        node = module.body[0]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return FunctionInfo(
                name=node.name,
                source=source,
                parsed=True,
                returns=function_returns(node),
                stub=is_stub(node),
                node=node,
            )
        return None
    name = _chunk_def_name(source)
    if name is None:
        return None
    body = source.split("\n", 1)[1] if "\n" in source else ""
    returns = re.search(r"\b(return\s+\S|yield\b)", body) is not None
    return FunctionInfo(name=name, source=source, parsed=False, returns=returns, stub=not body.strip())


def _rank(info: FunctionInfo) -> int:
    """Which of several definitions of one name to keep: a parsed full body beats a stub beats a broken one."""
    return 2 if info.parsed and not info.stub else 1 if info.parsed else 0


def _dedupe(entries: list[tuple[str, ast.Module | None, FunctionInfo | None]]) -> tuple[list, int]:
    """Keep one definition per function name: the last of the best rank."""
    best: dict[str, int] = {}
    for idx, (_, _, info) in enumerate(entries):
        if info is not None:
            prev = best.get(info.name)
            if prev is None or _rank(info) >= _rank(entries[prev][2]):
                best[info.name] = idx
    kept = [e for idx, e in enumerate(entries) if e[2] is None or best[e[2].name] == idx]
    return kept, len(entries) - len(kept)


def fix_first_line_indent(body: str) -> list[str]:
    """Candidate bodies where the first line gets back the indentation it lost.

    ``"x = 1\\n    return x"`` becomes ``"    x = 1\\n    return x"``. One candidate per indentation
    level used by the following lines (the first that parses is the right one).
    """
    lines = body.split("\n")
    idx = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if idx is None or lines[idx][0].isspace():
        return [body]
    levels = sorted({len(ln) - len(ln.lstrip()) for ln in lines[idx + 1 :] if ln.strip() and ln[0].isspace()})
    out = []
    for level in levels:
        fixed = list(lines)
        fixed[idx] = " " * level + lines[idx]
        out.append("\n".join(fixed))
    return out or [body]


def wrap_body(text: str, signature: str) -> str | None:
    """``signature`` + the answer read as a function body, when that parses and returns a value."""
    lines = text.split("\n")
    for start in range(min(4, len(lines))):  # allow a few lines of prose before the body
        rest = "\n".join(lines[start:]).strip("\n")
        if not rest.strip():
            break
        for candidate in fix_first_line_indent(rest):
            body = textwrap.indent(textwrap.dedent(candidate), "    ")
            source = signature.rstrip() + "\n" + body
            tree = parse_quiet(source)
            if tree is not None and tree.body and function_returns(tree.body[0]):
                return source
    return None


def clean_code(text: str | None, *, signature: str | None = None) -> CleanCode:
    """Keep the definitions of one model answer; see the module docstring for the rules.

    ``signature`` (e.g. ``"def add(a, b):"``): when the answer has no ``def`` line at all it is read as
    the body of that function.
    """
    text, fenced = strip_fences(normalize_text(text))
    if signature and not re.search(r"^\s*(async\s+)?def\s", text, re.M):
        wrapped = wrap_body(text, signature)
        if wrapped is not None:
            result = clean_code(wrapped)
            result.fenced, result.wrapped_body = fenced, True
            return result
    collected, dropped = _collect_chunks(text)
    local = {n for src, _ in collected if (n := _chunk_def_name(src))}
    entries = []
    for source, module in collected:
        if module is not None and not _keep_statement(module.body[0], local):
            dropped += 1
            continue
        entries.append((source, module, _function_info(source, module)))
    entries, duplicates = _dedupe(entries)
    functions = {info.name: info for _, _, info in entries if info is not None}
    return CleanCode(
        chunks=[src for src, _, _ in entries],
        functions=functions,
        fenced=fenced,
        dropped=dropped,
        duplicates=duplicates,
    )


# --- what the entry point does with the helpers -----------------------------------------------------------


def helper_references(node: ast.AST, helpers: set[str]) -> set[str]:
    """Names in ``helpers`` that the function reads (calls, or passes as a value such as ``map(aux, xs)``)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in helpers and isinstance(n.ctx, ast.Load)}


def ignored_helper_calls(node: ast.AST, helpers: set[str]) -> list[str]:
    """Statements that call a helper and throw its result away (``aux(x)`` on its own line)."""
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Expr):
            call = sub.value.value if isinstance(sub.value, ast.Await) else sub.value
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in helpers:
                out.append(ast.unparse(sub))
    return out


def _body_without_docstring(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return [s for s in body if not isinstance(s, ast.Pass)]


def _is_helper_call(expr: ast.AST | None, helpers: set[str]) -> bool:
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in helpers):
        return False
    args = list(expr.args) + [k.value for k in expr.keywords]
    simple = (ast.Name, ast.Constant, ast.Starred)
    return all(isinstance(a.value if isinstance(a, ast.Starred) else a, simple) for a in args)


def is_trivial_wrapper(node: ast.FunctionDef | ast.AsyncFunctionDef, helpers: set[str]) -> bool:
    """True when the function only returns a helper's result: ``return aux(a, b)`` or
    ``r = aux(a, b); return r`` (arguments passed through unchanged)."""
    body = _body_without_docstring(node)
    if len(body) == 1 and isinstance(body[0], ast.Return):
        return _is_helper_call(body[0].value, helpers)
    if len(body) == 2 and isinstance(body[0], ast.Assign) and isinstance(body[1], ast.Return):
        target, ret = body[0].targets, body[1].value
        return (
            len(target) == 1
            and isinstance(target[0], ast.Name)
            and isinstance(ret, ast.Name)
            and ret.id == target[0].id
            and _is_helper_call(body[0].value, helpers)
        )
    return False
