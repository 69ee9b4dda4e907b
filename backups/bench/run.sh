#!/usr/bin/env bash
# Benchmark of `dbop-backup dump` (one stream, and --jobs 2 and 4 on one snapshot) against
# `pg_dump | zstd | rclone rcat`, the bare `pg_dump -Fc -Z0 > /dev/null` and `pg_dump -Fd -j 2`
# writing to local disk, on the same generated databases (tables of mixed sizes) and the same
# S3 server (s3s-fs on loopback); and zstd at the agent's level against gzip -6 on the same saved
# pg_dump -Z0 stream (size and CPU); and `dbop-backup restore` of the --jobs 2 backup in one
# transaction against --jobs 2 (in steps). Contenders run in rounds (one run of each per round).
# Prints markdown tables (best of RUNS by wall time, with the median wall time beside it) and
# the load average sampled before each run; see docs/benchmarks.md. Then the physical side
# (physical.sh): `base-backup` against bare pg_basebackup, WAL archiving through `wal-push`
# under pgbench, `recover` against PostgreSQL's own replay, and the RPO of a lost volume.
#
#   backups/bench/run.sh                 # sizes 1 and 4 GiB, 3 runs each, then the physical side
#   SIZES="1" RUNS=2 backups/bench/run.sh
#   LOGICAL=0 backups/bench/run.sh       # the physical side only (PHYSICAL=0: the dumps only)
#   CONTENDERS="baseline dbop dbop-j2" PHYSICAL=0 backups/bench/run.sh
#   CONTENDERS="dbop-j2 restore-1 restore-2" PHYSICAL=0 backups/bench/run.sh   # restores
#   SHAPE=skewed SIZES=1 PHYSICAL=0 backups/bench/run.sh   # one table of 80 % (sliced)
#   CONTENDERS="dbop-j2 unsplit-j2" SHAPE=skewed PHYSICAL=0 backups/bench/run.sh   # what slices bring
#
# Needs what backups/install-test-deps.sh installs. Run as root (PostgreSQL runs as `postgres`).
set -euo pipefail

SIZES=${SIZES:-"1 4"}
RUNS=${RUNS:-3}
LEVEL=${LEVEL:-1}   # the zstd level, as the agent's --compression-level (-7 … 19)
# The zstd command line's spelling of it: negative levels are --fast=N.
if ((LEVEL < 0)); then ZSTD_LEVEL="--fast=${LEVEL#-}"; else ZSTD_LEVEL="-$LEVEL"; fi
COMPRESSORS=${COMPRESSORS:-1}  # 0: skip the zstd/gzip comparison
AGENT_FLAGS=${AGENT_FLAGS:-}   # extra flags for dbop-backup dump, e.g. "--compression-threads 1"
LOGICAL=${LOGICAL:-1}          # 0: skip the dumps
# restore-N restores the backup dbop-j2 made in the same round with --jobs N (after it).
CONTENDERS=${CONTENDERS:-"baseline dbop dbop-j2 dbop-j4 dir-j2 pipeline restore-1 restore-2"}
PHYSICAL=${PHYSICAL:-1}        # 0: skip base backups, WAL archiving, recovery and RPO (physical.sh)
# The logical side's server: minimal (no WAL for rows loaded into a table its own transaction
# created, which favours a restore in one transaction) or replica (what servers with standbys
# or WAL archiving run).
LOGICAL_WAL_LEVEL=${LOGICAL_WAL_LEVEL:-minimal}
ROWS_PER_GIB=${ROWS_PER_GIB:-6300000}
# The tables' sizes: mixed (table t has t + 1 shares of the rows) or skewed (table 0 has 80 %
# of the rows, the others share the rest: one table that pg_dump cannot split).
SHAPE=${SHAPE:-mixed}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${BENCH_DIR:-/var/tmp/dbop-bench}
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PORT=${BENCH_PG_PORT:-55433}
S3PORT=${BENCH_S3_PORT:-59014}
export PATH="$HOME/.cargo/bin:$PATH"
# A CA bundle variable in the environment makes rclone refuse its (plain HTTP) transport.
unset AWS_CA_BUNDLE

log() { echo "[bench] $*" >&2; }

cd "$ROOT"
log "building dbop-backup (release)"
nice -n 19 cargo build -q --release -p dbop-backup
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
AGENT="$TARGET_DIR/release/dbop-backup"

S3_PID=
declare -A PG_PIDS=()  # data directory → the pid of the runuser that runs its server
cleanup() {
  [[ -n $S3_PID ]] && kill "$S3_PID" 2>/dev/null || true
  local data
  for data in "${!PG_PIDS[@]}"; do stop_pg "$data"; done
}
trap cleanup EXIT

