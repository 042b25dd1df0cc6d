"""The README's plain-host (systemd) steps, run as written in a temporary root (issue 42 item 8): the
secrets they make are the files the copy step names, the URLs name the hosts given (never compose's
service names), and memq reads each credential file the units hand it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def systemd_steps() -> list[str]:
    """The shell lines of the README's "Plain hosts (systemd)" block that make and copy credentials."""
    text = (ROOT / "deploy" / "README.md").read_text()
    block = text.split("## Plain hosts (systemd)", 1)[1].split("```", 2)[1]
    joined = re.sub(r"\\\n\s*", "", block)
    return [ln.split("  #")[0].strip() for ln in joined.splitlines()
            if ln.startswith(("install -d -m 0700", "MEMQ_REDIS_HOST=", "sh deploy/make-secrets.sh",
                              "install -m 0600"))]


def test_the_documented_credential_steps_run(tmp_path):
    steps = systemd_steps()
    assert any("make-secrets.sh" in s for s in steps) and sum(s.startswith("install -m 0600") for s in steps) >= 1
    work = tmp_path / "clone"
    shutil.copytree(ROOT / "deploy", work / "deploy", ignore=shutil.ignore_patterns("secrets"))
    etc = tmp_path / "etc"
    script = "set -eu\n" + "\n".join(s.replace("/etc/memq", str(etc)) for s in steps) + "\n"
    out = subprocess.run(["sh", "-c", script], cwd=work, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    creds = etc / "credentials"
    assert sorted(p.name for p in creds.iterdir()) == ["database_url", "redis_url"]
    redis_url, db_url = (creds / "redis_url").read_text().strip(), (creds / "database_url").read_text().strip()
    assert "@redis.example.internal:6379/" in redis_url and "@db.example.internal:5432/" in db_url
    assert "@redis:" not in redis_url and "@postgres:" not in db_url
    assert "@redis.example.internal:" in (work / "deploy" / "secrets" / "agent_redis_url").read_text()
    # what the units do: MEMQ_*_FILE pointing at the credential
    from memq.config import load_settings

    st = load_settings({"MEMQ_REDIS_URL_FILE": str(creds / "redis_url"),
                        "MEMQ_DATABASE_URL_FILE": str(creds / "database_url"),
                        "MEMQ_DATA_DIR": str(tmp_path / "data")})
    assert st.redis_url == redis_url and st.database_url.endswith("@db.example.internal:5432/memq")


def test_compose_defaults_are_unchanged(tmp_path):
    work = tmp_path / "clone"
    shutil.copytree(ROOT / "deploy", work / "deploy", ignore=shutil.ignore_patterns("secrets"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    subprocess.run(["sh", "deploy/make-secrets.sh"], cwd=work, env=env, check=True, capture_output=True)
    sec = work / "deploy" / "secrets"
    assert "@redis:6379/" in (sec / "memq_redis_url").read_text()
    assert "@postgres:5432/" in (sec / "memq_database_url").read_text()
