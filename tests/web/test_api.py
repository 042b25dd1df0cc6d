"""The JSON API of `memq serve`, over HTTP against the real server process (tests/web/conftest.py):
the CLI's --json shapes, filters, sorting and paging, 400s with their reasons, 404s, a corrupt
stored blob, the raw download, read-only, and the bearer token."""

from __future__ import annotations

import gzip
import hashlib
import json
import urllib.parse

import pytest

from tests.helpers import REAL
from tests.web.conftest import TOKEN

ALL_RUNS = {"seed_adamw", "seed_sgd", "frag_synthetic", "capacity", "frag_dyn"}


def names(doc: dict) -> list[str]:
    return [r["run"] for r in doc["runs"]]


def test_runs_list_has_every_ingested_run_newest_first(server):
    doc = server.json("/api/runs")
    assert set(names(doc)) == ALL_RUNS and doc["total"] == 5 and doc["count"] == 5
    started = [r["started_at"] for r in doc["runs"]]
    assert started == sorted(started, reverse=True)
    by = {r["run"]: r for r in doc["runs"]}
    assert by["frag_synthetic"]["primary_cause"] == "fragmentation" and by["frag_synthetic"]["status"] == "oom"
    assert by["capacity"]["primary_cause"] == "capacity"
    assert by["seed_adamw"]["status"] == "completed" and by["seed_adamw"]["snapshot_count"] == 4
    assert isinstance(by["capacity"]["peak_reserved_bytes"], int)


@pytest.mark.parametrize("query,expected", [
    ("cluster=b", {"frag_synthetic", "capacity", "frag_dyn"}),
    ("job=gpt", {"seed_adamw", "capacity"}),
    ("status=oom", {"frag_synthetic", "capacity", "frag_dyn"}),
    ("status=completed", {"seed_adamw", "seed_sgd"}),
    ("cause=fragmentation", {"frag_synthetic", "frag_dyn"}),
    ("cause=fragmentation&torch=2.11.0", {"frag_synthetic"}),
    ("cause=capacity", {"capacity"}),
    ("torch=2.11", {"seed_sgd", "frag_synthetic", "capacity", "frag_dyn"}),
    ("torch=2.11.0", {"seed_sgd", "frag_synthetic", "capacity"}),
    ("torch=2.10.0&cluster=a", {"seed_adamw"}),
    ("cluster=b&job=gpt&status=oom", {"capacity"}),
    ("since=2000-01-01", ALL_RUNS),
    ("since=2100-01-01", set()),
    ("until=2000-01-01", set()),
    ("cluster=nowhere", set()),
])
def test_runs_filters(server, query, expected):
    doc = server.json(f"/api/runs?{query}")
    assert set(names(doc)) == expected and doc["total"] == len(expected)


def test_runs_date_window_splits_the_history(server):
    runs = server.json("/api/runs")["runs"]
    times = sorted(r["started_at"] for r in runs)
    cut = times[2]  # the third oldest run's start: since includes it, until excludes it
    newer = set(names(server.json(f"/api/runs?since={cut.replace('Z', '%2B00:00')}")))
    older = set(names(server.json(f"/api/runs?until={cut.replace('Z', '%2B00:00')}")))
    assert len(older) == 2 and len(newer) == 3 and older | newer == ALL_RUNS and not older & newer


def test_runs_sorting(server):
    asc = server.json("/api/runs?sort=peak_reserved&order=asc")["runs"]
    vals = [r["peak_reserved_bytes"] for r in asc]
    assert vals == sorted(vals) and len(vals) == 5
    desc = server.json("/api/runs?sort=run&order=desc")["runs"]
    assert names({"runs": desc}) == sorted(ALL_RUNS, reverse=True)


def test_runs_paging_covers_every_run_once(server):
    seen, offset, pages = [], 0, 0
    while offset is not None:
        doc = server.json(f"/api/runs?limit=2&offset={offset}&sort=run&order=asc")
        assert doc["count"] <= 2 and doc["total"] == 5
        seen += names(doc)
        offset = doc["next_offset"]
        pages += 1
    assert pages == 3 and seen == sorted(ALL_RUNS)
    last = server.json("/api/runs?limit=2&offset=4&sort=run&order=asc")
    assert last["prev_offset"] == 2 and last["next_offset"] is None