# A new data directory $1 (its parent, owned by postgres, also holds the socket and the log).
init_pg() {
  mkdir -p "$(dirname "$1")" && chown postgres "$(dirname "$1")"
  runuser -u postgres -- "$PGBIN/initdb" -D "$1" -U bench --auth=trust --no-sync -E UTF8 --locale=C >/dev/null
}

# Starts PostgreSQL on data directory $1 at port $2 with the settings $3… (name=value), and
# waits until it accepts connections.
start_pg() {
  local data=$1 port=$2 setting args=()
  shift 2
  for setting in "$@"; do args+=(-c "$setting"); done
  runuser -u postgres -- "$PGBIN/postgres" -D "$data" -p "$port" -k "$(dirname "$data")" \
    "${args[@]}" >"$data.log" 2>&1 &
  PG_PIDS[$data]=$!
  for _ in $(seq 150); do "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$port" -d postgres && return; sleep 0.2; done
  tail "$data.log" >&2
  return 1
}

stop_pg() {
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$1" stop -m fast -w >/dev/null 2>&1 || true
  wait "${PG_PIDS[$1]}" 2>/dev/null || true
  unset "PG_PIDS[$1]"
}

rm -rf "$WORK" && mkdir -p "$WORK/s3/bench"
s3s-fs --host 127.0.0.1 --port "$S3PORT" --access-key bench-access --secret-key bench-secret "$WORK/s3" >/dev/null 2>&1 &
S3_PID=$!
export PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=bench

export AWS_ENDPOINT_URL=http://127.0.0.1:$S3PORT AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=bench-access AWS_SECRET_ACCESS_KEY=bench-secret AWS_EC2_METADATA_DISABLED=true
export DBOP_BACKUP_BUCKET=bench DBOP_BACKUP_PATH_STYLE=true
export RCLONE_CONFIG_BENCH_TYPE=s3 RCLONE_CONFIG_BENCH_PROVIDER=Other RCLONE_CONFIG_BENCH_ENDPOINT=$AWS_ENDPOINT_URL
export RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=bench-access RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=bench-secret
export RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE=true RCLONE_CONFIG_BENCH_REGION=us-east-1

