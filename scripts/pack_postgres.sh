#!/usr/bin/env bash
# Pack a PostgreSQL server that runs from one folder, for a machine that has none (the GPU machine
# of scripts/bench_scale_out.sh): postgres, initdb and pg_ctl, the files initdb needs, the shared
# libraries they load that a bare machine may lack, and psycopg's wheels (it bundles libpq).
#   scripts/pack_postgres.sh [DIR]      (default .pg; git-ignored: the repository's .gitignore)
# Then, on the other machine:  DIR/pg.sh start DATA_DIR PORT   and   DIR/pg.sh stop DATA_DIR
# (pg.sh unpacks DIR/server.tar.xz into $PG_UNPACKED, default /tmp/autogen-pg-server, once).
# The layout mirrors Debian's (lib/postgresql/15/{bin,lib}, share/postgresql/15): PostgreSQL finds
# its share and lib folders relative to its binaries, so the folder may be moved anywhere.
# Needs PostgreSQL 15 installed here (/usr/lib/postgresql/15) and pip for the wheels.
set -euo pipefail
dir=$(realpath -m "${1:-.pg}")
version=${PG_VERSION:-15}
src=/usr/lib/postgresql/$version
[ -x "$src/bin/postgres" ] || { echo "no PostgreSQL $version in $src" >&2; exit 1; }
rm -rf "$dir"
# The server goes in DIR/server.tar.xz (ICU's data alone is 30 MiB unpacked); pg.sh unpacks it.
server=$(mktemp -d)
trap 'rm -rf "$server"' EXIT
mkdir -p "$dir/wheels"
cd "$server"
mkdir -p "lib/postgresql/$version/bin" "lib/postgresql/$version/lib" share/postgresql so
cp "$src"/bin/{postgres,initdb,pg_ctl} "lib/postgresql/$version/bin/"
# initdb loads plpgsql and the snowball dictionaries into template1.
cp "$src"/lib/{plpgsql.so,dict_snowball.so} "lib/postgresql/$version/lib/"
cp -r /usr/share/postgresql/$version share/postgresql/
# Extensions' scripts but plpgsql's (initdb installs it), the manual pages, contrib.
rm -rf "share/postgresql/$version"/{man,contrib}
find "share/postgresql/$version/extension" -type f ! -name 'plpgsql*' -delete
# The shared libraries, but the C library's own (the other machine's glibc must be as new) and
# the C++ runtime's (CUDA machines have theirs).
for binary in lib/postgresql/$version/bin/* lib/postgresql/$version/lib/*.so; do
  ldd "$binary" | awk '/=> \//{print $3}'
done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' | while read -r so; do
  cp -L "$so" so/
done
XZ_OPT="-6 -T0" tar -cJf "$dir/server.tar.xz" .
cd - >/dev/null
cat > "$dir/pg.sh" <<'EOF'
#!/usr/bin/env bash
# DIR/pg.sh start DATA PORT: a throwaway server on 127.0.0.1:PORT (trust, user postgres),
# prints its SQLAlchemy URL; DIR/pg.sh stop DATA. Run as root: the server runs as `nobody`
# where this is root (PostgreSQL refuses root), else as the caller.
set -euo pipefail
pack=$(cd "$(dirname "$0")" && pwd)
here=${PG_UNPACKED:-/tmp/autogen-pg-server}
[ -x "$here/so" ] || { mkdir -p "$here" && tar -xJf "$pack/server.tar.xz" -C "$here" && chmod -R a+rX "$here"; }
bin=$(ls -d "$here"/lib/postgresql/*/bin | head -n 1)
export LD_LIBRARY_PATH=$here/so${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
as() { if [ "$(id -u)" = 0 ]; then su -s /bin/sh nobody -c "LD_LIBRARY_PATH=$LD_LIBRARY_PATH TZ=UTC $*"; else sh -c "TZ=UTC $*"; fi; }
case ${1:-} in
  start)
    data=$2 port=$3
    mkdir -p "$data" && { [ "$(id -u)" != 0 ] || chown nobody "$data"; }
    as "$bin/initdb -D $data/db -A trust -U postgres -E UTF8 --locale=C" >"$data/initdb.log" 2>&1 || { cat "$data/initdb.log" >&2; exit 1; }
    as "$bin/pg_ctl -D $data/db -l $data/server.log -w -o '-k $data -p $port -c listen_addresses=127.0.0.1 -c max_connections=400' start" >/dev/null \
      || { cat "$data/server.log" >&2; exit 1; }
    echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres" ;;
  stop) as "$bin/pg_ctl -D $2/db -w stop -m fast" >/dev/null 2>&1 || true ;;
  *) echo "usage: $0 start DATA PORT | stop DATA" >&2; exit 2 ;;
esac
EOF
chmod +x "$dir/pg.sh"
# psycopg for the Python of the other machine (PY_TAG, default cp312): the wheels bundle libpq.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
  --platform manylinux2014_x86_64 -d "$dir/wheels" "psycopg==${PSYCOPG_VERSION:-3.3.2}" \
  "psycopg-binary==${PSYCOPG_VERSION:-3.3.2}" "typing_extensions" >/dev/null
du -sh "$dir"
