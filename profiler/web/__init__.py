"""`memq serve` and `memq view`: the run history and a snapshot in a browser.

Why Starlette on uvicorn: the app is a dozen read-only routes that render server-side HTML and
JSON; Starlette is a small, long-maintained ASGI toolkit (Encode, BSD) with routing, static files
and exception handlers and nothing else to pull in (no pydantic, no ORM); plain-function handlers
run in its thread pool, so the synchronous SQLAlchemy queries the CLI already uses are reused as they
are. uvicorn is the production ASGI server most deployments of Starlette/FastAPI run (graceful
shutdown, proxy headers, several worker processes). FastAPI would add request models and OpenAPI
that a read-only app whose API mirrors the CLI's `--json` does not need; Flask/WSGI would need a
second server (gunicorn) for the same result. Templates are Jinja2, already a dependency.

Modules: `app` (routes, errors, token check), `queries` (reads beyond memq.pipeline.history),
`params` (query-string validation), `snapshot_view` (pure: what the snapshot page draws), `render`
(templates; inline mode for `memq view`). The browser code is profiler/web/static/memq.js, written
for memq (no vendored library, nothing from a CDN).
"""