# Generates a database of about N GiB of pg_dump output: tables of orders-like rows (ids,
# timestamps, numerics, short enums, emails, hex notes, jsonb), generated inside PostgreSQL,
# two tables at a time; at least 8 tables, of mixed sizes (table t has t + 1 shares of the rows)
# or, with SHAPE=skewed, one table of 80 % of the rows and the others of equal shares.
generate() {
  local db=$1 gib=$2 tables=$(( $2 * 4 > 8 ? $2 * 4 : 8 ))
  local shares=$(( tables * (tables + 1) / 2 )) first=1
  "$PGBIN/psql" -X -q -d postgres -c "CREATE DATABASE $db"
  local pids=()
  for ((t = 0; t < tables; t++)); do
    local rows=$(( ROWS_PER_GIB * gib * (t + 1) / shares ))
    if [[ $SHAPE == skewed ]]; then
      rows=$(( t == 0 ? ROWS_PER_GIB * gib * 4 / 5 : ROWS_PER_GIB * gib / 5 / (tables - 1) ))
    fi
    "$PGBIN/psql" -X -q -d "$db" -c "CREATE TABLE orders_$t AS SELECT i::bigint AS id,
        timestamptz '2024-01-01' + i * interval '17 seconds' AS created,
        round((random() * 10000)::numeric, 2) AS amount, (i % 97)::int AS qty,
        (ARRAY['new','paid','shipped','returned'])[1 + i % 4] AS status,
        'user' || (i % 100000) || '@example.com' AS email,
        md5(i::text) || ' ' || substr(md5((i * 7)::text), 1, 12) AS note,
        jsonb_build_object('k', i, 'tag', 'tag' || (i % 50), 'v', substr(md5(i::text), 1, 16)) AS payload
      FROM generate_series($first, $(( first + rows - 1 ))) i;
      ALTER TABLE orders_$t ADD PRIMARY KEY (id);" &
    pids+=($!)
    first=$(( first + rows ))
    if (( ${#pids[@]} == 2 )); then wait "${pids[@]}"; pids=(); fi
  done
  if (( ${#pids[@]} )); then wait "${pids[@]}"; fi
  "$PGBIN/psql" -X -q -d "$db" -c "VACUUM ANALYZE"
}

# Runs a command under GNU time; prints "wall cpu maxrss_kib".
measure() {
  local out=$WORK/time.txt
  /usr/bin/time -v -o "$out" "$@" >"$WORK/stdout.txt" 2>"$WORK/stderr.txt" || { cat "$WORK/stderr.txt" >&2; return 1; }
  awk -F': ' '
    /Elapsed \(wall clock\)/ { n = split($2, p, ":"); wall = (n == 3) ? p[1]*3600 + p[2]*60 + p[3] : p[1]*60 + p[2] }
    /User time/ { u = $2 } /System time/ { s = $2 } /Maximum resident set size/ { rss = $2 }
    END { printf "%.2f %.2f %d\n", wall, u + s, rss }' "$out"
}

median() { sort -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }'; }
best() { sort -n | head -1; }
LOADS=()
sample_load() { LOADS+=("$(cut -d' ' -f1 /proc/loadavg)"); }

# zstd at the agent's level against gzip -6, each on the same saved pg_dump -Z0 stream, to a
# file (single-threaded both, as the agent's default has one compression worker); prints
# one table row per compressor: best CPU seconds of RUNS, output size.
compressors() {
  local gib=$1 raw=$2 file=$WORK/raw.pgc
  "$PGBIN/pg_dump" -Fc -Z0 -d "$db" >"$file"
  for c in "zstd -q $ZSTD_LEVEL" "gzip -6"; do
    local cpus=() size=0
    for ((r = 1; r <= RUNS; r++)); do
      sample_load
      m=$(measure bash -c "exec $c -c '$file' > '$WORK/out.z'")
      size=$(stat -c %s "$WORK/out.z")
      read -r wall cpu rss <<<"$m"
      log "$db $c run $r: wall ${wall}s cpu ${cpu}s size $size"
      cpus+=("$cpu $wall")
    done
    read -r cpu wall <<<"$(printf '%s\n' "${cpus[@]}" | best)"
    awk -v g="$gib GiB ($raw B)" -v n="\`$c\`" -v raw="$raw" -v c="$cpu" -v w="$wall" -v s="$size" \
      'BEGIN { printf "| %s | %s | %.0f | %.1f | %.2f |\n", g, n, s / 1e6, c, raw / s }' >>"$WORK/compressors.md"
  done
  rm -f "$file" "$WORK/out.z"
}

# One run of a contender (round r); prints "wall cpu maxrss_kib stored_bytes".
run_contender() {
  local contender=$1 r=$2 m stored
  case $contender in
    baseline) m=$(measure bash -c "exec '$PGBIN/pg_dump' -Fc -Z0 -d '$db' > /dev/null"); stored=0 ;;
    dbop | dbop-j* | unsplit-j*)
      local jobs=${contender##*-j} split=()
      [[ $contender == dbop ]] && jobs=1
      # unsplit-jN: the same streams with no table sliced (1 PiB and up only).
      [[ $contender == unsplit-j* ]] && split=(--split-tables-larger-than 1048576GiB) && jobs+=-unsplit
      # shellcheck disable=SC2086
      m=$(PGDATABASE=$db measure "$AGENT" dump --prefix bench --backup-id "run$r-j$jobs" --jobs "${jobs%-unsplit}" \
        --compression-level="$LEVEL" "${split[@]}" $AGENT_FLAGS)
      stored=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["sizeBytes"])' "$WORK/stdout.txt") ;;
    dir-j*)
      rm -rf "$WORK/dir"
      m=$(measure bash -c "'$PGBIN/pg_dump' -Fd -Z0 -j '${contender#dir-j}' -d '$db' -f '$WORK/dir' && sync -f '$WORK/dir'")
      stored=$(du -sb "$WORK/dir" | cut -f1)
      rm -rf "$WORK/dir" ;;
    restore-*)
      # The backup the `dbop-j2` contender made this round, into a new database.
      local target=${db}_restored
      "$PGBIN/psql" -X -q -d postgres -c "DROP DATABASE IF EXISTS $target" -c "CREATE DATABASE $target"
      m=$(PGDATABASE=$target measure "$AGENT" restore "run$r-j2" --prefix bench --source-database "$db" \
        --database "$db" --no-globals --jobs "${contender#restore-}")
      "$PGBIN/psql" -X -q -d postgres -c "DROP DATABASE $target"
      stored=0 ;;
    pipeline)
      m=$(measure bash -o pipefail -c "'$PGBIN/pg_dump' -Fc -Z0 -d '$db' | zstd -q $ZSTD_LEVEL | rclone rcat bench:bench/pipeline/$db/run$r.pgc.zst")
      stored=$(stat -c %s "$WORK/s3/bench/pipeline/$db/run$r.pgc.zst") ;;
  esac
  echo "$m $stored"
}

# A contender's table row from its runs (one "wall cpu rss stored" line each): the best run by
# wall time, and the median wall time.
report_contender() {
  local gib=$1 raw=$2 contender=$3 runs=$4 name median_wall wall cpu rss stored
  read -r median_wall _ <<<"$(printf '%s' "$runs" | median)"
  read -r wall cpu rss stored <<<"$(printf '%s' "$runs" | best)"
  case $contender in
    baseline) name='`pg_dump -Fc -Z0 > /dev/null`' ;;
    dbop) name="\`dbop-backup dump\` (zstd level $LEVEL${AGENT_FLAGS:+ $AGENT_FLAGS})" ;;
    dbop-j*) name="\`dbop-backup dump --jobs ${contender#dbop-j}\` (zstd level $LEVEL${AGENT_FLAGS:+ $AGENT_FLAGS})" ;;
    unsplit-j*) name="\`dbop-backup dump --jobs ${contender#unsplit-j}\`, no table sliced" ;;
    dir-j*) name="\`pg_dump -Fd -Z0 -j ${contender#dir-j}\` to local disk, synced" ;;
    restore-1) name="\`dbop-backup restore\` of the --jobs 2 backup (one transaction)" ;;
    restore-*) name="\`dbop-backup restore --jobs ${contender#restore-}\` of the --jobs 2 backup (in steps)" ;;
    pipeline) name="\`pg_dump -Fc -Z0 \\\\| zstd $ZSTD_LEVEL \\\\| rclone rcat\`" ;;  # \| keeps the table whole
  esac
  awk -v g="$gib GiB ($raw B)" -v n="$name" -v raw="$raw" -v w="$wall" -v m="$median_wall" -v c="$cpu" -v r="$rss" -v s="$stored" \
    'BEGIN { printf "| %s | %s | %.0f | %.1f | %.1f | %.1f | %.1f | %s |\n", g, n, raw / w / 1e6, w, m, c, r / 1024, (s > 0 ? sprintf("%.0f", s / 1e6) : "-") }'
}

