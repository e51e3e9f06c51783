#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the tuning_db tests (used by .ci/run).
#   scripts/test_postgres.sh start   prints the server's SQLAlchemy URL (non-zero exit: none here)
#   scripts/test_postgres.sh stop    stops the server this script started and removes its files
set -euo pipefail
state=${AUTOGEN_TEST_POSTGRES_STATE:-/tmp/autogen-test-postgres.dir}
port=${AUTOGEN_TEST_POSTGRES_PORT:-55432}

bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

case ${1:-} in
  start)
    if [ -z "$(bin_dir)" ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null 2>&1
    fi
    bin=$(bin_dir)
    dir=$(mktemp -d /tmp/autogen-pg.XXXXXX)
    chown postgres "$dir"
    su postgres -s /bin/sh -c "$bin/initdb -D $dir/data -A trust -U postgres" >/dev/null
    su postgres -s /bin/sh -c "$bin/pg_ctl -D $dir/data -l $dir/server.log -w \
      -o '-k $dir -p $port -c listen_addresses=127.0.0.1 -c max_connections=200' start" >/dev/null
    echo "$dir" > "$state"
    echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
    ;;
  stop)
    [ -f "$state" ] || exit 0
    dir=$(cat "$state")
    su postgres -s /bin/sh -c "$(bin_dir)/pg_ctl -D $dir/data -w stop -m fast" >/dev/null 2>&1 || true
    rm -rf "$dir" "$state"
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
