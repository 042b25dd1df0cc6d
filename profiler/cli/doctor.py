"""`memq doctor [--strict] [--json]`: is this deployment healthy, and what to do when it is not.

Checks, in order (each prints one line, and a `fix:` line when something is wrong):
- config      the settings load (environment, config file, `*_FILE` secrets)
- database    reachable; schema at this memq's revision (the embedded SQLite default migrates itself)
- partitions  PostgreSQL: stat_samples has day partitions ahead (else a warning: the dispatchers or
              `memq gc` make them); how many samples sit in the default partition
- redis       reachable (PING)
- memory      maxmemory-policy: an evicting policy (allkeys-*, volatile-*: blobs carry TTLs) is a
              warning; memory use near maxmemory is a warning
- persistence AOF or RDB snapshots on; none is a warning (a restart loses the stream and queues), and
              so is a failing AOF/RDB write
- broker      the Celery broker, when MEMQ_BROKER_URL names another Redis
- stream      consumer-group lag and pending entries of the ingest stream (a warning above
              MEMQ_DOCTOR_MAX_LAG, and above half of MEMQ_STREAM_MAXLEN: unread entries get trimmed);
              dead letters (shown); acknowledged entries piling up (the beat's stream trim is
              not running) is a warning
- stream-limits  the stream near its limits: length near MEMQ_STREAM_MAXLEN (warning), entries
              removed before any dispatcher read them (lag above the length: a trim such as
              `XADD ... MAXLEN 0`, warning), a last ID ahead of the clock (an explicit ID was
              given, warning) or at the end of the ID space (every XADD fails: error)
- pending     entries stuck in the pending list: idle for longer than 5 x MEMQ_CLAIM_IDLE_S (at least
              5 minutes: no dispatcher takes them over), or delivered more than MEMQ_MAX_DELIVERIES
              times and still there (a poison entry nobody dead-letters); warnings
- workers     live worker and dispatcher heartbeats; none is a warning
- blobs       the blob store directory is writable
Errors (a dependency unreachable, the schema out of date, the blob store not writable, bad settings)
exit non-zero with memq.errors' codes: 3 when the only errors are schema errors, 2 for bad
settings, else 1. Warnings exit 0, or 1 with `--strict`. Passwords in URLs are always masked.
Redis facts come from INFO (works where CONFIG is disabled, as on managed Redis); persistence falls
back to CONFIG GET save, and says so when it cannot tell.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from dataclasses import asdict, dataclass, field

import click
import redis

from memq.config import load_settings, redact_url
from memq.errors import (
    EXIT_BAD_INPUT,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_SCHEMA,
    ConfigError,
    MemqError,
    SchemaOutOfDate,
    StorageError,
)
from memq.redis_client import make_client
from memq.redis_functions import doctor_checks
from memq.render.safe import safe_text
from memq.store import partitions, schema
from memq.store.blobs import BlobStore
from memq.store.db import is_sqlite, make_engine
from memq.workers.retention import trim_floor
from memq.workers.runtime import GROUP

OK, INFO, WARN, ERROR = "ok", "info", "warning", "error"
EVICTING = ("allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random",
            "volatile-ttl")


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None
    data: dict = field(default_factory=dict)
    #: exit code this error stands for (errors only)
    code: int = EXIT_ERROR


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


# ------------------------------------------------------------------------------------------ checks


def check_database(st) -> list[Check]:
    where = redact_url(st.database_url)
    engine = make_engine(st.database_url)
    try:
        try:
            current = schema.current_revision(engine)
        except MemqError as exc:
            return [Check("database", ERROR, exc.message if where in exc.message else f"{where}: {exc.message}",
                          "start the database or fix MEMQ_DATABASE_URL (or MEMQ_DATABASE_URL_FILE); "
                          "check network, credentials and that the database exists")]
        head = schema.head_revision()
        data = {"url": where, "revision": current, "head": head}
        reach = Check("database", OK, f"{where} reachable", data=data)
        if current == head:
            return [reach, Check("schema", OK, f"revision {head} (current)", data=data), *check_partitions(engine)]
        if is_sqlite(st.database_url) and (current is None or current in schema._script_heads()[1]):
            return [reach, Check("schema", INFO, f"revision {current or 'none'}; the embedded SQLite database "
                                 f"migrates itself to {head} on first use", data=data)]
        try:
            schema.verify_schema(engine)
        except SchemaOutOfDate as exc:
            fix = exc.hint or "run `memq db upgrade`"
            if fix.startswith("run "):
                fix = fix[4:]
            return [reach, Check("schema", ERROR, exc.message, f"run {fix}" if fix.startswith("`") else fix,
                                 data=data, code=EXIT_SCHEMA)]
        return [reach]
    finally:
        engine.dispose()


def check_partitions(engine) -> list[Check]:
    """PostgreSQL: stat_samples' day partitions exist ahead (the dispatchers make them hourly)."""
    found = partitions.health(engine, dt.datetime.now(dt.UTC).date())
    if found is None:
        return []
    ahead, stray = found["ahead"], found["default_rows_estimate"]
    data = {"days_ahead": len(ahead), "default_partition_rows_estimate": int(stray)}
    extra = f"; about {stray} samples in the default partition (deleted row by row)" if stray else ""
    if not ahead:
        return [Check("partitions", WARN, f"stat_samples has no partition for tomorrow (UTC){extra}",
                      "run `memq gc` (it makes them a week ahead) and check that a dispatcher runs "
                      "(it makes them hourly); meanwhile samples land in the default partition", data=data)]
    return [Check("partitions", OK, f"stat_samples partitioned by day, {len(ahead)} days ahead{extra}", data=data)]


