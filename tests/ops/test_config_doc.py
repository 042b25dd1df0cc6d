"""deploy/CONFIG.md covers every setting of profiler.config.SETTINGS with its default, and is what
deploy/gen_config.py writes (so a setting added to the table without regenerating fails here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from profiler.config import FILE_SETTINGS, SETTINGS, Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "deploy" / "CONFIG.md"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_config", ROOT / "deploy" / "gen_config.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_setting_is_documented_with_its_default():
    text = DOC.read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in text.splitlines()
            if line.startswith("| `")}
    missing = [s.env for s in SETTINGS if s.name not in rows]
    assert not missing, f"settings missing from deploy/CONFIG.md: {missing} (run python deploy/gen_config.py)"
    for s in SETTINGS:
        row = rows[s.name]
        assert f"`{s.env}`" in row, s.env
        assert f"`{s.default}`" in row or (s.default == "" and "`''`" in row), (s.name, row)
    for name in FILE_SETTINGS:
        env = next(s.env for s in SETTINGS if s.name == name)
        assert f"`{env}_FILE`" in text


def test_doc_is_generated_from_the_table():
    assert DOC.read_text() == _gen().render(), "deploy/CONFIG.md is stale: run python deploy/gen_config.py"


def test_table_matches_settings_dataclass():
    fields = set(Settings.__dataclass_fields__) - {"extra"}
    assert {s.name for s in SETTINGS} == fields