def test_runs_keyset_cursors_walk_forward_and_back(server):
    """Sorted by start time, pages carry cursors: forward through every run, then back again."""
    first = server.json("/api/runs?limit=2")
    pages, doc = [names(first)], first
    while doc["next_cursor"]:
        doc = server.json(f"/api/runs?limit=2&after={doc['next_cursor']}&offset={doc['next_offset']}")
        pages.append(names(doc))
    assert sum(pages, []) == names(server.json("/api/runs")) and [len(p) for p in pages] == [2, 2, 1]
    assert doc["next_cursor"] is None and doc["offset"] == 4
    back = server.json(f"/api/runs?limit=2&before={doc['prev_cursor']}&offset={doc['prev_offset']}")
    assert names(back) == pages[1]
    asc = server.json("/api/runs?limit=3&order=asc")
    more = server.json(f"/api/runs?limit=3&order=asc&after={asc['next_cursor']}&offset=3")
    assert names(asc) + names(more) == list(reversed(names(server.json("/api/runs"))))


@pytest.mark.parametrize("query,reason", [
    ("limit=0", "limit: 0 is outside 1..500"),
    ("limit=abc", "limit: 'abc' is not an integer"),
    ("offset=-1", "offset: -1 is outside 0..100000"),
    ("offset=100001", "offset: 100001 is outside 0..100000"),
    ("status=exploded", "status: 'exploded' is not one of"),
    ("cause=gremlins", "cause: 'gremlins' is not one of"),
    ("sort=password", "sort: 'password' is not one of"),
    ("order=sideways", "order: 'sideways' is not one of"),
    ("since=yesterday", "since: 'yesterday' is not a date"),
    ("since=2026-11-02&until=2026-11-01", "until must be later than since"),
    ("colour=red", "unknown query parameter 'colour'"),
    ("after=yesterday", "after: 'yesterday' is not a cursor"),
    ("after=2026-11-29T20:00:00Z~1&before=2026-11-29T20:00:00Z~2", "give after or before, not both"),
    ("after=2026-11-29T20:00:00Z~1&sort=run", "cursors page the listing sorted by start time only"),
    ("cluster=" + "x" * 201, "cluster: at most 200 printable characters"),
])
def test_bad_parameters_answer_400_with_the_reason(server, query, reason):
    code, headers, body = server.get(f"/api/runs?{query}")
    assert code == 400 and headers["content-type"].startswith("application/json")
    assert reason in json.loads(body)["error"]
    page_code, _, page = server.get(f"/runs?{query}")
    assert page_code == 400 and reason.split("'")[0].encode() in page


@pytest.mark.parametrize("path,status", [
    ("/api/runs/no-such-run", 404), ("/runs/no-such-run", 404), ("/api/lanes/no-such-run", 404),
    ("/api/snapshots/987654", 404), ("/snapshots/987654", 404), ("/api/snapshots/987654/raw", 404),
    ("/api/snapshots/abc", 400), ("/api/reports/987654", 404), ("/reports/987654", 404),
    ("/api/compare?a=capacity&b=no-such-run", 404), ("/no/such/page", 404),
    ("/api/runs/capacity?rank=7", 404), ("/api/runs/capacity?rank=x", 400), ("/api/compare?a=capacity", 400),
    ("/api/versions", 400),
])
def test_unknown_things_404_and_bad_ones_400(server, path, status):
    code, headers, body = server.get(path)
    assert code == status, body[:300]
    if path.startswith("/api/"):
        assert json.loads(body)["status"] == status
    else:
        assert b"<!doctype html>" in body[:50]


def test_run_detail_is_memq_history_json(server, web_history):
    api = server.json("/api/runs/seed_adamw")
    cli = json.loads(web_history.cli("history", "--run", "seed_adamw", "--json"))
    assert api == cli
    assert [s["epoch"] for s in api["snapshots"]] == [None, 0, 1, 2] and api["stats"]["count"] > 0
    lanes = server.json("/api/lanes/seed_adamw")
    assert lanes["ranks"] == [0] and lanes["lanes"][0]["stats"]["count"] == api["stats"]["count"]
    assert [s["id"] for s in lanes["lanes"][0]["snapshots"]] == [s["id"] for s in api["snapshots"]]