def _redis_client(st):
    return make_client(st.redis_url, 5)


def check_redis(st) -> tuple[list[Check], object | None]:
    where = redact_url(st.redis_url)
    try:
        r = _redis_client(st)
        r.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        return [Check("redis", ERROR, f"{where} unreachable: {type(exc).__name__}: {redact_url(str(exc))}",
                      "start Redis or fix MEMQ_REDIS_URL (or MEMQ_REDIS_URL_FILE): host, port, password, "
                      "rediss:// for TLS")], None
    checks = []
    try:
        info = r.info("server")
        checks.append(Check("redis", OK, f"{where} reachable (Redis {info.get('redis_version', '?')})",
                            data={"url": where, "version": info.get("redis_version")}))
    except redis.RedisError:
        checks.append(Check("redis", OK, f"{where} reachable", data={"url": where}))
    return checks, r


def check_broker(st) -> list[Check]:
    """The Celery broker, when it is not the same Redis (MEMQ_BROKER_URL)."""
    if not st.broker_url or st.broker_url == st.redis_url:
        return []
    where = redact_url(st.broker_url)
    try:
        make_client(st.broker_url, 5).ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        return [Check("broker", ERROR, f"{where} unreachable: {type(exc).__name__}: {redact_url(str(exc))}",
                      "start it or fix MEMQ_BROKER_URL (or MEMQ_BROKER_URL_FILE)")]
    return [Check("broker", OK, f"{where} reachable", data={"url": where})]


def check_memory(r) -> list[Check]:
    try:
        mem = r.info("memory")
    except redis.RedisError as exc:
        return [Check("memory", WARN, f"cannot read INFO memory: {exc}", "grant the memq admin user INFO")]
    policy = _text(mem.get("maxmemory_policy", "unknown"))
    used, cap = int(mem.get("used_memory", 0)), int(mem.get("maxmemory", 0))
    data = {"maxmemory_policy": policy, "used_memory": used, "maxmemory": cap}
    out = []
    if policy in EVICTING:
        out.append(Check("memory", WARN, f"maxmemory-policy {policy}: Redis may evict stream entries, "
                         "snapshot blobs (they carry TTLs) and Celery queues when full",
                         "set `maxmemory-policy noeviction` (redis.conf or CONFIG SET); agents then spool "
                         "to disk instead of losing data", data=data))
    else:
        out.append(Check("memory", OK, f"maxmemory-policy {policy}, {used} bytes used"
                         + (f" of {cap}" if cap else " (no maxmemory)"), data=data))
    if cap and used > 0.8 * cap:
        out.append(Check("memory-use", WARN, f"{used} of {cap} bytes used ({100 * used / cap:.0f}%)",
                         "raise maxmemory, add dispatchers/workers to drain the backlog, or lower "
                         "MEMQ_STREAM_MAXLEN", data=data))
    return out


