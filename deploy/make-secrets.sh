#!/bin/sh
# Create deploy/secrets/ for deploy/compose.yaml: random passwords, the URLs built from them, and
# the Redis ACL file. Existing files are kept (rerunning does not rotate credentials).
# The agent's URL (for training jobs) is printed at the end; hand it out as a file, not on a command line.
# Host names: compose's service names by default; plain hosts name theirs (a fresh secrets/ folder,
# since existing files are kept):
#   MEMQ_REDIS_HOST=redis.example.internal MEMQ_POSTGRES_HOST=db.example.internal sh deploy/make-secrets.sh
# MEMQ_AGENT_REDIS_HOST is the Redis host as the training jobs reach it (default 127.0.0.1, the compose host).
set -eu
cd "$(dirname "$0")"
# The folder is private to its owner (0700); the files inside are readable (0644) because compose
# bind-mounts them into containers that run as uid 10001.
mkdir -p secrets
chmod 0700 secrets
umask 022
rand() { python3 -c 'import secrets; print(secrets.token_urlsafe(24))'; }
[ -f secrets/postgres_password ] || rand > secrets/postgres_password
[ -f secrets/memq_redis_password ] || rand > secrets/memq_redis_password
[ -f secrets/agent_redis_password ] || rand > secrets/agent_redis_password
[ -f secrets/grafana_admin_password ] || rand > secrets/grafana_admin_password
[ -f secrets/memq_serve_token ] || rand > secrets/memq_serve_token
PG=$(cat secrets/postgres_password)
RP=$(cat secrets/memq_redis_password)
AP=$(cat secrets/agent_redis_password)
RH=${MEMQ_REDIS_HOST:-redis}
PH=${MEMQ_POSTGRES_HOST:-postgres}
AH=${MEMQ_AGENT_REDIS_HOST:-127.0.0.1}
[ -f secrets/memq_database_url ] || echo "postgresql://memq:${PG}@${PH}:5432/memq" > secrets/memq_database_url
[ -f secrets/memq_redis_url ] || echo "redis://memq:${RP}@${RH}:6379/0" > secrets/memq_redis_url
[ -f secrets/agent_redis_url ] || echo "redis://memq-agent:${AP}@${AH}:6379/0" > secrets/agent_redis_url
sed -e "s/@MEMQ_PASSWORD@/${RP}/" -e "s/@AGENT_PASSWORD@/${AP}/" redis/users.acl.template | grep -v -e "^#" -e "^$" > secrets/users.acl
echo "secrets in $(pwd)/secrets; training jobs: MEMQ_REDIS_URL_FILE=<copy of secrets/agent_redis_url>"