def test_per_rank_lanes(server):
    lanes = server.json("/api/lanes/seed_sgd")
    assert lanes["ranks"] == [0, 1]
    assert [len(x["snapshots"]) for x in lanes["lanes"]] == [4, 3]
    assert all(x["stats"]["count"] > 0 for x in lanes["lanes"])
    hist = server.json("/api/runs/seed_sgd?rank=1")
    assert [s["rank"] for s in hist["snapshots"]] == [1, 1, 1] and hist["stats"]["rank"] == 1


def test_compare_and_versions_are_the_cli_json(server, web_history):
    api = server.json("/api/compare?a=seed_adamw&b=seed_sgd")
    assert api == json.loads(web_history.cli("compare", "seed_adamw", "seed_sgd", "--json"))
    assert api["composition_delta"]["optimizer_state"] < 0  # SGD keeps no Adam moments
    v = server.json("/api/versions?job=gpt")
    assert v == json.loads(web_history.cli("versions", "--job", "gpt", "--json"))
    assert {x["torch_version"] for x in v["versions"]} == {"2.10.0", "2.11.0"}


def test_snapshot_detail_segments_blocks_frames_and_fit_test(server, web_history):
    from memq.load import load_snapshot_file

    sid = web_history.snapshot_id("frag_synthetic", "oom")
    doc = server.json(f"/api/snapshots/{sid}")
    snap = load_snapshot_file(REAL / "frag_synthetic" / "oom.pickle.gz").snapshot
    view, analysis = doc["view"], doc["analysis"]
    assert doc["snapshot"]["run"] == "frag_synthetic" and doc["snapshot"]["trigger"] == "oom"
    assert analysis["diagnosis"]["primary_cause"] == "fragmentation"
    assert len(view["segments"]) == len(snap.segments)
    assert sum(s["size"] for s in view["segments"]) == analysis["metrics"]["reserved_bytes"]
    blocks = [b for s in view["segments"] for b in s["blocks"]]
    assert sum(b["s"] for b in blocks if b["st"] != "inactive") == analysis["metrics"]["active_bytes"]
    assert sum(b["s"] for b in blocks if b["x"]) == view["stranded_bytes"] == analysis["metrics"]["stranded_bytes"]
    live = [b for b in blocks if b["st"] != "inactive"]
    assert all(b["c"] in ("parameters", "gradients", "optimizer_state", "activations", "workspace", "other",
                          "unknown") for b in live)
    framed = [b for b in live if b["k"] >= 0]
    assert framed and all(view["stacks"][b["k"]] for b in framed)
    assert all(len(f) == 3 for f in view["stacks"][framed[0]["k"]])
    fit = view["fit"]
    assert fit["fits_largest_free_block"] is False and fit["fits_if_compacted"] is True
    assert fit["requested_bytes"] == analysis["oom"]["requested_bytes"] and fit["limit_bytes"] == 8589934592
    tl = view["timeline"]
    assert tl["events"] == len(snap.trace) and len(tl["t"]) == len(tl["levels"])
    assert tl["oom_index"] is not None


def test_what_if_outcomes_shown_where_stored(server, web_history):
    hist = server.json("/api/runs/frag_synthetic")
    oom = [s for s in hist["snapshots"] if s["trigger"] == "oom"][0]
    assert oom["whatif"] and oom["whatif"]["results"]  # stored at ingest (the workers' sweep)
    confs = [r["conf"] for r in oom["whatif"]["results"]]
    view = server.json(f"/api/snapshots/{oom['id']}")["view"]
    assert [r["conf"] for r in view["whatif"]] == confs
    for path in ("/runs/frag_synthetic", f"/snapshots/{oom['id']}"):
        code, _, page = server.get(path)
        assert code == 200 and b'class="grid whatif"' in page
        assert all(c.encode() in page for c in confs if c)