def check_persistence(r) -> list[Check]:
    try:
        pers = r.info("persistence")
    except redis.RedisError as exc:
        return [Check("persistence", WARN, f"cannot read INFO persistence: {exc}", "grant the memq admin user INFO")]
    aof = int(pers.get("aof_enabled", 0)) == 1
    save = None
    try:
        save = _text(r.config_get("save").get("save", ""))
    except redis.RedisError:
        pass
    data = {"aof_enabled": aof, "save": save}
    for key in ("aof_last_write_status", "aof_last_bgrewrite_status", "rdb_last_bgsave_status"):
        if _text(pers.get(key, "ok")) != "ok" and (aof or key.startswith("rdb")):
            return [Check("persistence", WARN, f"{key} is {_text(pers.get(key))}: Redis cannot write its "
                          "persistence files", "check the Redis data volume (space, permissions) and its log",
                          data=data)]
    if aof:
        return [Check("persistence", OK, "AOF on" + (f", RDB save '{save}'" if save else ""), data=data)]
    if save:
        return [Check("persistence", OK, f"RDB snapshots (save '{save}'), AOF off: a crash loses the writes "
                      "since the last snapshot", data=data)]
    why = "no AOF and no RDB save points" if save is not None else \
        "no AOF; RDB save points unknown (CONFIG GET refused)"
    return [Check("persistence", WARN, f"{why}: a Redis restart loses the ingest stream, its pending entries "
                  "and the Celery queues",
                  "enable AOF: `appendonly yes` and `appendfsync everysec` (deploy/compose.yaml does)", data=data)]


def check_stream(r, st) -> list[Check]:
    data: dict = {"key": st.stream_key}
    try:
        if not r.exists(st.stream_key):
            return [Check("stream", INFO, f"{st.stream_key} does not exist yet (no agent has sent anything)",
                          data=data)]
        data["length"] = int(r.xlen(st.stream_key))
        groups = r.xinfo_groups(st.stream_key)
        dead = int(r.xlen(st.dead_letter_key))
    except redis.RedisError as exc:
        return [Check("stream", WARN, f"cannot read {st.stream_key}: {exc}", "grant the memq admin user XINFO/XLEN")]
    data["dead_letters"] = dead
    g = next((x for x in groups if _text(x.get("name")) == GROUP), None)
    out = []
    if g is None:
        out.append(Check("stream", WARN, f"{st.stream_key}: {data['length']} entries and no consumer group "
                         f"{GROUP}: no dispatcher has read it", "start `memq dispatcher`", data=data))
    else:
        lag = g.get("lag")
        pending = int(g.get("pending", 0))
        data.update(lag=lag, pending=pending, consumers=int(g.get("consumers", 0)))
        line = f"{st.stream_key}: {data['length']} entries, lag {lag if lag is not None else '?'}, {pending} pending"
        if lag is not None and int(lag) > st.stream_maxlen // 2:
            out.append(Check("stream", WARN, line + f": over half of MEMQ_STREAM_MAXLEN ({st.stream_maxlen}); "
                             "XADD MAXLEN trims the oldest entries even when no dispatcher has read them",
                             "start more dispatchers now; raise MEMQ_STREAM_MAXLEN (and Redis maxmemory)",
                             data=data))
        elif lag is not None and int(lag) > st.doctor_max_lag:
            out.append(Check("stream", WARN, line + f" (over MEMQ_DOCTOR_MAX_LAG {st.doctor_max_lag})",
                             "start more dispatchers (`memq dispatcher`) and workers; check `memq status`",
                             data=data))
        else:
            out.append(Check("stream", OK, line, data=data))
        out += check_stream_limits(r, st, data["length"], g)
        out += check_pending(r, st)
        out += _check_trim(r, st)
    if dead:
        out.append(Check("dead-letters", INFO, f"{dead} entries in {st.dead_letter_key}; `memq status` shows "
                         "the latest reasons", data={"count": dead}))
    return out


#: Stream IDs are two unsigned 64-bit numbers, <ms>-<seq>.
ID_MAX = 2**64 - 1


