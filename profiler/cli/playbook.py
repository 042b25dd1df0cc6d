"""`memq playbook [ENTRY_ID]`: the OOM playbook's entries, or one entry's section, offline.

Every recommendation names an entry (`docs/playbook.md#<id>`); this prints that section from the copy
of the playbook shipped inside the package (an installed memq has no docs/ folder)."""

from __future__ import annotations

import json
import re
import sys

import click

from memq.playbook import BY_ID, DOC_PATH, ENTRIES
from memq.playbook_doc import doc_link, read_playbook, section, unknown_entry

ANCHOR = re.compile(r'<a id="[^"]*"></a>')


@click.command()
@click.argument("entry_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="The entries (or the one entry) as JSON.")
# Tests point the reader at a playbook of their own; users read the packaged one.
@click.option("--file", "path", type=click.Path(dir_okay=False), default=None, hidden=True)
def playbook(entry_id, as_json, path):
    """List the playbook's entries, or print the section of ENTRY_ID (e.g. `memq playbook empty-cache`)."""
    if entry_id is None:
        rows = [{"id": e.id, "title": e.title, "summary": e.summary, "advice": e.advice, "link": doc_link(e.id)}
                for e in ENTRIES]
        if as_json:
            json.dump({"entries": rows}, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return
        width = max(len(e.id) for e in ENTRIES)
        for r in rows:
            click.echo(f"{r['id']:<{width}}  {r['title']}")
            click.echo(f"{'':<{width}}  {r['summary']}")
        click.echo(f"\n`memq playbook ID` prints an entry; the whole text: {DOC_PATH}")
        return
    if entry_id not in BY_ID:
        raise unknown_entry(entry_id)  # main() prints it through safe_text
    text = section(read_playbook(path), entry_id)
    if as_json:
        e = BY_ID[entry_id]
        json.dump({"id": e.id, "title": e.title, "summary": e.summary, "advice": e.advice, "link": doc_link(e.id),
                   "markdown": text}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    # A terminal shows markdown as text: the headings' `<a id>` anchors (for links into the page) are noise.
    click.echo(ANCHOR.sub("", text), nl=False)