def test_raw_download_is_the_original_pickle(server, web_history):
    sid = web_history.snapshot_id("capacity")
    code, headers, body = server.get(f"/api/snapshots/{sid}/raw")
    assert code == 200 and headers["content-type"] == "application/octet-stream"
    assert "attachment" in headers["content-disposition"] and ".pickle" in headers["content-disposition"]
    assert body == gzip.decompress((REAL / "capacity" / "oom.pickle.gz").read_bytes())
    sha = web_history.sql("SELECT sha256 FROM snapshots WHERE id = ?", sid)[0][0]
    assert hashlib.sha256(body).hexdigest() == sha


def test_corrupt_blob_is_reported_and_the_server_keeps_serving(server, web_history):
    sid = web_history.snapshot_id("frag_dyn")
    doc = server.json(f"/api/snapshots/{sid}")
    assert "cannot be read" in doc["view"]["blob_error"] and doc["view"]["segments"] is None
    assert doc["analysis"]["diagnosis"]["primary_cause"]  # the stored analysis is still there
    code, _, page = server.get(f"/snapshots/{sid}")
    assert code == 200 and b'id="blob-error"' in page and b"cannot be read" in page
    assert b'id="raw-download"' not in page
    code, _, body = server.get(f"/api/snapshots/{sid}/raw")
    assert code == 500 and "cannot be read" in json.loads(body)["error"]
    assert server.json("/api/runs")["total"] == 5  # still serving
    assert server.get(f"/snapshots/{web_history.snapshot_id('capacity')}")[0] == 200


def test_reports_listed_and_opened(server):
    doc = server.json("/api/reports")
    assert doc["count"] == 2 and [r["date"] for r in doc["reports"]] == ["2026-11-30", "2026-11-29"]
    assert all(r["scope"] == "all" for r in doc["reports"])
    rid = doc["reports"][1]["id"]
    code, headers, body = server.get(f"/reports/{rid}")
    assert code == 200 and b"memq report 2026-11-29" in body
    csp = headers["content-security-policy"]
    assert "unsafe-inline" in csp and "script-src" not in csp
    assert server.json(f"/api/reports/{rid}")["summary"]["totals"]["runs"] >= 1
    # the other's stored path lies outside the report directory: not read, drawn from its figures
    code, _, body = server.get(f"/reports/{doc['reports'][0]['id']}")
    assert code == 200 and b"memq report 2026-11-30" in body and b"root:" not in body


def test_read_only_and_security_headers(server):
    for path in ("/api/runs", "/api/runs/capacity", "/api/snapshots/1", "/runs"):
        assert server.get(path, method="POST")[0] == 405
        assert server.get(path, method="DELETE")[0] == 405
    code, headers, _ = server.get("/runs")
    assert code == 200 and "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    assert "server" not in {k.lower() for k in headers}


@pytest.mark.parametrize("path", ["/api/runs", "/runs", "/runs/capacity", "/api/snapshots/1/raw", "/static/memq.js",
                                  "/healthz", "/reports", "/no/such/page"])
def test_token_required_on_every_route(token_server, path):
    code, headers, body = token_server.get(path)
    assert code == 401 and headers["www-authenticate"].startswith("Bearer")
    assert token_server.get(path, {"Authorization": "Bearer wrong"})[0] == 401
    assert token_server.get(path, {"Cookie": "memq_token=wrong"})[0] == 401
    assert token_server.get(path + "?token=wrong")[0] == 401
    code, _, _ = token_server.get(path, {"Authorization": f"Bearer {TOKEN}"})
    assert code == (404 if path == "/no/such/page" else 200)


def test_token_in_the_url_sets_a_cookie_and_leaves_the_address_bar(token_server):
    code, headers, _ = token_server.get(f"/runs?cluster=b&token={TOKEN}")
    assert code == 303 and headers["location"] == "/runs?cluster=b"
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"memq_token={TOKEN}") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    code, _, body = token_server.get("/runs?cluster=b", {"Cookie": cookie.split(";")[0]})
    assert code == 200 and b"capacity" in body and b"seed_adamw" not in body


@pytest.mark.parametrize("path", ["//evil.example/x", "///evil.example/x", "/\\evil.example/x", "/\\/evil.example"])
def test_the_token_redirect_stays_on_this_server(token_server, path):
    """Issue 24 item 6: `GET //other.host/x?token=T` answered `Location: //other.host/x`, which a browser
    follows to another host (with the cookie just set). The redirect keeps to this server's paths."""
    code, headers, _ = token_server.get(f"{path}?token={TOKEN}")
    assert code == 303
    loc = headers["location"]
    assert loc.startswith("/") and not loc.startswith("//") and "\\" not in loc[:2], loc
    assert urllib.parse.urlsplit(loc).netloc == ""