# The dumps of one size: generated, then every contender in rounds; its table rows.
logical_size() {
  local gib=$1 raw contender r m
  db=bench_${gib}g
  log "generating $db (~$gib GiB of dump)"
  generate "$db" "$gib"
  raw=$("$PGBIN/pg_dump" -Fc -Z0 -d "$db" | wc -c)   # also warms the cache
  log "$db: pg_dump -Fc -Z0 is $raw bytes"
  # Rounds: each round runs every contender once, so a change in the machine's load (it is
  # shared) falls on all of them alike.
  local -A results=()
  for ((r = 1; r <= RUNS; r++)); do
    for contender in $CONTENDERS; do
      sample_load
      m=$(run_contender "$contender" "$r")
      log "$db round $r $contender: $m"
      results[$contender]+="$m"$'\n'
    done
  done
  for contender in $CONTENDERS; do
    report_contender "$gib" "$raw" "$contender" "${results[$contender]}"
  done
  if [[ $COMPRESSORS == 1 ]]; then compressors "$gib" "$raw"; fi
  "$PGBIN/psql" -X -q -d postgres -c "DROP DATABASE $db"
  rm -rf "${WORK:?}/s3/bench/"*
}

# The logical side on its own server (wal_level $LOGICAL_WAL_LEVEL, the data in the page cache).
logical() {
  init_pg "$WORK/pg/data"
  start_pg "$WORK/pg/data" "$PORT" listen_addresses=127.0.0.1 fsync=off synchronous_commit=off \
    full_page_writes=off wal_level="$LOGICAL_WAL_LEVEL" max_wal_senders=0 shared_buffers=2GB max_wal_size=16GB
  echo "| size | contender | MB/s (raw) | wall s (best) | wall s (median) | CPU s | peak RSS MiB | stored MB |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
  : >"$WORK/compressors.md"
  local gib
  for gib in $SIZES; do logical_size "$gib"; done
  echo
  echo "| size | compressor (same pg_dump -Z0 stream) | output MB | CPU s (best) | ratio |"
  echo "|---|---|---:|---:|---:|"
  cat "$WORK/compressors.md"
  echo
  stop_pg "$WORK/pg/data"
}

if [[ $LOGICAL == 1 ]]; then logical; fi
if [[ $PHYSICAL == 1 ]]; then
  # shellcheck source=backups/bench/physical.sh
  source "$ROOT/backups/bench/physical.sh"
  physical
fi
printf 'Load average (1 min) sampled before each run: %s\n' "$(printf '%s\n' "${LOADS[@]}" | sort -n | awk '{ a[NR] = $0 } END { printf "min %s, median %s, max %s over %d samples", a[1], a[int((NR + 1) / 2)], a[NR], NR }')"
