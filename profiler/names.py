"""Identity names (run, cluster, job, host): one rule for every way in.

The agent's envelopes (checked by the dispatcher at the door), `memq ingest` and `memq push` all call
`check_name`, so SQLite (which does not enforce `String(N)`) and PostgreSQL hold the same names.

A name is refused, never repaired, when it
- is not text, or holds a lone surrogate (it would not encode as UTF-8),
- is longer than its column (`runs.name`, `runs.job`, `runs.cluster`: 200; `runs.host`: 255),
- holds a control character (C0, DEL, C1: NUL makes a run unaddressable on PostgreSQL; ESC and BEL
  carry terminal escapes such as `\\033]0;TITLE\\007` into every listing), a line or paragraph
  separator, or a bidirectional override (text that displays differently from what it is),
- is empty or all white space where a name is required,
- mixes letters of scripts that no one writes together (run, cluster and job names): `llаma` with a
  Cyrillic `а` among Latin letters is a name made to look like another. The rule is Unicode's
  "highly restrictive" level (UTS #39, section 5.2): letters of one script, or Latin with the
  scripts of Chinese, Japanese or Korean writing; digits, punctuation and symbols go with any;
- is not in Unicode NFKC form (run, cluster and job names): `ｌｌａｍａ` (full-width) or `ﬁne` (a
  ligature) are refused with the form to use instead (`llama`, `fine`), so two names that read the
  same are the same name.
Refusing keeps what is stored equal to what the job sent: an escaped copy would no longer match
the name the job and its owners use to query it.

Pure: stdlib only.
"""

from __future__ import annotations

import unicodedata

from memq.errors import BadInput

#: Column lengths of profiler/store/orm.py (tests/workers/test_poison.py checks they agree).
MAX_LEN = {"run": 200, "cluster": 200, "job": 200, "host": 255}
#: Text that changes how a terminal shows the rest of the line.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SEPARATORS = frozenset("\u2028\u2029\x85")


class BadName(BadInput):
    """An identity name memq does not store."""


#: Scripts (the first word of a letter's Unicode name) allowed together (UTS #39 5.2, "highly
#: restrictive"): CJK writing mixes Han with kana or Hangul and Latin; anything else is one script.
_SCRIPT_OF = {"CJK": "Han", "HIRAGANA": "Hiragana", "KATAKANA": "Katakana", "HALFWIDTH": "Katakana",
              "HANGUL": "Hangul", "BOPOMOFO": "Bopomofo"}
_ALLOWED_MIXES = (frozenset({"LATIN", "Han", "Hiragana", "Katakana"}), frozenset({"LATIN", "Han", "Bopomofo"}),
                  frozenset({"LATIN", "Han", "Hangul"}))


def _scripts(value: str) -> set[str]:
    out = set()
    for ch in value:
        if unicodedata.category(ch).startswith("L"):
            word = unicodedata.name(ch, "UNKNOWN").split(" ", 1)[0]
            out.add(_SCRIPT_OF.get(word, word))
    return out


def mixed_scripts(value: str) -> set[str] | None:
    """The scripts of `value`'s letters when they mix in a way UTS #39 "highly restrictive" refuses."""
    found = _scripts(value)
    if len(found) <= 1 or any(found <= allowed for allowed in _ALLOWED_MIXES):
        return None
    return found


def name_problem(value: object, *, max_len: int, required: bool = True) -> str | None:
    """Why `value` is not an acceptable name, or None when it is."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not text"
    if not value.strip():
        return "is empty" if required else None
    if len(value) > max_len:
        return f"is {len(value)} characters long, over the limit of {max_len}"
    for i, ch in enumerate(value):
        if ch in _BIDI or ch in _SEPARATORS or unicodedata.category(ch) in ("Cc", "Cs"):
            what = "a lone surrogate (not UTF-8)" if unicodedata.category(ch) == "Cs" else \
                f"the control character U+{ord(ch):04X}"
            return f"holds {what} at position {i}"
    return None


def check_name(field: str, value: object, *, required: bool = True) -> str:
    """`value` when it is an acceptable `field` name (run, cluster, job, host); else BadName with a
    message that quotes at most 60 characters of it, escaped."""
    if not required and value in (None, ""):
        return ""
    problem = name_problem(value, max_len=MAX_LEN[field], required=required)
    if problem is None and field != "host" and isinstance(value, str):
        mixed = mixed_scripts(value)
        norm = unicodedata.normalize("NFKC", value)
        if norm != value:
            problem = f"is not in Unicode NFKC form (send {ascii(norm[:60])} instead)"
        elif mixed:
            problem = f"mixes the scripts {', '.join(sorted(mixed))} (a look-alike of another name)"
    if problem:
        shown = ascii(value[:60]) + ("..." if len(value) > 60 else "") if isinstance(value, str) else ""
        raise BadName(f"{field} name {shown} {problem}".replace("  ", " "),
                      hint="names are at most 200 characters (host 255) of printable text")
    return value