def test_recommendations_link_to_their_playbook_entry(server, web_history):
    recs = server.json("/api/runs/frag_synthetic")["diagnosis"]["recommendations"]
    assert recs and all(r["playbook"] for r in recs)
    sid = web_history.snapshot_id("frag_synthetic", "oom")
    for path in ("/runs/frag_synthetic", f"/snapshots/{sid}", "/runs/capacity"):
        code, _, page = server.get(path)
        doc = server.json("/api" + path)
        ids = [r["playbook"] for r in (doc.get("diagnosis") or doc["analysis"]["diagnosis"])["recommendations"]]
        assert code == 200 and ids
        for i in ids:
            assert f'<a href="/playbook#{i}">docs/playbook.md#{i}</a>'.encode() in page, (path, i)


def _asgi_get(app, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET through the real ASGI app, in process (the served one reads the packaged playbook;
    this one is given a placeholder of the same shape)."""
    import asyncio

    p, _, qs = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": p, "raw_path": p.encode(), "query_string": qs.encode(), "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    got: dict = {"body": b""}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(m):
        if m["type"] == "http.response.start":
            got["status"], got["headers"] = m["status"], {k.decode(): v.decode() for k, v in m["headers"]}
        elif m["type"] == "http.response.body":
            got["body"] += m.get("body", b"")

    asyncio.run(app(scope, receive, send))
    return got["status"], got["headers"], got["body"]


def test_playbook_page_renders_the_text_escaped_behind_the_token(web_history, tmp_path):
    from memq.config import load_settings
    from memq.web.app import create_app
    from tests.cli.test_playbook_cli import PLACEHOLDER

    md = tmp_path / "playbook.md"
    md.write_text(PLACEHOLDER + "\n[click](javascript:alert(1)) <img src=x onerror=alert(1)>\n\n"
                  "| setting | peak |\n|:--|--:|\n| a | 1 |\n")
    app = create_app(load_settings(web_history.env), token=TOKEN, playbook_path=md)
    assert _asgi_get(app, "/playbook")[0] == 401
    code, headers, body = _asgi_get(app, "/playbook", {"Authorization": f"Bearer {TOKEN}"})
    page = body.decode()
    assert code == 200 and "script-src 'self'" in headers["content-security-policy"]
    for entry in ("empty-cache", "allocator-settings", "expandable-segments", "kept-tensors"):
        assert f'id="{entry}"' in page  # /playbook#<id> lands on the entry
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "&lt;img src=x onerror" in page and 'href="javascript:' not in page
    assert '<td class="align-right">1</td>' in page and "style=" not in page  # the CSP refuses inline styles
    assert _asgi_get(app, "/playbook?x=1", {"Authorization": f"Bearer {TOKEN}"})[0] == 400
    missing = create_app(load_settings(web_history.env), token="", playbook_path=tmp_path / "none.md")
    code, _, body = _asgi_get(missing, "/playbook")
    assert code == 500 and b"python benchmarks/playbook.py" in body


def test_a_page_with_the_what_if_table_points_to_it_not_to_the_cli():
    # the run and snapshot pages show the what-if table under the verdict, yet a recommendation said
    # "(`memq whatif` says why)"; a page without the table keeps the CLI's pointer
    from memq.web.render import _env

    d = {"primary_cause": "fragmentation", "confidence": 0.8, "causes": [{"cause": "fragmentation",
         "confidence": 0.8, "evidence": ["e"]}], "recommendations": [{
             "action": "Set expandable_segments:True", "why": "w", "playbook": None,
             "expected_effect": "less fragmentation; memq's allocator model cannot assess expandable_segments:True "
                                "from this snapshot (`memq whatif` says why)"}]}
    macro = _env().get_template("_verdict.html").module.verdict
    assert "the what-if table below says why" in str(macro(d, False, True))
    page = str(macro(d, False, False))
    assert "`memq whatif` says why" in page and "table below" not in page
