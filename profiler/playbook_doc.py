"""The packaged playbook text (profiler/playbook.md, written by benchmarks/playbook.py): links to its
entries, one entry's section as Markdown, and the whole text as escaped HTML for `memq serve`.

The entry ids and titles are profiler/playbook.py's (pure data); this module is the one place that
reads the Markdown file. Everything but `read_playbook` is pure: text in, text out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from memq.errors import BadInput, MemqError
from memq.playbook import BY_ID, DOC_PATH, ENTRIES, PACKAGED_NAME

REGENERATE = "python benchmarks/playbook.py"
# `## <a id="empty-cache"></a>torch.cuda.empty_cache()`: the heading level, the id, the title.
_ANCHORED = re.compile(r'^(#{1,6})[ \t]+<a[ \t]+id="([A-Za-z0-9_-]+)"[ \t]*>[ \t]*</a>[ \t]*(.*?)[ \t#]*$')
_HEADING = re.compile(r"^(#{1,6})(?:[ \t]|$)")
_FENCE = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})")


def known(entry_id: object) -> str:
    """`entry_id` when it names a playbook entry, else "": a result stored before recommendations
    carried an id (or with an id a later playbook dropped) renders without a link, never a dead one."""
    return entry_id if isinstance(entry_id, str) and entry_id in BY_ID else ""


def doc_link(entry_id: object) -> str:
    """`docs/playbook.md#<id>` for a known entry, "" otherwise."""
    e = known(entry_id)
    return f"{DOC_PATH}#{e}" if e else ""


def web_href(entry_id: object) -> str:
    """The entry on `memq serve`'s /playbook page, "" for an unknown id."""
    e = known(entry_id)
    return f"/playbook#{e}" if e else ""


def unknown_entry(entry_id: str) -> BadInput:
    ids = ", ".join(e.id for e in ENTRIES)
    return BadInput(f"no playbook entry {entry_id!r}; the entries are: {ids}",
                    hint="`memq playbook` lists them with their titles")


def packaged_path() -> Path:
    return Path(str(resources.files("memq").joinpath(PACKAGED_NAME)))


def read_playbook(path: Path | str | None = None) -> str:
    """The playbook Markdown: the packaged copy, or `path` (tests give a file of their own)."""
    p = Path(path) if path is not None else packaged_path()
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MemqError(f"the playbook text is not installed ({p} is missing)",
                        hint=f"regenerate it with `{REGENERATE}` in a memq checkout "
                             "(a built package ships it)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MemqError(f"the playbook text {p} cannot be read: {exc}",
                        hint=f"regenerate it with `{REGENERATE}`") from None


@dataclass(frozen=True)
class Heading:
    line: int      # 0-based line number
    level: int     # 1..6
    entry_id: str  # "" for a heading without an anchor


def headings(text: str) -> list[Heading]:
    """ATX headings outside fenced code blocks, with the anchor id each carries."""
    out: list[Heading] = []
    fence: str | None = None
    for i, line in enumerate(text.splitlines()):
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark):].strip():
                fence = None
            continue
        if fence is not None:
            continue
        a = _ANCHORED.match(line)
        if a:
            out.append(Heading(i, len(a.group(1)), a.group(2)))
        elif _HEADING.match(line):
            out.append(Heading(i, len(_HEADING.match(line).group(1)), ""))
    return out


def section(text: str, entry_id: str) -> str:
    """The entry's section: its anchored heading up to the next heading of the same or a higher level
    (so an entry keeps its own sub-sections). BadInput for an id that is not an entry; MemqError when
    the text lacks an entry's section (a playbook older than this memq: an installation fault)."""
    if entry_id not in BY_ID:
        raise unknown_entry(entry_id)
    hs = headings(text)
    start = next((h for h in hs if h.entry_id == entry_id), None)
    if start is None:
        raise MemqError(f"the installed playbook text has no section {entry_id!r}",
                        hint=f"it predates this memq: regenerate it with `{REGENERATE}`")
    end = next((h.line for h in hs if h.line > start.line and h.level <= start.level), None)
    lines = text.splitlines()
    return "\n".join(lines[start.line:end]).rstrip() + "\n"


def to_html(text: str) -> str:
    """The playbook as HTML for the /playbook page. Raw HTML in the text is escaped like any other
    text (markdown-it with html off; link targets such as javascript: are refused by its validator);
    the one thing kept of it is the `<a id>` anchor of a heading, which becomes the heading's id, so
    /playbook#<id> lands on the entry."""
    from markdown_it import MarkdownIt  # memq serve's page only: the terminal shows the text

    ids = {h.line: h.entry_id for h in headings(text) if h.entry_id}
    lines = text.splitlines()
    for i in ids:
        m = _ANCHORED.match(lines[i])
        lines[i] = f"{m.group(1)} {m.group(3)}"
    md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    tokens = md.parse("\n".join(lines) + "\n")
    for t in tokens:
        if t.type == "heading_open" and t.map and t.map[0] in ids:
            t.attrSet("id", ids[t.map[0]])
        style = t.attrGet("style") if t.attrs else None
        if style:  # a table column's alignment: a class, since the page's CSP refuses inline styles
            t.attrs.pop("style")
            t.attrSet("class", "align-" + str(style).split(":")[-1].strip(" ;"))
    return md.renderer.render(tokens, md.options, {})
