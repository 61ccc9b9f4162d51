#!/usr/bin/env bash
# The whole test run, as README.md gives it and .ci/run calls it: install, lint, type-check, then every test
# on PostgreSQL, MySQL and the in-memory backend. Its last line is pytest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."

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

# The dashboard's test drives a real headless browser: Debian's Chromium and its WebDriver.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi

eval "$(bash ci/services.sh)"

# The scale-out tests (tests/test_scale_*.py) start their own PgBouncer and Galera nodes; without these
# packages they fail in CI, naming what is missing.
scale_packages=()
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || scale_packages+=(pgbouncer)
[ -e /usr/lib/galera/libgalera_smm.so ] || scale_packages+=(galera-4)
command -v rsync >/dev/null 2>&1 || scale_packages+=(rsync)
if [ "${#scale_packages[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing ${scale_packages[*]} for the scale-out tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${scale_packages[@]}" >/dev/null
  # The package's own service would hold port 6432; the tests start their own bouncer on a free port.
  if dpkg -s pgbouncer >/dev/null 2>&1; then
    (systemctl disable --now pgbouncer || service pgbouncer stop) >/dev/null 2>&1 || true
  fi
fi

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
echo "== a JDK and jackson-core, for the Jackson oracle test (tests/test_transit_json_jvm.py)"
if ! { command -v javac >/dev/null && [ -f /usr/share/java/jackson-core.jar ]; } && command -v apt-get >/dev/null; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
  { "${as_root[@]}" apt-get update -qq && "${as_root[@]}" apt-get install -y -qq default-jdk-headless libjackson2-core-java >/dev/null; } \
    || echo "could not install them: in CI the oracle test then fails"
fi
echo "== pytest"
# loadgroup: tests marked xdist_group (the Galera ones, which start a 3-node cluster) share one worker.
exec "$venv/bin/pytest" -n 2 --dist loadgroup -p no:cacheprovider "$@"
