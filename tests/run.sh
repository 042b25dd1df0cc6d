#!/usr/bin/env bash
# The README's test command: every set-up step the tests need, then pytest. `.ci/run` calls exactly this.
# Works on a fresh machine with nothing done first: installs the package with its test extras (and the
# CPU build of torch for the agent's torch tests), checks PostgreSQL and Redis and starts them when they
# are down, installs the system tools the tests drive (Debian's chromium, openssl, systemd-analyze), and
# fails loudly, never skips, when one of them cannot be had.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[memq-tests] %s\n' "$*"; }
die() { printf '[memq-tests] FATAL: %s\n' "$*" >&2; exit 1; }

wait_for() {  # name, check command...
  local name=$1; shift
  for _ in $(seq 1 30); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  die "$name is not reachable after starting it"
}

apt_install() {  # packages...
  command -v apt-get >/dev/null || die "missing $*: install them with your package manager"
  log "installing Debian packages: $*"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null || die "cannot install $* (apt-get install -y $*)"
  fi
}

# 1. Python packages (genuine projects only; torch's CPU build comes from the local disk).
python -m pip install -q -e ".[test]" torch==2.13.0 || die "pip install failed"

# 2. System tools the tests drive.
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v openssl >/dev/null || need+=(openssl)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v redis-server >/dev/null || need+=(redis-server)
command -v pg_isready >/dev/null || need+=(postgresql-client)
command -v promtool >/dev/null || need+=(prometheus)  # promtool checks deploy/monitoring's alert rules
[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"

# 3. Services: the shared PostgreSQL and Redis (started when down; fault tests run private instances).
pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q; }
if ! pg_up; then
  log "PostgreSQL is down; starting it"
  [ -d /etc/postgresql ] || die "PostgreSQL is not installed (apt-get install -y postgresql)"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || die "cannot start PostgreSQL"
  wait_for PostgreSQL pg_up
fi
psql -h 127.0.0.1 -U postgres -d postgres -Atc 'select 1' >/dev/null || die "PostgreSQL refuses connections as postgres"
log "PostgreSQL ok"

redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; }
if ! redis_up; then
  log "Redis is down; starting it"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no || die "cannot start Redis"
  wait_for Redis redis_up
fi
log "Redis ok"

# 4. The tests, on two pytest-xdist workers (CI has two cores, and much of the suite waits on
# subprocesses and services). tests/conftest.py groups what must share a worker (see there) and
# starts the longest files first. Arguments go to pytest (e.g. `bash tests/run.sh tests/analysis -x`;
# `-n 0` runs serially). Every worker must collect the same tests in the same order, and a set
# iterated into a parametrization is ordered by the string hash seed: one seed for all the workers
# of a run (random per run unless PYTHONHASHSEED is given). The 25 slowest tests are listed, so a CI
# log shows what to speed up next.
export PYTHONHASHSEED="${PYTHONHASHSEED:-$((RANDOM + 1))}"
log "pytest, ${MEMQ_TEST_WORKERS:-2} xdist workers unless -n is given (PYTHONHASHSEED=$PYTHONHASHSEED)"
exec python -m pytest -q -n "${MEMQ_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder --durations=25 "$@"
