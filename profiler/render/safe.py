"""Text from other people (run, job, cluster and host names, file names, frames, dead-letter reasons)
made safe to print on a terminal. The one place that decides how; every human output uses it.

A name can carry terminal escapes: `\\033]0;TITLE\\007` retitles the window, other sequences move
the cursor, rewrite earlier lines or hide text; CR overwrites what was printed, NUL and C1 controls
(0x80-0x9f, where 0x9b is a CSI on some terminals) confuse terminals and parsers, and bidi overrides
(U+202A-U+202E, U+2066-U+2069) reorder what is shown. `safe_text` replaces each such character with a
visible escape (`\\x1b`, `\\r`, `\\u202e`), so nothing is lost and nothing acts. CSV cells get the
same escapes (not stripped: the value stays recognisable, and a spreadsheet sees no control bytes).
JSON output needs nothing: json.dumps already writes control characters as \\u escapes.

Rich consoles also read `[...]` as markup: `rich_text` escapes that too, for values put into markup;
`SafeConsole` applies `safe_text` (keeping newlines) to every string it renders, as a backstop for
any value a command prints without `rich_text`.
"""

from __future__ import annotations

import functools
import re
from typing import Any

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    ch = m.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_text(value: Any, keep_newlines: bool = False) -> str:
    """`str(value)` with every control, C1 and bidi-override character shown as an escape."""
    text = value if isinstance(value, str) else str(value)
    return (_UNSAFE_KEEP_NL if keep_newlines else _UNSAFE).sub(_escape, text)


def rich_text(value: Any) -> str:
    """`safe_text` plus rich markup escaping, for a value placed inside a rich markup string."""
    from rich.markup import escape  # rich: `memq --help` and `analyze --json` load this module (pinned)

    return escape(safe_text(value))


@functools.lru_cache(maxsize=1)
def safe_console_class():
    """A rich Console whose every rendered string passes through `safe_text` (newlines kept)."""
    from rich.console import Console  # rich: as in rich_text (pinned)
    from rich.errors import MarkupError
    from rich.segment import Segment

    class SafeConsole(Console):
        def render(self, renderable, options=None):  # noqa: D401 - rich hook
            # Backstop for text that never passed render_str (Text objects, panel titles): escape
            # it in the segments, leaving rich's own control segments alone.
            for seg in super().render(renderable, options):
                if seg.control or not _UNSAFE_KEEP_NL.search(seg.text):
                    yield seg
                else:
                    yield Segment(safe_text(seg.text, keep_newlines=True), seg.style, seg.control)

        def render_str(self, text: str, **kwargs):  # noqa: D401 - rich hook
            text = safe_text(text, keep_newlines=True)
            try:
                return super().render_str(text, **kwargs)
            except MarkupError:  # a value that looks like broken markup: show it as it is
                return super().render_str(text, **{**kwargs, "markup": False})

    return SafeConsole


def safe_console(**kwargs):
    return safe_console_class()(**kwargs)