def check_stream_limits(r, st, length: int, group: dict) -> list[Check]:
    """Length against MEMQ_STREAM_MAXLEN, entries lost unread (added to the stream, never read by
    the group, and no longer in it), and the last ID against the clock and the end of the ID space."""
    try:
        info = r.xinfo_stream(st.stream_key)
    except redis.RedisError as exc:
        return [Check("stream-limits", WARN, f"cannot read XINFO STREAM {st.stream_key}: {exc}",
                      "grant the memq admin user XINFO")]
    last = _text(info.get("last-generated-id") or "0-0")
    try:
        ms, seq = (int(x) for x in last.split("-"))
    except ValueError:
        ms, seq = 0, 0
    now_ms = int(time.time() * 1000)
    added, read = info.get("entries-added"), group.get("entries-read")
    if read is None and _text(group.get("last-delivered-id") or "") == "0-0":
        read = 0  # the group has read nothing yet
    unread = None if added is None or read is None else int(added) - int(read)
    data = {"length": length, "maxlen": st.stream_maxlen, "last_id": last, "unread": unread}
    out = []
    if ms == ID_MAX and ID_MAX - seq < 2**32:
        out.append(Check("stream-limits", ERROR, f"{st.stream_key}: last ID {last} is at the end of the ID space "
                         f"({ID_MAX - seq} IDs left): every further XADD fails and agents can only spool",
                         "stop the writer that set explicit IDs, let the dispatchers drain the stream (`memq "
                         "status`), then DEL it (the next XADD starts at the clock; the dispatcher recreates "
                         "its group); see deploy/SECURITY.md", data=data))
    elif ms > now_ms + 1000 * st.max_clock_skew_s:
        out.append(Check("stream-limits", WARN, f"{st.stream_key}: last ID {last} is {(ms - now_ms) // 1000} s "
                         "ahead of this clock: someone gave an explicit ID; new entries get IDs after it",
                         "find the writer (the agent user cannot set IDs through its function); drain and "
                         "DEL the stream if the ID space is running out", data=data))
    if st.stream_maxlen and length > 0.9 * st.stream_maxlen:
        out.append(Check("stream-limits", WARN,
                         f"{st.stream_key}: {length} entries, {100 * length // st.stream_maxlen}% "
                         f"of MEMQ_STREAM_MAXLEN ({st.stream_maxlen}): the agents' next XADDs trim the oldest "
                         "entries, read or not", "start more dispatchers, check the stream trim (beat), or raise "
                         "MEMQ_STREAM_MAXLEN with Redis maxmemory", data=data))
    if unread is not None and unread > length:
        out.append(Check("stream-limits", WARN, f"{st.stream_key}: {unread} entries were never read by {GROUP} but "
                         f"only {length} are left: {unread - length} entries were removed before any dispatcher "
                         "read them (a trim such "
                         "as XADD MAXLEN 0, or XDEL)", "check who can write the stream with trim options "
                         "(deploy/SECURITY.md); the agents of that period lost those messages", data=data))
    return out


def check_pending(r, st) -> list[Check]:
    """Pending entries nobody takes over, and entries past MEMQ_MAX_DELIVERIES still pending."""
    stuck_ms = 1000 * max(300, 5 * st.claim_idle_s)
    try:
        oldest = r.xpending_range(st.stream_key, GROUP, min="-", max="+", count=1000)
    except redis.RedisError as exc:
        return [Check("pending", WARN, f"cannot read XPENDING {st.stream_key}: {exc}",
                      "grant the memq admin user XPENDING")]
    stuck = [p for p in oldest if int(p["time_since_delivered"]) >= stuck_ms]
    worn = [p for p in oldest if int(p["times_delivered"]) > st.max_deliveries]

    def desc(p) -> str:
        return (f"{_text(p['message_id'])} (consumer {_text(p['consumer'])[:60]!r}, idle "
                f"{int(p['time_since_delivered']) // 1000} s, delivered {int(p['times_delivered'])} times)")

    out = []
    if worn:
        out.append(Check("pending", WARN, f"{len(worn)} pending entries were delivered more than MEMQ_MAX_DELIVERIES "
                         f"({st.max_deliveries}) times and are still not dead-lettered, e.g. {desc(worn[0])}",
                         "run a current `memq dispatcher` (it dead-letters them); if they stay, each crashes "
                         "the dispatcher: see its log", data={"entries": [_text(p["message_id"]) for p in worn[:20]]}))
    if stuck:
        out.append(Check("pending", WARN, f"{len(stuck)} pending entries idle for over {stuck_ms // 1000} s: no "
                         f"dispatcher takes them over, e.g. {desc(stuck[0])}",
                         "start `memq dispatcher` (same MEMQ_REDIS_URL and MEMQ_STREAM); a dispatcher that "
                         "runs but leaves them is stuck on them: see its log",
                         data={"entries": [_text(p["message_id"]) for p in stuck[:20]]}))
    if not out and oldest:
        out.append(Check("pending", OK, f"{len(oldest)} pending entries, none stuck", data={"count": len(oldest)}))
    return out


def _check_trim(r, st) -> list[Check]:
    """An entry the periodic trim should have removed three periods ago is still there: it is not running."""
    if st.stream_trim_interval_s <= 0:
        return []
    overdue = trim_floor(r, st.stream_key, st.stream_keep_s + 3 * st.stream_trim_interval_s)
    first = r.xrange(st.stream_key, count=1)
    if overdue is None or not first:
        return []
    fid = _text(first[0][0])
    if tuple(map(int, fid.split("-"))) < tuple(map(int, overdue.split("-"))):
        return [Check("stream-trim", WARN, f"{st.stream_key} still holds acknowledged entries older than "
                      f"MEMQ_STREAM_KEEP_S + 3 trim periods (oldest {fid}): the periodic trim "
                      "(workers.retention.trim_stream) is not running",
                      "run exactly one beat (`celery -A memq.workers.app beat`) and a worker on memq.ingest",
                      data={"oldest": fid, "overdue_below": overdue})]
    return []


