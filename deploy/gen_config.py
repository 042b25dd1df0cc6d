"""Write deploy/CONFIG.md from the declaration of memq.config.Settings (seen through SETTINGS).

    python deploy/gen_config.py > deploy/CONFIG.md      # regenerate
    python deploy/gen_config.py --check                 # exit 1 when CONFIG.md is stale

tests/ops/test_config_doc.py fails when a setting is missing from the document or the document
differs from what this script writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memq.config import FILE_SETTINGS, OTHER_VARIABLES, SETTINGS  # noqa: E402

DOC = Path(__file__).with_name("CONFIG.md")

HEADER = """# memq configuration reference

Generated from the declaration of `memq.config.Settings` by `python deploy/gen_config.py >
deploy/CONFIG.md`; do not edit by hand (tests/ops/test_config_doc.py fails when this file and the
declaration differ). A value outside what "allowed" says is refused at start with the variable named.

Precedence: environment variable > config file > default. The config file is TOML at `MEMQ_CONFIG`
(default `<data dir>/memq.toml`), keys are the setting names below, either at the top level or
under a `[memq]` table:

```toml
[memq]
database_url = "postgresql://memq@db.example/memq"
retention_days = 30
retention_clusters = "dev=7,prod=90"
```

`<data dir>` is `MEMQ_DATA_DIR`, else `$XDG_DATA_HOME/memq`, else `~/.local/share/memq`.
Credentials: never put passwords on a command line; use the `*_FILE` variants (below) or the
environment of a service manager that reads it from a protected file. memq prints URLs with the
password masked (`redis://user:***@host`).
"""


def _default(spec) -> str:
    d = spec.default
    return f"`{d}`" if d != "" else "`''` (empty)"


def render() -> str:
    out = [HEADER, "", "## Settings", "",
           "| setting (file key) | environment variable | type | default | allowed | meaning |",
           "|---|---|---|---|---|---|"]
    for spec in SETTINGS:
        doc = spec.doc.replace("|", "\\|")
        allowed = spec.allowed().replace("|", "\\|")
        out.append(f"| `{spec.name}` | `{spec.env}` | {spec.type.__name__} | {_default(spec)} | {allowed} | {doc} |")
    out += ["", "## Values read from files", "",
            "Each of these may be given as a file holding the value (a Kubernetes Secret or Docker secret",
            "mounted read-only), used when the variable itself is unset or empty. Leading and trailing",
            "whitespace is stripped; the file's content is never printed.", "",
            "| variable | file variant |", "|---|---|"]
    envs = {s.name: s.env for s in SETTINGS}
    for name in FILE_SETTINGS:
        out.append(f"| `{envs[name]}` | `{envs[name]}_FILE` |")
    out += ["", "## Other variables", "",
            "| variable | meaning |", "|---|---|"]
    for name, doc in OTHER_VARIABLES:
        meaning = doc.replace("|", "\\|")
        out.append(f"| `{name}` | {meaning} |")
    out += ["| `PGPASSWORD`, `PGPASSFILE`, `PGSSLMODE`, ... | libpq variables, honoured by the psycopg 3 driver "
            "(a password need not be in `MEMQ_DATABASE_URL`). |",
            ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is stale: run `python deploy/gen_config.py > deploy/CONFIG.md`", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
