"""Settings are declared once (fields of memq.config.Settings made by `setting(...)`), and the
loader, its validation and deploy/CONFIG.md come from that declaration: the document is what
deploy/gen_config.py writes, covers every setting with its default and allowed values, and names
every MEMQ_* variable the product reads anywhere."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from memq.config import FILE_SETTINGS, OTHER_VARIABLES, SETTINGS, Settings, check, load_settings
from memq.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "deploy" / "CONFIG.md"
#: Where the product reads its environment (tests and benchmarks have variables of their own).
SOURCES = ("profiler", "workers", "migrations")


def _gen():
    spec = importlib.util.spec_from_file_location("gen_config", ROOT / "deploy" / "gen_config.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _env(tmp_path, **values) -> dict:
    return {"HOME": str(tmp_path), "MEMQ_DATA_DIR": str(tmp_path), "MEMQ_CONFIG": str(tmp_path / "none.toml"),
            **values}


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
        assert s.allowed().replace("|", "\\|") in row, (s.name, row)
    for name in FILE_SETTINGS:
        env = next(s.env for s in SETTINGS if s.name == name)
        assert f"`{env}_FILE`" in text


def test_doc_is_generated_from_the_declaration():
    assert DOC.read_text() == _gen().render(), "deploy/CONFIG.md is stale: run python deploy/gen_config.py"


def test_every_field_is_declared_with_its_variable():
    """One declaration: a field of Settings without its env/doc metadata would be a setting nobody can
    set or read about (`extra` holds nothing the loader fills)."""
    undeclared = [f.name for f in dataclasses.fields(Settings) if "env" not in f.metadata and f.name != "extra"]
    assert not undeclared, f"Settings fields not declared with setting(...): {undeclared}"
    envs = [s.env for s in SETTINGS]
    assert len(envs) == len(set(envs)) and all(e.startswith("MEMQ_") for e in envs)
    assert {s.name for s in SETTINGS} == {f.name for f in dataclasses.fields(Settings)} - {"extra"}


def test_every_memq_variable_read_anywhere_is_documented():
    text = DOC.read_text()
    seen: dict[str, str] = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in re.findall(r"\bMEMQ_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
                seen.setdefault(name, str(path.relative_to(ROOT)))
    assert len(seen) > len(SETTINGS) // 2, "the grep found too little: wrong folders?"
    missing = {name: where for name, where in seen.items() if f"`{name}`" not in text}
    assert not missing, f"MEMQ_* variables read but not in deploy/CONFIG.md (declare them in profiler/config.py " \
                        f"and run python deploy/gen_config.py): {missing}"
    assert all(f"`{name}`" in text for name, _ in OTHER_VARIABLES)


@pytest.mark.parametrize("var, value, says", [
    ("MEMQ_HEARTBEAT_S", "-5", "MEMQ_HEARTBEAT_S must be >= 1, got -5"),
    ("MEMQ_STREAM_TRIM_INTERVAL_S", "-1", "MEMQ_STREAM_TRIM_INTERVAL_S must be >= 0, got -1"),
    ("MEMQ_REPORT_HOUR_UTC", "24", "MEMQ_REPORT_HOUR_UTC must be in 0..23, got 24"),
    ("MEMQ_ALERT_HEADROOM_PCT", "101", "MEMQ_ALERT_HEADROOM_PCT must be in 0..100, got 101"),
    ("MEMQ_AGENT_HISTORY", "sometimes", "MEMQ_AGENT_HISTORY must be one of auto | on | off, got 'sometimes'"),
    ("MEMQ_ALERT_FORMAT", "teams", "MEMQ_ALERT_FORMAT must be one of slack | alertmanager, got 'teams'"),
    ("MEMQ_REDIS_URL", "redis://:hunter2@127.0.0.1:70000/0", "MEMQ_REDIS_URL: the port must be a number in 1..65535"),
    ("MEMQ_DATABASE_URL", "postgresql://memq:hunter2@db:0/memq",
     "MEMQ_DATABASE_URL: the port must be a number in 1..65535"),
    ("MEMQ_CLAIM_IDLE_S", "soon", "MEMQ_CLAIM_IDLE_S must be an integer, got 'soon'"),
])
def test_a_value_out_of_range_names_the_variable_and_what_is_allowed(tmp_path, var, value, says):
    with pytest.raises(ConfigError) as info:
        load_settings(_env(tmp_path, **{var: value}))
    assert str(info.value) == says
    assert "hunter2" not in str(info.value)  # a URL's password is never shown


def test_bounds_are_inclusive_and_file_values_are_checked_too(tmp_path):
    st = load_settings(_env(tmp_path, MEMQ_REPORT_HOUR_UTC="23", MEMQ_STREAM_KEEP_S="0", MEMQ_HEARTBEAT_S="1",
                            MEMQ_REDIS_URL="redis://127.0.0.1:65535/0", MEMQ_ALERT_FORMAT="alertmanager"))
    assert (st.report_hour_utc, st.stream_keep_s, st.heartbeat_s, st.alert_format) == (23, 0, 1, "alertmanager")
    assert st.broker_url == "redis://127.0.0.1:65535/0"
    cfg = tmp_path / "memq.toml"
    cfg.write_text("[memq]\ngc_minute_utc = 60\n")
    with pytest.raises(ConfigError, match=r"^MEMQ_GC_MINUTE_UTC \(gc_minute_utc in .*memq.toml\) must be in 0..59, "
                                          r"got 60$"):
        load_settings(_env(tmp_path, MEMQ_CONFIG=str(cfg)))
    secret = tmp_path / "redis-url"
    secret.write_text("redis://:pw@127.0.0.1:99999/0\n")
    with pytest.raises(ConfigError, match=r"^MEMQ_REDIS_URL \(from MEMQ_REDIS_URL_FILE\): the port"):
        load_settings(_env(tmp_path, MEMQ_REDIS_URL_FILE=str(secret)))


def test_defaults_load_and_every_default_is_allowed(tmp_path):
    st = load_settings(_env(tmp_path))
    for s in SETTINGS:
        check(s, getattr(st, s.name))  # raises if a declared default breaks its own rule
    assert st.database_url.startswith("sqlite:///") and st.broker_key_prefix == "memq:celery:"
    assert st.heartbeat_s == 10 and st.redis_url == "redis://127.0.0.1:6379/0"


def test_a_config_file_that_cannot_be_read_is_named_and_a_missing_one_is_no_error(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[memq\ngc_minute_utc = 1\n")
    with pytest.raises(ConfigError, match=r"^cannot read config file .*broken\.toml: "):
        load_settings(_env(tmp_path, MEMQ_CONFIG=str(broken)))
    with pytest.raises(ConfigError, match=r"^cannot read config file .*: "):
        load_settings(_env(tmp_path, MEMQ_CONFIG=str(tmp_path)))  # a directory
    assert load_settings(_env(tmp_path, MEMQ_CONFIG=str(tmp_path / "absent.toml"))).gc_minute_utc is not None
