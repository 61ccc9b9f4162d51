#!/usr/bin/env bash
# The whole test run, as README.md gives it and .ci/run calls it: install, lint, type-check, then every test
# on PostgreSQL, MySQL and the in-memory backend. Its last line is pytest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages some tests drive, installed once where missing; without them those tests fail in CI,
# naming what is missing. Chromium and its WebDriver: the dashboard's browser test. PgBouncer, Galera and
# rsync (its state transfer): the scale-out tests, which start their own bouncer and nodes. A JDK and
# jackson-core: the Jackson oracle (tests/test_transit_json_jvm.py).
packages=()
# The MySQL client library and its headers, which mysqlclient (MySQLdb, the second MySQL driver the backend runs
# on) compiles against when pip installs it below: this block runs before pip.
{ command -v pkg-config >/dev/null 2>&1 && { pkg-config --exists libmariadb || pkg-config --exists mysqlclient; }; } \
  || packages+=(pkg-config libmariadb-dev)
{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || packages+=(chromium chromium-driver)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || packages+=(pgbouncer)
[ -e /usr/lib/galera/libgalera_smm.so ] || packages+=(galera-4)
command -v rsync >/dev/null 2>&1 || packages+=(rsync)
# Patroni, etcd and HAProxy: the Patroni failover tests (tests/test_scale_patroni.py), which start their own
# cluster on free ports.
command -v patroni >/dev/null 2>&1 || packages+=(patroni)
command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || packages+=(haproxy)
# pgbench: the server's own ceiling beside the throughput benchmark (benchmarks/server_ceiling.py).
command -v pgbench >/dev/null 2>&1 || packages+=(postgresql-client)
{ command -v javac >/dev/null 2>&1 && [ -f /usr/share/java/jackson-core.jar ]; } \
  || packages+=(default-jdk-headless libjackson2-core-java)
if [ "${#packages[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing ${packages[*]}"
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
  { "${as_root[@]}" apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null; } \
    || echo "could not install them: the tests that need them fail"
  # The packages' own services would hold ports (PgBouncer 6432, etcd 2379); the tests start their own
  # bouncer, etcd and HAProxy on free ports.
  for service in pgbouncer etcd haproxy; do
    ("${as_root[@]}" systemctl disable --now "$service" || "${as_root[@]}" service "$service" stop) >/dev/null 2>&1 || true
  done
fi

venv="${PROLETARIAN_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
venv="$(cd "$venv" && pwd)"
py="$venv/bin/python"
"$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
# A wheel, not an editable install, so the check below proves the SQL files ship inside the package.
"$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps .
"$py" -m pip install --quiet --disable-pip-version-check '.[test,lint]'

# Django 6 needs Python >= 3.12 and the run above is 3.11: tests/test_django.py drives the Django test
# project (tests/django_project) in this second venv, made with pyenv's 3.12 (the same on CI's machine).
django_venv="${PROLETARIAN_DJANGO_VENV:-.venv-django}"
if [ ! -x "$django_venv/bin/python" ]; then
  base=""
  # pyenv's own 3.12 first; a pyenv shim on PATH may exist without the version it names being active,
  # so each candidate is run, not just looked up.
  for candidate in "$(pyenv root 2>/dev/null || echo /root/.pyenv)"/versions/3.1[2-9]*/bin/python \
    python3.12 python3.13; do
    if "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; then
      base="$candidate"
      break
    fi
  done
  if [ -n "$base" ]; then
    "$base" -m venv "$django_venv"
  else
    echo "no Python >= 3.12 for $django_venv: tests/test_django.py fails"
  fi
fi
if [ -x "$django_venv/bin/python" ]; then
  "$django_venv/bin/python" -m pip install --quiet --disable-pip-version-check '.[postgresql,mysql,mysqlclient,django]'
  PROLETARIAN_DJANGO_PYTHON="$(cd "$django_venv" && pwd)/bin/python"
  export PROLETARIAN_DJANGO_PYTHON
fi

eval "$(bash ci/services.sh)"


echo "== the installed wheel carries its SQL"
(cd "${TMPDIR:-/tmp}" && "$py" -c "
from proletarian_ref import sql
assert 'site-packages' in str(sql.sql_dir('mysql')), sql.sql_dir('mysql')
proletarians = {'enqueue', 'get_next_job', 'archive_job', 'delete_job', 'retry_at'}
assert proletarians <= set(sql.queries('postgresql')) & set(sql.queries('mysql'))
assert sql.read_sql_file('postgresql', 'ops.sql') and sql.read_sql_file('mysql', 'columns.sql')
")

echo "== ruff" && "$venv/bin/ruff" check . && "$venv/bin/ruff" format --check .
echo "== mypy --strict" && "$venv/bin/mypy"
echo "== benchmarks, quick mode"
# Only on the servers found above: a fresh machine with none still runs the tests (on the embedded server).
# The test extra installs the peers (pgqueuer, procrastinate), so the log shows the peer comparison and
# every library / raw ratio in the summary table at the top of the results.
bench=()
[ -n "${PROLETARIAN_TEST_PG_DSN:-}" ] && bench+=("conformance.builtin:postgresql")
[ -n "${PROLETARIAN_TEST_MYSQL_DSN:-}" ] && bench+=("conformance.builtin:mysql")
if [ "${#bench[@]}" -gt 0 ]; then
  "$py" -m benchmarks run --quick --no-progress --out "${TMPDIR:-/tmp}/proletarian-ref-bench" \
    --backends "$(IFS=,; echo "${bench[*]}")"
else
  echo "no database server here: benchmarks skipped"
fi
echo "== pytest"
# loadgroup: tests marked xdist_group (the Galera ones, which start a 3-node cluster) share one worker.
# The slowest tests, listed before the summary line (still the last line), so the cost of each class of test is in every log.
exec "$venv/bin/pytest" -n 2 --dist loadgroup -p no:cacheprovider --durations=40 "$@"