def check_heartbeats(r, st) -> list[Check]:
    now = time.time()
    seen: dict[str, list[dict]] = {"worker": [], "dispatcher": []}
    try:
        for key in r.scan_iter(match=f"{st.key_prefix}heartbeat:*", count=1000):
            try:
                info = json.loads(r.get(key) or b"{}")
            except ValueError:
                continue
            kind = "worker" if info.get("kind") == "worker" else "dispatcher"
            seen[kind].append({"name": info.get("name"), "host": info.get("host"),
                               "age_s": round(now - float(info.get("last", now)), 1)})
    except redis.RedisError as exc:
        return [Check("workers", WARN, f"cannot read heartbeats: {exc}", "grant the memq admin user SCAN/GET")]
    out = []
    for kind, cmd in (("worker", "memq worker"), ("dispatcher", "memq dispatcher")):
        items = seen[kind]
        if items:
            names = ", ".join(sorted(str(i["name"]) for i in items)[:5])
            out.append(Check(kind + "s", OK, f"{len(items)} live: {names}", data={"live": items}))
        else:
            out.append(Check(kind + "s", WARN, f"no live {kind} heartbeat under {st.key_prefix}heartbeat:{kind}:*",
                             f"start `{cmd}` (same MEMQ_REDIS_URL and MEMQ_KEY_PREFIX as this shell)",
                             data={"live": []}))
    return out


def check_blobs(st) -> list[Check]:
    try:
        BlobStore(st.blob_dir).check_writable()
    except StorageError as exc:
        return [Check("blobs", ERROR, exc.message, f"create {st.blob_dir} and make it writable by the memq "
                      "user, or point MEMQ_BLOB_DIR at a writable volume")]
    return [Check("blobs", OK, f"{st.blob_dir} writable", data={"dir": st.blob_dir})]


def run_checks(st) -> list[Check]:
    checks = check_database(st)
    rchecks, r = check_redis(st)
    checks += rchecks
    if r is not None:
        checks += check_memory(r) + check_persistence(r) + check_stream(r, st) + check_heartbeats(r, st)
        checks += [Check(*c) for c in doctor_checks(r, st)]  # the agents' inbox relay
    checks += check_broker(st) + check_blobs(st)
    return checks


def exit_code(checks: list[Check], strict: bool) -> int:
    errors = [c for c in checks if c.status == ERROR]
    if errors:
        codes = {c.code for c in errors}
        return codes.pop() if len(codes) == 1 else EXIT_ERROR
    if strict and any(c.status == WARN for c in checks):
        return EXIT_ERROR
    return EXIT_OK


# --------------------------------------------------------------------------------------- command


@click.command()
@click.option("--strict", is_flag=True, help="Warnings also exit non-zero (1).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def doctor(strict: bool, as_json: bool) -> None:
    """Check the database, Redis, stream, workers and blob store; print a fix for each problem."""
    try:
        st = load_settings()
        checks = [Check("config", OK, "settings loaded")]
    except ConfigError as exc:
        checks = [Check("config", ERROR, exc.message, exc.hint or "fix the variable or config file named above",
                        code=EXIT_BAD_INPUT)]
        st = None
    if st is not None:
        checks += run_checks(st)
    code = exit_code(checks, strict)
    summary = {"errors": sum(c.status == ERROR for c in checks), "warnings": sum(c.status == WARN for c in checks)}
    if as_json:
        doc = {"ok": code == EXIT_OK, "strict": strict, "exit_code": code, **summary,
               "checks": [{k: v for k, v in asdict(c).items() if k != "code"} for c in checks]}
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            click.echo(f"{c.status.upper():7} {c.name:{width}}  {safe_text(c.detail)}")  # may quote Redis data
            if c.fix and c.status in (WARN, ERROR):
                click.echo(f"{'':7} {'':{width}}  fix: {safe_text(c.fix)}")
        verdict = "healthy" if not summary["errors"] and not summary["warnings"] else \
            f"{summary['errors']} error(s), {summary['warnings']} warning(s)"
        click.echo(f"memq doctor: {verdict}" + (" (--strict)" if strict and code else ""))
    sys.stdout.flush()
    if code:
        sys.exit(code)
