"""A griffe extension for the docs site: render vlmatch's plain-text docstrings as they read in the source.

vlmatch's docstrings are written for a terminal (``help()``, an editor): equations on indented lines
aligned in columns, one statement per line, RST-style ``double backticks`` and ``:func:`x``` roles. Read
as Markdown, the indented equations would flow into the paragraph before them and lose their line breaks.
This extension rewrites each docstring (the text only, at documentation time) so that

* a run of lines indented by 4 or more (and ``>>>`` sessions) becomes a fenced code block, alignment kept;
* a line broken on purpose (short, or before an item or a label) keeps its break (a Markdown hard
  break), so lists of readings stay one per line; paragraphs wrapped at the margin re-wrap;
* ``:func:`name``` and friends become code spans, and a ``<`` in prose is escaped (``<v, u>`` is no tag);
  a line that starts with ``+`` or ``>`` continues a sentence rather than starting a list or a quote.

Loaded by ``mkdocs.yml`` (``extensions: [docs/plaintext_docstrings.py]``); not part of the package.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|mod|class|meth|attr|data|obj|exc):`~?([^`]+)`")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
RST_LITERAL = re.compile(r"``([^`]+)``")
LABEL = re.compile(r"[A-Z][\w\s\-()./,']{0,40}:(\s|$)")  # "Text (eq. 1): ...", "Variants (Table 4): ..."
WRAP_AT = 72  # a line at least this long that runs on into the next is a paragraph wrapped at the margin


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _prose(line: str) -> str:
    """Escape ``<`` outside code spans; turn RST roles into code spans; a leading ``+`` or ``>`` continues
    a sentence (``+ λ · L``, ``>= 0``), so it must not start a list or a block quote."""
    line = ROLE.sub(r"``\1``", line)
    if line.lstrip().startswith("+ "):
        line = line.replace("+", "\\+", 1)
    if line.lstrip().startswith(">"):
        line = line.replace(">", "&gt;", 1)
    out, pos = [], 0
    for m in CODE_SPAN.finditer(line):
        out.append(line[pos:m.start()].replace("<", "&lt;"))
        out.append(m.group(0))
        pos = m.end()
    out.append(line[pos:].replace("<", "&lt;"))
    return "".join(out)


def _breaks_before(line: str, nxt: str) -> bool:
    """Whether the author broke the line on purpose (so the page keeps the break) rather than wrapping
    a paragraph at the margin (so the browser re-wraps it): a short line, or a next line that starts an
    item (``- ``, ``* ``, ``1. ``) or a label (``Text (eq. 1):``)."""
    head = nxt.strip()
    return (len(line.rstrip()) < WRAP_AT or head.startswith(("- ", "* ", "+ ")) or bool(re.match(r"\d+\.\s", head))
            or bool(LABEL.match(head)))


def to_markdown(text: str) -> str:
    lines = text.expandtabs().splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):  # an existing fence: copy it through untouched
            out.append(line)
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                out.append(lines[i])
                i += 1
            if i < len(lines):
                out.append(lines[i])
                i += 1
            continue
        is_code = (_indent(line) >= 4 and stripped) or stripped.startswith(">>>") or re.fullmatch(r"[-=]{3,}", stripped)
        if is_code:
            block = []
            doctest = stripped.startswith(">>>")
            while i < len(lines):
                cur = lines[i]
                if cur.strip() and (_indent(cur) >= 4 or (doctest and (cur.strip().startswith((">>>", "...")) or block))):
                    block.append(cur)
                elif not cur.strip() and i + 1 < len(lines) and _indent(lines[i + 1]) >= 4 and lines[i + 1].strip():
                    block.append("")
                elif block and re.fullmatch(r"[-=]{3,}", cur.strip()):
                    block.append(cur)
                elif not block:
                    block.append(cur)
                else:
                    break
                i += 1
            if out:
                out[-1] = out[-1].rstrip()
            last = max((k for k, o in enumerate(out) if o.strip()), default=None)
            if last is not None and out[last].endswith("::"):  # RST's "the block below is literal"
                out[last] = out[last][:-1]
            dedent = min((_indent(b) for b in block if b.strip()), default=0)
            # RST's ``literal`` markers mean nothing inside a code block: drop them there
            out += ["", "```text", *[RST_LITERAL.sub(r"\1", b[dedent:]) for b in block], "```", ""]
            continue
        if not stripped:
            if out:
                out[-1] = out[-1].rstrip()
            out.append("")
        else:
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            hard = bool(nxt.strip()) and _indent(nxt) < 4 and _breaks_before(line, nxt)
            out.append(_prose(line.rstrip()) + ("  " if hard else ""))  # two spaces: a Markdown hard break
        i += 1
    return "\n".join(out)


class PlainTextDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None and obj.path.startswith("vlmatch"):
            obj.docstring.value = to_markdown(obj.docstring.value)
