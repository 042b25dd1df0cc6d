"""The nightly report task: keyed by (date, scope), reruns replace, missed days are caught up,
the beat entry is UTC, the webhook goes to the configured URL only. Real SQLite and PostgreSQL
databases, a real HTTP server on loopback. The registered task through a real worker is in
test_worker_beat.py."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading

import pytest
from sqlalchemy import func, select

from memq.store.orm import Report
from memq.store.report_queries import Scope
from memq.workers.reports import beat_entries, dates_to_build, post_webhook, run_nightly
from tests.conftest import memq_environ, temp_pg_database
from tests.report.conftest import DAY1, DAY1_RUNS, DAY2, DAY2_RUNS, ingest, invoke

D1, D2 = dt.date.fromisoformat(DAY1), dt.date.fromisoformat(DAY2)


def _rows(store):
    with store.session() as s:
        return s.execute(select(Report.report_date, Report.scope, Report.id).order_by(Report.report_date,
                                                                                         Report.scope)).all()


def test_catch_up_builds_missing_days_oldest_first_and_a_rerun_replaces(history):
    store = history.store()
    st = history.settings(report_catchup_days=4, report_scopes="all,cluster=b")
    # beat on 2026-12-01 reports on 11-30; 11-27 .. 11-29 were missed
    out = run_nightly(store, st, today=dt.date(2026, 12, 1))
    assert out["date"] == DAY2
    built = {e["scope"]: [b["date"] for b in e["built"]] for e in out["scopes"]}
    assert built == {"all": ["2026-11-27", "2026-11-28", DAY1, DAY2],
                     "cluster:b": ["2026-11-27", "2026-11-28", DAY1, DAY2]}
    rows = _rows(store)
    assert len(rows) == 8 and len({(r[0], r[1]) for r in rows}) == 8
    by_day = {e["date"]: e for e in out["scopes"][0]["built"]}
    assert by_day[DAY1]["runs"] == 8 and by_day[DAY1]["oom_runs"] == 4 and by_day[DAY2]["oom_runs"] == 3
    # the day-2 report compared itself with the day-1 report stored just before it
    with store.session() as s:
        from memq.store.report_queries import stored_report

        d2 = stored_report(s, D2, Scope.parse("all"))["summary"]
    assert d2["changes"]["previous_date"] == DAY1 and d2["changes"]["previous_source"] == "stored"
    assert [p["date"] for p in d2["trend"]] == ["2026-11-27", "2026-11-28", DAY1, DAY2]
    # the same tick again (a duplicate beat): only the target day is rebuilt, in place
    again = run_nightly(store, st, today=dt.date(2026, 12, 1))
    assert [b["date"] for b in again["scopes"][0]["built"]] == [DAY2]
    rows2 = _rows(store)
    assert [(r[0], r[1], r[2]) for r in rows2] == [(r[0], r[1], r[2]) for r in rows]  # same ids: replaced
    assert (history.root / "reports" / "cluster-b" / f"{DAY2}.html").exists()
    assert dates_to_build(store, Scope.parse("all"), dt.date(2026, 12, 2), 4) == [dt.date(2026, 12, 1),
                                                                                   dt.date(2026, 12, 2)]


def test_cli_and_task_share_the_key(history):
    assert invoke(history.env, ["report", "--date", DAY1, "--format", "json", "--out",
                                str(history.root / "x.json")]).exit_code == 0
    store = history.store()
    run_nightly(store, history.settings(report_catchup_days=1), date=D1, today=D2)
    with store.session() as s:
        assert s.execute(select(func.count()).select_from(Report).where(Report.report_date == D1)).scalar_one() == 1


def test_beat_entry_is_utc_crontab_on_the_report_queue(history):
    st = history.settings(report_hour_utc=1, report_minute_utc=15)
    entry = beat_entries(st)["memq-nightly-report"]
    assert entry["task"] == "workers.reports.nightly_report"
    assert entry["options"]["queue"] == "memq.report"
    sched = entry["schedule"]
    assert sched.hour == {1} and sched.minute == {15}
    from memq.workers.app import beat_schedule, celery_config

    assert "memq-nightly-report" in beat_schedule(st)
    conf = celery_config(st)
    assert conf["enable_utc"] is True and conf["timezone"] == "UTC"
    from memq.errors import ConfigError

    with pytest.raises(ConfigError):
        beat_entries(history.settings(report_hour_utc=24))


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list = []
    redirect_to: str | None = None

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append((self.path, self.headers.get("Content-Type"), body))
        if type(self).redirect_to:
            self.send_response(307)
            self.send_header("Location", type(self).redirect_to)
            self.end_headers()
            return
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


def _server(redirect_to: str | None = None):
    handler = type("Hook", (_Hook,), {"received": [], "redirect_to": redirect_to})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, handler


def test_webhook_posts_the_markdown_summary_to_the_configured_url(history):
    srv, hook = _server()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/hooks/memq"
        st = history.settings(report_webhook_url=url, report_catchup_days=1)
        out = run_nightly(history.store(), st, today=dt.date(2026, 12, 1))
    finally:
        srv.shutdown()
    assert out["scopes"][0]["webhook"] == {"status": 204}
    assert len(hook.received) == 1
    path, ctype, body = hook.received[0]
    assert path == "/hooks/memq" and ctype == "application/json"
    text = json.loads(body)["text"]
    assert text.startswith(f"# memq report {DAY2}")
    assert "3 OOM" in text and "leak_epochs" in text


def test_webhook_refuses_redirects_and_bad_urls_and_never_fails_the_report(history):
    other, other_hook = _server()
    srv, hook = _server(redirect_to=f"http://127.0.0.1:{other.server_address[1]}/elsewhere")
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
        with pytest.raises(OSError, match="redirect"):
            post_webhook(url, "x", 5)
        st = history.settings(report_webhook_url=url, report_catchup_days=1)
        out = run_nightly(history.store(), st, today=dt.date(2026, 12, 1))
    finally:
        srv.shutdown()
        other.shutdown()
    assert other_hook.received == []  # nothing reached the host nobody configured
    assert "redirect" in out["scopes"][0]["webhook"]["error"]
    assert out["scopes"][0]["built"][0]["report_id"]  # stored all the same
    from memq.errors import ConfigError

    for bad in ("file:///etc/passwd", "ftp://host/x", "http:///nohost"):
        with pytest.raises(ConfigError):
            post_webhook(bad, "x", 1)
    # an unreachable webhook times out / is refused quickly and is reported, not raised
    st = history.settings(report_webhook_url="http://127.0.0.1:9/none", report_webhook_timeout_s=2,
                          report_catchup_days=1)
    out = run_nightly(history.store(), st, today=dt.date(2026, 12, 1))
    assert "error" in out["scopes"][0]["webhook"]


@pytest.mark.postgres
def test_reports_on_postgresql(pg_server, tmp_path):
    """The whole path on the shared PostgreSQL server, in a database of its own."""
    from memq.store import schema
    from memq.store.db import make_engine

    with temp_pg_database("report") as url:
        engine = make_engine(url)
        schema.upgrade(engine)
        engine.dispose()
        env = memq_environ(url, tmp_path) | {"MEMQ_REPORT_DIR": str(tmp_path / "reports")}
        picked = {"seed_sgd", "capacity", "frag_synthetic", "frag_dyn_expandable", "leak_epochs", "dyn_gc"}
        ingest(env, [r for r in DAY1_RUNS + DAY2_RUNS if r.run in picked])
        res = invoke(env, ["report", "--date", DAY1, "--format", "json", "--out", str(tmp_path / "d1.json")])
        assert res.exit_code == 0, res.output
        d1 = json.loads((tmp_path / "d1.json").read_text())
        assert d1["totals"]["runs"] == 4
        assert d1["ooms"]["by_cause"] == {"capacity": 1, "fragmentation": 1}
        assert [r["run"] for r in d1["near_misses"]["runs"]] == ["frag_dyn_expandable"]
        assert [(r["job"], r["torch_version"], r["new"]) for r in d1["regressions"]] == [("gpt", "2.11.0", True)]
        assert d1["fragmented"][0]["run"] == "frag_synthetic"
        res = invoke(env, ["report", "--date", DAY2, "--format", "json", "--out", str(tmp_path / "d2.json")])
        d2 = json.loads((tmp_path / "d2.json").read_text())
        assert [g["run"] for g in d2["growing"]] == ["leak_epochs"]
        assert d2["growing"][0]["mean_growth_per_epoch_bytes"] == 8 * 131072000
        assert d2["changes"]["previous_date"] == DAY1 and d2["changes"]["ooms_by_cause"]["leak"]["now"] == 1
        from memq.config import load_settings
        from memq.store.connection import open_store

        store = open_store(load_settings(env))
        try:
            run_nightly(store, load_settings(env).replace(report_catchup_days=2), today=dt.date(2026, 12, 1))
            run_nightly(store, load_settings(env).replace(report_catchup_days=2), today=dt.date(2026, 12, 1))
            rows = _rows(store)
            assert [(r[0], r[1]) for r in rows] == [(D1, "all"), (D2, "all")]
        finally:
            store.close()
