"""The `memq serve` application: read-only pages over the run history and the JSON API behind them.

Every page is a view of one API document: `/runs` of `/api/runs`, `/runs/R` of `/api/runs/R`
(= `memq history --run R --json`), `/snapshots/N` of `/api/snapshots/N`, `/compare` of
`/api/compare` (= `memq compare A B --json`), `/versions` of `/api/versions` (= `memq versions`),
`/reports` of `/api/reports`; `/playbook` is the packaged OOM playbook that recommendations link to
(`/playbook#<entry id>`). Handlers are plain functions run on the server's own threads, all started
before the first request (memq.web.threads says why), so a slow query never blocks the event loop.
There is no write endpoint.

Errors: unknown run/snapshot/report -> 404, a bad query parameter -> 400 with the reason, the
database down -> 503; a stored blob that cannot be decoded is reported on the snapshot page (its
stored analysis is still shown) and the server carries on.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from memq.analysis.fit import OPTIMIZER_NAMES, Question
from memq.codec import decode_turn
from memq.config import Settings, load_settings
from memq.errors import (
    BadInput,
    DecodeUnavailable,
    MemqError,
    NotFound,
    SchemaOutOfDate,
    SnapshotError,
    StorageUnavailable,
)
from memq.gpus import gpu_limit
from memq.load import decode_snapshot_bytes
from memq.model import CAUSE_NAMES as CAUSES
from memq.model import RUN_STATUSES
from memq.pipeline.fit import fit_for_run
from memq.pipeline.history import RunFilter, compare_runs, run_history, torch_versions
from memq.playbook_doc import read_playbook, to_html
from memq.render.fit_text import WEB_LIMIT_HOW, answer_line, measured_line
from memq.report.html import render_html
from memq.store.connection import open_store
from memq.store.page_queries import (
    SORTS,
    RunPage,
    list_reports,
    page_runs,
    pick_lists,
    report_row,
    run_lanes,
    snapshot_row,
)
from memq.store.sweeps import sweeps_by_sha
from memq.units import parse_size
from memq.web import params as P
from memq.web.protocol import RedactToken
from memq.web.render import render_page
from memq.web.snapshot_view import snapshot_view
from memq.web.threads import BlockingPool, StaticAssets

STATIC = Path(__file__).parent / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
# Nightly reports are self-contained HTML with an inline <style> and no script.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; frame-ancestors 'none'"
COOKIE = "memq_token"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def site_local(path: str) -> str:
    """A Location on this server for `path`: control characters and spaces (which browsers drop, so
    "/\t/evil.example" becomes "//evil.example") and leading slashes and backslashes collapse to one
    slash, and the rest is percent-encoded."""
    clean = "".join(ch for ch in path if ch.isprintable() and not ch.isspace())
    return "/" + quote(clean.lstrip("/\\"), safe="/:@!$&'()*+,;=-._~")
# the /fit form and /api/fit: the run, and `memq fit`'s options
FIT_PARAMS = ("run", "rank", "batch", "from_batch", "seq", "from_seq", "optimizer", "limit", "gpu")


class Json(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=str, separators=(",", ":")).encode()


def _status(exc: MemqError) -> int:
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, BadInput):
        return 400
    if isinstance(exc, (SchemaOutOfDate, StorageUnavailable, DecodeUnavailable)):
        return 503
    return 500


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _error(request: Request, status: int, message: str, hint: str | None = None) -> Response:
    if _wants_json(request):
        return Json({"error": message, "hint": hint, "status": status}, status_code=status)
    html = render_page("error.html", status=status, message=message, hint=hint, title=f"{status}")
    return HTMLResponse(html, status_code=status)


async def memq_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, MemqError)
    return _error(request, _status(exc), exc.message, exc.hint)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    msg = "no such page" if exc.status_code == 404 else str(exc.detail)
    return _error(request, exc.status_code, msg)


class SecurityMiddleware:
    """Bearer-token check on every route (when a token is set) and security headers on every answer.

    The token is accepted as `Authorization: Bearer T`, or from the cookie a browser gets after
    opening any page once with `?token=T` (which then redirects to the same URL without it, so the
    token does not stay in the address bar or in Referer headers)."""

    def __init__(self, app, token: str | None, allowed_hosts: str = ""):
        self.app = app
        self.token = (token or "").encode()
        named = [h.strip().lower() for h in allowed_hosts.split(",") if h.strip()]
        # Without a token, only loopback names by default: a page elsewhere that rebinds its own name to
        # 127.0.0.1 sends its name as Host, and is refused (DNS rebinding)
        self.hosts = named or ([] if self.token else list(LOOPBACK_HOSTS))

    def _host_ok(self, scope) -> bool:
        if not self.hosts:
            return True
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").strip().lower()
        if not host:
            return True  # no Host at all (HTTP/1.0, an in-process call): a browser always sends one
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if host.startswith("[") and "]" in host:
            name = host[: host.index("]") + 1]
        return any(name == h or (h.startswith("*.") and name.endswith(h[1:])) for h in self.hosts)

    def _ok(self, scope) -> tuple[bool, str | None]:
        if not self.token:
            return True, None
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer " and hmac.compare_digest(auth[7:].strip(), self.token):
            return True, None
        for part in headers.get(b"cookie", b"").split(b";"):
            k, _, v = part.strip().partition(b"=")
            if k == COOKIE.encode() and hmac.compare_digest(v, self.token):
                return True, None
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if hmac.compare_digest(query.get("token", "").encode(), self.token):
            rest = urlencode([(k, v) for k, v in parse_qsl(scope["query_string"].decode("latin-1")) if k != "token"])
            return True, site_local(scope["path"]) + (f"?{rest}" if rest else "")
        return False, None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not self._host_ok(scope):
            await send({"type": "http.response.start", "status": 421, "headers": [
                (b"content-type", b"text/plain; charset=utf-8"), *self._headers(scope)]})
            await send({"type": "http.response.body", "body": b"memq: this Host is not served here "
                        b"(MEMQ_SERVE_ALLOWED_HOSTS lists the names it answers)\n"})
            return None
        ok, redirect = self._ok(scope)
        if not ok:
            api = scope["path"].startswith("/api/")
            body = (json.dumps({"error": "a bearer token is required", "status": 401}).encode() if api else
                    b"<!doctype html><title>401</title><p>memq: a token is required (open this page with ?token=...)")
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json" if api else b"text/html; charset=utf-8"),
                (b"www-authenticate", b'Bearer realm="memq"'), *self._headers(scope)]})
            await send({"type": "http.response.body", "body": body})
            return None
        if redirect is not None:
            secure = "; Secure" if scope.get("scheme") == "https" else ""  # over TLS, never sent in clear
            cookie = (f"{COOKIE}={self.token.decode()}; Path=/; HttpOnly; SameSite=Strict{secure}").encode()
            await send({"type": "http.response.start", "status": 303, "headers": [
                (b"location", redirect.encode()), (b"set-cookie", cookie), *self._headers(scope)]})
            await send({"type": "http.response.body", "body": b""})
            return None

        started = time.perf_counter()

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                # Server-Timing: the handler's time up to the headers (queries and rendering; pages
                # are rendered whole before they start), for browsers' dev tools and the benchmark.
                took = f"app;dur={(time.perf_counter() - started) * 1000:.1f}".encode()
                message = {**message, "headers": [*message.get("headers", []), *self._headers(scope),
                                                  (b"server-timing", took)]}
            await send(message)

        return await self.app(scope, receive, send_with_headers)

    @staticmethod
    def _headers(scope) -> list[tuple[bytes, bytes]]:
        csp = REPORT_CSP if scope["path"].startswith("/reports/") else CSP
        return [(b"content-security-policy", csp.encode()), (b"x-content-type-options", b"nosniff"),
                (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY"),
                (b"cache-control", b"no-store")]


class _Views:
    """A few decoded snapshot views, by sha256 and analysis: decoding a 100,000-entry snapshot takes
    about a second, and people click around the same snapshot."""

    def __init__(self, size: int = 8):
        self.size = size
        self.items: OrderedDict[tuple, dict] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple, make) -> dict:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = make()
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


def create_app(settings: Settings | None = None, *, token: str | None = None, store=None,
               playbook_path: Path | str | None = None) -> Starlette:
    """The ASGI app over the configured history. `token` defaults to MEMQ_SERVE_TOKEN ('' = none).
    `playbook_path`: the playbook Markdown /playbook shows (default: the packaged copy; tests give one)."""
    settings = settings or load_settings()
    store = store or open_store(settings)
    token = settings.serve_token if token is None else token
    views = _Views()
    pool = BlockingPool(settings.serve_threads)
    assets = StaticAssets(STATIC)

    def query(request: Request) -> dict[str, str]:
        q = dict(request.query_params)
        q.pop("token", None)
        return q

    # ------------------------------------------------------------------ documents (the JSON API)
    def runs_doc(request: Request) -> dict:
        p = P.run_page(query(request), SORTS)
        f = RunFilter(cluster=p["cluster"], job=p["job"], torch_version=p["torch_version"], status=p["status"],
                      cause=p["cause"], since=p["since"])
        page = RunPage(filter=f, until=p["until"], sort=p["sort"], order=p["order"], limit=p["limit"],
                       offset=p["offset"], after=p["after"], before=p["before"])
        with store.session() as s:
            doc = page_runs(s, page)
        doc["filters"] = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in p.items()
                          if k in P.RUN_PARAMS and k not in ("after", "before") or k == "torch_version"}
        return doc

    def run_doc(request: Request) -> dict:
        q = query(request)
        P.check_known(q, ("rank", "points"))
        rank = P.integer(q, "rank", None, 0, 1_000_000)
        points = P.integer(q, "points", 60, 2, 1000)
        with store.session() as s:
            return run_history(s, request.path_params["name"], rank, points=points)

    def lanes_doc(request: Request) -> dict:
        q = query(request)
        P.check_known(q, ("points",))
        with store.session() as s:
            return run_lanes(s, request.path_params["name"], P.integer(q, "points", 120, 2, 1000))

    def snapshot_id(request: Request) -> int:
        raw = request.path_params["sid"]
        if not raw.isdigit() or len(raw) > 18:
            raise BadInput(f"snapshot id {raw[:40]!r} is not a number")
        return int(raw)

    def snapshot_doc(request: Request) -> dict:
        P.check_known(query(request), ())
        with store.session() as s:
            row = snapshot_row(s, snapshot_id(request))
            sweep = sweeps_by_sha(s, [row["sha256"]]).get(row["sha256"])
        analysis = row.pop("analysis")
        key = (row["sha256"], row["id"], row["analyzer_version"], row["state"])
        view = views.get(key, lambda: _snapshot_view(row, analysis))
        if sweep:  # the stored what-if sweep (memq whatif --sweep, made at ingest / by the workers)
            view = {**view, "whatif": sweep["results"],
                    "whatif_meta": {k: v for k, v in sweep.items() if k != "results"}}
        return {"snapshot": row, "analysis": analysis, "view": view}

    def _snapshot_view(row: dict, analysis: dict | None) -> dict:
        # The whole build in this thread's decode turn: another page's decode caps the process's address
        # space, and this build's analysis must not allocate inside that cap.
        with decode_turn():
            return _built_view(row, analysis)

    def _built_view(row: dict, analysis: dict | None) -> dict:
        snap, err = None, None
        try:
            raw = store.blobs.get(row["sha256"])
            snap = decode_snapshot_bytes(raw, settings.decode_max_bytes, name=row["sha256"]).snapshot
        except NotFound as exc:
            err = f"the raw snapshot is no longer stored ({exc.message}); figures below are from the stored analysis"
        except SnapshotError as exc:
            err = f"the stored snapshot cannot be read: {exc.message}"
        title = f"snapshot {row['id']} of run {row['run']} (rank {row['rank']}, {row['trigger']})"
        return snapshot_view(snap, analysis, title=title, meta=row, blob_error=err)

    def compare_doc(request: Request) -> dict:
        q = query(request)
        P.check_known(q, ("a", "b"))
        a, b = P.text(q, "a"), P.text(q, "b")
        if not a or not b:
            raise BadInput("compare needs two runs: ?a=RUN&b=RUN")
        with store.session() as s:
            return compare_runs(s, a, b)

    def fit_doc(request: Request) -> dict:
        q = query(request)
        P.check_known(q, FIT_PARAMS)
        run = P.text(q, "run")
        if not run:
            raise BadInput("fit needs a run: ?run=RUN&batch=B&from_batch=B0")
        ints = {k: P.integer(q, k, None, 1, 1 << 20) for k in ("batch", "from_batch", "seq", "from_seq")}
        limit, source = None, None
        if P.text(q, "limit") and P.text(q, "gpu"):
            raise BadInput("give a limit or a GPU, not both")
        if P.text(q, "limit"):
            limit, source = parse_size(P.text(q, "limit")), "the form's limit"
        elif P.text(q, "gpu"):
            limit, source = gpu_limit(P.text(q, "gpu"))
        question = Question(**ints, optimizer=P.choice(q, "optimizer", OPTIMIZER_NAMES), limit=limit,
                            limit_source=source)
        return fit_for_run(store, run, P.integer(q, "rank", None, 0, 1 << 16), question)

    def fit_page(request: Request) -> HTMLResponse:
        q = query(request)
        form = {k: q.get(k, "") for k in FIT_PARAMS}
        asked = any(q.get(k) for k in ("batch", "seq", "optimizer", "limit", "gpu"))
        doc = fit_doc(request) if q.get("run") else None
        # the terminal's sentences, said once (render/fit_text.py)
        words = {"answer": answer_line(doc, WEB_LIMIT_HOW).removeprefix("answer: "),
                 "measured": measured_line(doc)} if doc else {}
        return HTMLResponse(render_page("fit.html", data=None, doc=doc, form=form, asked=asked, words=words,
                                        title="fit"))

    def versions_doc(request: Request) -> dict:
        q = query(request)
        P.check_known(q, ("job",))
        job = P.text(q, "job")
        if not job:
            raise BadInput("versions needs a job: ?job=NAME")
        with store.session() as s:
            return torch_versions(s, job)

    def reports_doc(request: Request) -> dict:
        q = query(request)
        P.check_known(q, ("limit",))
        with store.session() as s:
            rows = list_reports(s, P.integer(q, "limit", 200, 1, 5000))
        return {"reports": rows, "count": len(rows)}

    def report_doc(request: Request) -> dict:
        P.check_known(query(request), ())
        raw = request.path_params["rid"]
        if not raw.isdigit() or len(raw) > 18:
            raise BadInput(f"report id {raw[:40]!r} is not a number")
        with store.session() as s:
            return report_row(s, int(raw))

    # ------------------------------------------------------------------------------ endpoints
    def blocking(fn):
        async def endpoint(request: Request) -> Response:
            return await pool.run(fn, request)
        return endpoint

    def api(fn):
        return blocking(lambda request: Json(fn(request)))

    def raw_snapshot(request: Request) -> Response:
        P.check_known(query(request), ())
        with store.session() as s:
            row = snapshot_row(s, snapshot_id(request))
        try:
            data = store.blobs.get(row["sha256"])
        except SnapshotError as exc:
            return _error(request, 500, f"the stored snapshot cannot be read: {exc.message}")
        name = f"memq-snapshot-{row['id']}-{row['sha256'][:12]}.pickle"
        return Response(data, media_type="application/octet-stream",
                        headers={"content-disposition": f'attachment; filename="{name}"'})

    def runs_page(request: Request) -> HTMLResponse:
        doc = runs_doc(request)
        return HTMLResponse(render_page("runs.html", data=None, doc=doc, causes=CAUSES, statuses=RUN_STATUSES,
                                        title="runs"))

    def run_page(request: Request) -> HTMLResponse:
        doc = run_doc(request)
        lanes = lanes_doc_for(doc["run"]["run"])
        data = {"history": doc, "lanes": lanes}
        return HTMLResponse(render_page("run.html", data=data, doc=doc, lanes=lanes, title=f"run {doc['run']['run']}"))

    def lanes_doc_for(name: str) -> dict:
        with store.session() as s:
            return run_lanes(s, name)

    def snapshot_page(request: Request) -> HTMLResponse:
        doc = snapshot_doc(request)
        return HTMLResponse(render_page("snapshot.html", data=doc["view"], view=doc["view"], row=doc["snapshot"],
                                        raw_url=f"/api/snapshots/{doc['snapshot']['id']}/raw",
                                        title=doc["view"]["title"]))

    def picks() -> dict:
        with store.session() as s:
            return pick_lists(s)

    def compare_page(request: Request) -> HTMLResponse:
        q = query(request)
        doc = compare_doc(request) if q.get("a") or q.get("b") else None
        return HTMLResponse(render_page("compare.html", data=doc, doc=doc, a=q.get("a", ""), b=q.get("b", ""),
                                        picks=picks(), title="compare"))

    def versions_page(request: Request) -> HTMLResponse:
        q = query(request)
        doc = versions_doc(request) if q.get("job") else None
        return HTMLResponse(render_page("versions.html", data=None, doc=doc, job=q.get("job", ""),
                                        picks=picks(), title="torch versions"))

    def reports_page(request: Request) -> HTMLResponse:
        doc = reports_doc(request)
        return HTMLResponse(render_page("reports.html", data=None, doc=doc, title="reports"))

    def report_html(request: Request) -> Response:
        doc = report_doc(request)
        path = Path(doc["path"] or "")
        base = Path(settings.report_dir).expanduser().resolve()
        try:
            resolved = path.expanduser().resolve()
            inside = resolved.is_relative_to(base)
            text = resolved.read_text(encoding="utf-8") if inside and doc["path"] else None
        except OSError:
            text = None
        if text is None and doc["summary"]:
            # Not on this machine's disk (a worker pod wrote it to its own volume): drawn again from
            # the stored figures, without the per-run timelines the table does not keep.
            try:
                text = render_html(doc["summary"])
            except (KeyError, TypeError, ValueError):
                text = None
        if text is None:
            raise NotFound(f"the HTML of report {doc['id']} ({doc['date']}, {doc['scope']}) is not in "
                           f"the report directory", hint=f"its figures: /api/reports/{doc['id']}")
        return HTMLResponse(text)

    def playbook_page(request: Request) -> HTMLResponse:
        """The OOM playbook (the packaged docs/playbook.md) as HTML: every recommendation on the other
        pages links to /playbook#<entry id>. The Markdown's own HTML is escaped, never passed through."""
        P.check_known(query(request), ())
        body = Markup(to_html(read_playbook(playbook_path)))  # markdown-it's own output, raw HTML escaped
        return HTMLResponse(render_page("playbook.html", data=None, body=body, title="OOM playbook"))

    async def home(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=307)

    async def health(request: Request) -> Response:
        return Json({"ok": True})

    async def static_file(request: Request) -> Response:
        found = assets.response(request.path_params["name"], request.headers.get("if-none-match"),
                                head=request.method == "HEAD")
        if found is None:
            raise HTTPException(404)
        return found

    routes = [
        Route("/", home),
        Route("/healthz", health),
        Route("/runs", blocking(runs_page)),
        Route("/runs/{name:path}", blocking(run_page)),
        Route("/snapshots/{sid}", blocking(snapshot_page)),
        Route("/compare", blocking(compare_page)),
        Route("/versions", blocking(versions_page)),
        Route("/fit", blocking(fit_page)),
        Route("/reports", blocking(reports_page)),
        Route("/reports/{rid}", blocking(report_html)),
        Route("/playbook", blocking(playbook_page)),
        Route("/api/runs", api(runs_doc)),
        Route("/api/lanes/{name:path}", api(lanes_doc)),
        Route("/api/runs/{name:path}", api(run_doc)),
        Route("/api/snapshots/{sid}/raw", blocking(raw_snapshot)),
        Route("/api/snapshots/{sid}", api(snapshot_doc)),
        Route("/api/compare", api(compare_doc)),
        Route("/api/versions", api(versions_doc)),
        Route("/api/fit", api(fit_doc)),
        Route("/api/reports", api(reports_doc)),
        Route("/api/reports/{rid}", api(report_doc)),
        Route("/static/{name}", static_file),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        pool.start()
        try:
            yield
        finally:
            pool.close()
            store.close()

    app = Starlette(routes=routes, exception_handlers={MemqError: memq_error, HTTPException: http_error},
                    lifespan=lifespan)
    app.add_middleware(SecurityMiddleware, token=token, allowed_hosts=settings.serve_allowed_hosts)
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactToken) for f in access.filters):
        access.addFilter(RedactToken())
    return app


def app_from_env() -> Starlette:
    """Factory for `uvicorn --factory` and for several worker processes (settings from the env)."""
    return create_app()
