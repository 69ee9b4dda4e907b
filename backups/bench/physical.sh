# The physical side of `make bench-backup`, sourced by run.sh (its settings, S3 server,
# `measure`, `best`, `median`, `sample_load`, `generate`, `init_pg`, `start_pg`, `stop_pg`):
#
# 1. `dbop-backup base-backup` (its own connection, the server's zstd → S3 multipart, then its
#    record; with 2 server workers; and through pg_basebackup, zstd in the agent) against
#    pg_basebackup with the agent's flags, in rounds, on one instance (orders-like tables of
#    PHYS_GIB plus pgbench's at PGBENCH_SCALE), five ways: writing to /dev/null itself (what
#    the server sends, nothing kept); read through a pipe by `cat > /dev/null`; writing its tar
#    to a local directory and syncing it (what pg_basebackup alone keeps); the server's zstd as
#    the agent asks for it, to a local directory (the agent's floor without an S3 server); and
#    the hand-made equivalent of the agent before, `| zstd -1 -T1 | rclone rcat` to the same S3
#    server;
# 2. WAL archiving through `wal-push` (archive_command, its S3 key in files) while pgbench's
#    TPC-B-like script runs: WAL generated against archived, the rate, the `.ready` backlog
#    sampled every second, the time to drain it after the run;
# 3. `dbop-backup recover` to the latest point (the last base backup of 1 plus the WAL of 2)
#    against the same base backup's tar unpacked by hand plus the same WAL, uncompressed, in a
#    local directory (`restore_command = 'cp …'`), PostgreSQL replaying to the end;
# 4. the RPO of a lost volume: steady commits on a small new instance with archive_timeout,
#    every process of the server killed (-9) and its data directory deleted, `recover` from the
#    bucket, then the newest commit present against the last acknowledged one.
#
# PHYS_GIB=0 PGBENCH_SCALE=5 PGBENCH_SECONDS=10 RPO_TRIALS=1 RUNS=1 LOGICAL=0 run.sh: a smoke run.
# shellcheck shell=bash
# shellcheck disable=SC2016,SC2153  # backquotes are markdown; AGENT, RUNS, WORK… are run.sh's

PHYS_GIB=${PHYS_GIB:-1}                  # orders-like tables (GiB of dump) in the instance
PHYS_BASE_ONLY=${PHYS_BASE_ONLY:-0}      # 1: part 1 only (the base backups)
PGBENCH_SCALE=${PGBENCH_SCALE:-50}       # pgbench -i -s (50: ~750 MB)
PGBENCH_CLIENTS=${PGBENCH_CLIENTS:-8}
PGBENCH_SECONDS=${PGBENCH_SECONDS:-60}
WAL_PARALLEL=${WAL_PARALLEL:-4}          # wal-push --wal-parallel (the product's default)
RESTORE_RUNS=${RESTORE_RUNS:-$RUNS}
RPO_TRIALS=${RPO_TRIALS:-3}
ARCHIVE_TIMEOUT=${ARCHIVE_TIMEOUT:-10}   # seconds (the product's minimum; its default is 60)
RPO_SECONDS=${RPO_SECONDS:-25}           # commits before the kill (plus 0 … ARCHIVE_TIMEOUT-1 s)
RPO_MARGIN=${RPO_MARGIN:-2}              # seconds allowed past archive_timeout: one upload
PHYS_PORT=${BENCH_PHYS_PORT:-55434}
PHYS_DB=bench_phys
PHYS_DATA=$WORK/phys/data
SEGMENT=$((16 << 20))

# The agent where PostgreSQL (user postgres) can run it, and `agent.sh`, which runs it with
# this S3 server's settings, the key in files: nothing secret on a command line or in
# PostgreSQL's environment (as backups/tests/base.rs does); `recover` connects as bench.
agent_script() {
  local dir=$WORK/agent
  mkdir -p "$dir" && chmod 755 "$dir"
  cp "$AGENT" "$dir/dbop-backup"
  printf %s "$AWS_ACCESS_KEY_ID" >"$dir/access-key-id"
  printf %s "$AWS_SECRET_ACCESS_KEY" >"$dir/secret-access-key"
  cat >"$dir/agent.sh" <<EOF
#!/bin/sh
exec env -i PATH=/usr/bin:/bin AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL AWS_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true PGUSER=bench DBOP_BACKUP_BUCKET=bench DBOP_BACKUP_PATH_STYLE=true DBOP_BACKUP_PREFIX=phys DBOP_BACKUP_S3_ACCESS_KEY_ID_FILE=$dir/access-key-id DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE=$dir/secret-access-key $dir/dbop-backup "\$@"
EOF
  chmod 755 "$dir/agent.sh" "$dir/dbop-backup"
  chmod 644 "$dir/access-key-id" "$dir/secret-access-key"
  AGENT_SH=$dir/agent.sh
}

# Starts an archiving server on data directory $1, port $2, its WAL into the bucket's
# folder $3; more settings in $4….
start_archiving() {
  local data=$1 port=$2 folder=$3
  shift 3
  start_pg "$data" "$port" listen_addresses=127.0.0.1 fsync=off wal_level=replica \
    max_wal_senders=4 archive_mode=on shared_buffers=1GB \
    "archive_command=$AGENT_SH wal-push %p %f --wal-parallel $WAL_PARALLEL --database $folder" "$@"
}

sql() { "$PGBIN/psql" -X -qAt -v ON_ERROR_STOP=1 "$@"; }

# The instance: orders-like tables and pgbench's, checkpointed; PHYS_RAW, its tar's size.
phys_instance() {
  init_pg "$PHYS_DATA"
  start_archiving "$PHYS_DATA" "$PHYS_PORT" "$PHYS_DB"
  export PGPORT=$PHYS_PORT
  log "generating $PHYS_DB (~$PHYS_GIB GiB of orders, pgbench scale $PGBENCH_SCALE)"
  generate "$PHYS_DB" "$PHYS_GIB"
  "$PGBIN/pgbench" -i -q -s "$PGBENCH_SCALE" "$PHYS_DB" >/dev/null 2>&1
  sql -d postgres -c CHECKPOINT
  PHYS_RAW=$("$PGBIN/pg_basebackup" -Ft -D - -X none -c fast -w | wc -c)   # also warms the cache
  log "$PHYS_DB: pg_basebackup's tar is $PHYS_RAW bytes"
}

# CPU seconds the server's finished children used (the walsender of a base backup exits with
# its connection, and the postmaster adds its time to its own children's).
server_cpu() {
  local pid
  pid=$(head -1 "$PHYS_DATA/postmaster.pid")
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f\n", ($14 + $15) / hz }' "/proc/$pid/stat"
}

# One base backup (round r) of a contender; prints "wall cpu maxrss_kib stored_bytes
# server_cpu" (the server's CPU: with the agent's own connection, zstd runs there).
run_base() {
  local contender=$1 r=$2 m stored=0 before
  local pgbb="'$PGBIN/pg_basebackup' --format=tar --wal-method=none --no-password --checkpoint=fast --manifest-checksums=CRC32C --label=bench"
  local agent=("$AGENT" base-backup --prefix phys --database "$PHYS_DB" --backup-id "$contender-run$r" --fast-checkpoint)
  before=$(server_cpu)
  case $contender in
    baseline) m=$(measure bash -c "exec $pgbb --pgdata=- > /dev/null") || return ;;
    read) m=$(measure bash -o pipefail -c "$pgbb --pgdata=- | cat > /dev/null") || return ;;
    local)
      rm -rf "$WORK/phys-local"
      m=$(measure bash -c "$pgbb --pgdata='$WORK/phys-local' && sync -f '$WORK/phys-local/base.tar'") || return
      rm -rf "$WORK/phys-local" ;;
    server-local)
      # The server's zstd as the agent asks for it, kept on local disk: the agent's floor
      # without an S3 server.
      rm -rf "$WORK/phys-local"
      m=$(measure bash -c "$pgbb --compress=server-zstd:level=1,workers=1 --pgdata='$WORK/phys-local' && sync -f '$WORK/phys-local/base.tar.zst'") || return
      stored=$(stat -c %s "$WORK/phys-local/base.tar.zst")
      rm -rf "$WORK/phys-local" ;;
    pipeline)
      m=$(measure bash -o pipefail -c "$pgbb --pgdata=- | zstd -q -1 -T1 | rclone rcat bench:bench/phys-pipeline/run$r.tar.zst") || return
      stored=$(stat -c %s "$WORK/s3/bench/phys-pipeline/run$r.tar.zst") ;;
    dbop*)
      case $contender in
        dbop-w2) agent+=(--compression-threads 2) ;;
        dbop-pgbb) agent+=(--base-client pg_basebackup) ;;
      esac
      m=$(measure "${agent[@]}") || return
      stored=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["sizeBytes"])' "$WORK/stdout.txt") ;;
  esac
  echo "$m $stored $(awk -v a="$before" -v b="$(server_cpu)" 'BEGIN { printf "%.2f", b - a }')"
}

# A table row from runs ("wall cpu rss stored server_cpu" lines): the best by wall time, the
# median wall.
phys_row() {
  local label=$1 name=$2 raw=$3 runs=$4 median_wall wall cpu rss stored server
  read -r median_wall _ <<<"$(printf '%s' "$runs" | median)"
  read -r wall cpu rss stored server <<<"$(printf '%s' "$runs" | best)"
  awk -v g="$label" -v n="$name" -v raw="$raw" -v w="$wall" -v m="$median_wall" -v c="$cpu" -v r="$rss" -v s="$stored" -v sc="$server" \
    'BEGIN { printf "| %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s |\n", g, n, (raw > 0 ? sprintf("%.0f", raw / w / 1e6) : "-"), w, m, c, sc, r / 1024, (s > 0 ? sprintf("%.0f", s / 1e6) : "-") }'
}

# Share of the baseline's throughput: best against best, median against median.
share() {
  local base=$1 agent=$2
  awk -v b="$(printf '%s' "$base" | best | cut -d' ' -f1)" -v a="$(printf '%s' "$agent" | best | cut -d' ' -f1)" \
    -v bm="$(printf '%s' "$base" | median | cut -d' ' -f1)" -v am="$(printf '%s' "$agent" | median | cut -d' ' -f1)" \
    'BEGIN { printf "%.0f %% (best of each), %.0f %% (medians)", 100 * b / a, 100 * bm / am }'
}

# Part 1: base backups in rounds.
base_backups() {
  local raw=$1 r contender m label
  local -A results=()
  for ((r = 1; r <= RUNS; r++)); do
    for contender in baseline read local server-local pipeline dbop dbop-w2 dbop-pgbb; do
      sample_load
      m=$(run_base "$contender" "$r")
      log "base backup round $r $contender: $m"
      results[$contender]+="$m"$'\n'
    done
  done
  label="$(awk -v b="$raw" 'BEGIN { printf "%.2f GiB", b / 2^30 }') ($raw B of tar)"
  echo "| instance | contender | MB/s (instance) | wall s (best) | wall s (median) | CPU s | server CPU s | peak RSS MiB | stored MB |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  phys_row "$label" '`pg_basebackup -Ft -D - -X none -c fast > /dev/null`' "$raw" "${results[baseline]}"
  phys_row "$label" '`pg_basebackup -Ft -D - … \\| cat > /dev/null`' "$raw" "${results[read]}"
  phys_row "$label" '`pg_basebackup -Ft -D dir …` + `sync` (local disk, uncompressed)' "$raw" "${results[local]}"
  phys_row "$label" '`pg_basebackup … --compress=server-zstd:level=1,workers=1 -D dir` + `sync` (the server compressing, local disk)' "$raw" "${results[server-local]}"
  phys_row "$label" '`pg_basebackup -Ft -D - … \\| zstd -1 -T1 \\| rclone rcat`' "$raw" "${results[pipeline]}"
  phys_row "$label" '`dbop-backup base-backup --fast-checkpoint` (own connection, server zstd -1, 1 worker)' "$raw" "${results[dbop]}"
  phys_row "$label" '… `--compression-threads 2` (server zstd, 2 workers)' "$raw" "${results[dbop-w2]}"
  phys_row "$label" '… `--base-client pg_basebackup` (its tar, zstd -1 in the agent)' "$raw" "${results[dbop-pgbb]}"
  echo
  echo "The agent's throughput (own connection, the default) as a share of each: pg_basebackup to /dev/null $(share "${results[baseline]}" "${results[dbop]}");"
  echo "read through a pipe $(share "${results[read]}" "${results[dbop]}"); to local disk $(share "${results[local]}" "${results[dbop]}");"
  echo "the server compressing to local disk (no S3 server) $(share "${results[server-local]}" "${results[dbop]}"), and that one against pg_basebackup to /dev/null: $(share "${results[baseline]}" "${results[server-local]}");"
  echo "the zstd and rclone pipeline $(share "${results[pipeline]}" "${results[dbop]}"). With 2 server workers, against"
  echo "pg_basebackup to /dev/null: $(share "${results[baseline]}" "${results[dbop-w2]}"); through pg_basebackup as before: $(share "${results[baseline]}" "${results[dbop-pgbb]}")."
  echo
}

# The archiver's state: "epoch ready_files archived_count lsn".
archive_sample() {
  local ready
  ready=$(find "$PHYS_DATA/pg_wal/archive_status" -name '*.ready' | wc -l)
  echo "$(date +%s.%N) $ready $(sql -d postgres -c "SELECT archived_count || ' ' || pg_current_wal_lsn() FROM pg_stat_archiver")"
}

# Samples the archiver every second into $1 until the file $2 exists.
sampler() {
  while [[ ! -e $2 ]]; do archive_sample >>"$1"; sleep 1; done
}

# CPU seconds of the archiver's finished children (every archive_command, wal-push included).
archiver_cpu() {
  local pid
  pid=$(sql -d postgres -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'archiver'")
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f\n", ($16 + $17) / hz }' "/proc/$pid/stat"
}

stored_wal_bytes() { du -sb "$WORK/s3/bench/phys/$PHYS_DB/wal" 2>/dev/null | cut -f1 || echo 0; }

last_archived() { sql -d postgres -c "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver"; }

# Switches to a new segment and waits until the last one is archived; prints the seconds taken.
drain() {
  local start=$EPOCHREALTIME current
  current=$(sql -d postgres -c "SELECT pg_walfile_name(pg_current_wal_lsn())")
  sql -d postgres -c "SELECT pg_switch_wal()" >/dev/null
  while [[ $(last_archived) < "$current" ]]; do sleep 0.2; done
  awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f\n", b - a }'
}

# Part 2: pgbench while PostgreSQL archives through the agent; the table.
wal_archiving() {
  local samples=$WORK/wal-samples.txt stop=$WORK/sampler.stop cpu0 stored0 tps drain_s cpu1 stored1
  : >"$samples"
  rm -f "$stop"
  cpu0=$(archiver_cpu) stored0=$(stored_wal_bytes)
  sample_load
  archive_sample >"$WORK/wal-start.txt"
  sampler "$samples" "$stop" &
  local sampler_pid=$!
  log "pgbench: $PGBENCH_CLIENTS clients, ${PGBENCH_SECONDS}s, scale $PGBENCH_SCALE"
  tps=$("$PGBIN/pgbench" -n -c "$PGBENCH_CLIENTS" -j 2 -T "$PGBENCH_SECONDS" "$PHYS_DB" 2>&1 | awk '/^tps/ { printf "%.0f", $3 }')
  archive_sample >"$WORK/wal-end.txt"
  drain_s=$(drain)
  touch "$stop" && wait "$sampler_pid"
  cpu1=$(archiver_cpu) stored1=$(stored_wal_bytes)
  archive_sample >"$WORK/wal-drained.txt"
  wal_report "$tps" "$drain_s" "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.1f", b - a }')" $((stored1 - stored0))
}

# The WAL table from the start, end and drained samples, and the per-second samples.
wal_report() {
  local tps=$1 drain_s=$2 cpu=$3 stored=$4 t0 a0 l0 t1 r1 a1 l1 a2 l2 generated all
  read -r t0 _ a0 l0 <"$WORK/wal-start.txt"
  read -r t1 r1 a1 l1 <"$WORK/wal-end.txt"
  read -r _ _ a2 l2 <"$WORK/wal-drained.txt"
  generated=$(sql -d postgres -c "SELECT pg_wal_lsn_diff('$l1', '$l0')")
  all=$(sql -d postgres -c "SELECT pg_wal_lsn_diff('$l2', '$l0')")
  echo "| pgbench (TPC-B-like) | tps | WAL generated MB (MB/s) | archived during the run: segments, MB (MB/s, seg/s) | .ready max / at the end | drain after the run s | archived in all: segments (stored MB) | wal-push CPU s |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  awk -v c="$PGBENCH_CLIENTS" -v s="$PGBENCH_SECONDS" -v sc="$PGBENCH_SCALE" -v tps="$tps" -v g="$generated" \
    -v t="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" -v n=$((a1 - a0)) -v seg="$SEGMENT" \
    -v rmax="$(cut -d' ' -f2 "$WORK/wal-samples.txt" | sort -n | tail -1)" -v r1="$r1" -v d="$drain_s" \
    -v n2=$((a2 - a0)) -v all="$all" -v st="$stored" -v cpu="$cpu" \
    'BEGIN { printf "| %d clients, %d s, scale %d | %s | %.0f (%.1f) | %d, %.0f (%.1f, %.2f) | %d / %d | %.1f | %d of %.1f generated (%.0f) | %.1f |\n",
      c, s, sc, tps, g / 1e6, g / 1e6 / t, n, n * seg / 1e6, n * seg / 1e6 / t, n / t, rmax, r1, d, n2, all / seg, st / 1e6, cpu }'
  echo
  printf '`.ready` files, one sample a second: %s\n\n' "$(cut -d' ' -f2 "$WORK/wal-samples.txt" | tr '\n' ' ')"
}

# Part 3's inputs for the baseline: the agent's last base backup as a plain tar, and every
# archived WAL file uncompressed in a directory (not timed).
local_copies() {
  local id=$1 dir=$WORK/restore f name
  mkdir -p "$dir/wal"
  zstd -q -d -f "$WORK/s3/bench/phys/$PHYS_DB/base/$id/base.tar.zst" -o "$dir/base.tar"
  for f in "$WORK/s3/bench/phys/$PHYS_DB/wal/"*/*.zst; do
    name=$(basename "$f" .zst)
    zstd -q -d -f "$f" -o "$dir/wal/$name"
  done
  chown -R postgres "$dir"
}

# The baseline's replay, run as postgres: tar unpacked, recovery.signal, restore_command cp,
# PostgreSQL until it promoted, then a clean stop (as `recover` does).
replay_script() {
  cat >"$WORK/restore/replay.sh" <<'EOF'
#!/bin/bash
set -euo pipefail
bin=$1 data=$2 tar=$3 wal=$4 port=$5
start=$EPOCHREALTIME
mkdir -m 700 "$data" && tar -xf "$tar" -C "$data"
echo "unpacked $start $EPOCHREALTIME"
touch "$data/recovery.signal"
echo "restore_command = 'cp $wal/%f %p'" >>"$data/postgresql.auto.conf"
"$bin/postgres" -D "$data" -p "$port" -k "$(dirname "$data")" -c listen_addresses= \
  -c archive_mode=off -c hot_standby=off >"$data.log" 2>&1 &
pid=$!
until [[ $("$bin/psql" -X -qAt -h "$(dirname "$data")" -p "$port" -U bench -d postgres -c 'SELECT pg_is_in_recovery()' 2>/dev/null) == f ]]; do
  kill -0 "$pid" || exit 1
  sleep 0.2
done
"$bin/pg_ctl" -D "$data" stop -m fast -w >/dev/null
wait "$pid"
EOF
  chmod 755 "$WORK/restore/replay.sh"
}

# Seconds from the base backup's unpacking to PostgreSQL's start, from the run's output.
unpack_seconds() {
  case $1 in
    baseline) awk '/^unpacked/ { printf "%.1f\n", $3 - $2 }' "$WORK/stdout.txt" ;;
    dbop) sed 's/\x1b\[[0-9;]*m//g' "$WORK/stderr.txt" | python3 -c '
import sys, datetime
t = {}
for line in sys.stdin:
    for key, text in (("a", "restoring base backup"), ("b", "starting PostgreSQL to replay WAL")):
        if text in line and key not in t:
            t[key] = datetime.datetime.fromisoformat(line.split()[0].rstrip("Z"))
print("%.1f" % (t["b"] - t["a"]).total_seconds())' ;;
  esac
}

# One restore (round r) of a contender into a new directory; prints "wall cpu maxrss_kib
# unpack_s".
run_restore() {
  local contender=$1 r=$2 id=$3 dir=$WORK/restore/$1$2 m
  mkdir -p "$dir" && chown postgres "$dir"
  case $contender in
    baseline) m=$(measure runuser -u postgres -- "$WORK/restore/replay.sh" "$PGBIN" "$dir/data" "$WORK/restore/base.tar" "$WORK/restore/wal" $((PHYS_PORT + 1))) || return ;;
    dbop) m=$(measure runuser -u postgres -- "$AGENT_SH" recover "$dir/data" --agent-path "$AGENT_SH" --database "$PHYS_DB" --backup-id "$id") || return
      log "recover: $(tail -1 "$WORK/stdout.txt")" ;;
  esac
  rm -rf "$dir"
  echo "$m $(unpack_seconds "$contender")"
}

# A restore table row: the best run by wall time (with its unpacking), the median wall.
restore_row() {
  local label=$1 name=$2 runs=$3 median_wall wall cpu rss unpack
  read -r median_wall _ <<<"$(printf '%s' "$runs" | median)"
  read -r wall cpu rss unpack <<<"$(printf '%s' "$runs" | best)"
  awk -v g="$label" -v n="$name" -v w="$wall" -v m="$median_wall" -v c="$cpu" -v r="$rss" -v u="$unpack" \
    'BEGIN { printf "| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", g, n, w, m, u, w - u, c, r / 1024 }'
}

# Part 3: recovery to the latest point, in rounds; the table.
restores() {
  local id=$1 wal_bytes=$2 r contender m
  local_copies "$id"
  replay_script
  local -A results=()
  for ((r = 1; r <= RESTORE_RUNS; r++)); do
    for contender in baseline read local pipeline dbop; do
      sample_load
      m=$(run_restore "$contender" "$r" "$id")
      log "restore round $r $contender: $m"
      results[$contender]+="$m"$'\n'
    done
  done
  local label
  label="base backup $id + $(awk -v b="$wal_bytes" 'BEGIN { printf "%.0f MB", b / 1e6 }') of WAL"
  echo "| restore | contender | wall s (best) | wall s (median) | of which unpacking s | replay and stop s | CPU s | peak RSS MiB |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
  restore_row "$label" "tar -x + \`restore_command = 'cp …'\` (local, uncompressed) + replay" "${results[baseline]}"
  restore_row "$label" '`dbop-backup recover` (S3: download, pg_verifybackup, `wal-fetch` per file) + replay' "${results[dbop]}"
  echo
  echo "dbop's recover takes $(awk -v a="$(printf '%s' "${results[dbop]}" | best | cut -d' ' -f1)" -v b="$(printf '%s' "${results[baseline]}" | best | cut -d' ' -f1)" 'BEGIN { printf "%.2f", a / b }')× PostgreSQL's own restore and replay (best of each)."
  echo
  rm -rf "$WORK/restore"
}

# Every process of the server on data directory $1 stopped, then killed (-9): its postmaster
# and all their descendants (archive_command's wal-push included); its shared memory removed.
# runuser stops itself when its child stops: it is continued, to see the child's end.
descendants() {
  local p
  for p in $(ps -o pid= --ppid "$1"); do echo "$p"; descendants "$p"; done
}
kill_server() {
  local data=$1 pm shm pids
  pm=$(head -1 "$data/postmaster.pid")
  shm=$(sed -n 7p "$data/postmaster.pid" | awk '{ print $2 }')
  # shellcheck disable=SC2046
  kill -STOP "$pm" $(descendants "$pm")
  pids=$(descendants "$pm")
  # shellcheck disable=SC2086
  kill -9 "$pm" $pids
  kill -CONT "${PG_PIDS[$data]}"
  wait "${PG_PIDS[$data]}" 2>/dev/null || true
  unset "PG_PIDS[$data]"
  if [[ -n $shm ]]; then ipcrm -m "$shm" 2>/dev/null || true; fi
}

# Commits one row at a time until the file $2 exists; each acknowledged commit's time
# (epoch, the server's clock) appended to $1.
commits() {
  while [[ ! -e $2 ]]; do
    sql -d postgres -c "INSERT INTO rpo DEFAULT VALUES RETURNING extract(epoch FROM at)" >>"$1" 2>/dev/null || true
    sleep 0.1
  done
}

# One RPO trial; prints its table row.
rpo_trial() {
  local n=$1 dir=$WORK/rpo$1 folder=rpo_$1 acks=$WORK/rpo$1/acks stop=$WORK/rpo$1/stop wait_s m newest
  init_pg "$dir/data"
  start_archiving "$dir/data" "$PHYS_PORT" "$folder" "archive_timeout=$ARCHIVE_TIMEOUT"
  sql -d postgres -c "CREATE TABLE rpo (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())"
  "$AGENT" base-backup --prefix phys --database "$folder" --fast-checkpoint >/dev/null 2>"$dir/base.log"
  : >"$acks"
  commits "$acks" "$stop" &
  local committer=$!
  wait_s=$((RPO_SECONDS + RANDOM % ARCHIVE_TIMEOUT))
  sleep "$wait_s"
  kill_server "$dir/data"
  touch "$stop" && wait "$committer"
  rm -rf "$dir/data"
  sample_load
  m=$(measure runuser -u postgres -- "$AGENT_SH" recover "$dir/recovered" --agent-path "$AGENT_SH" --database "$folder") || return
  start_pg "$dir/recovered" "$PHYS_PORT" listen_addresses=127.0.0.1 archive_mode=off
  newest=$(sql -d postgres -c "SELECT extract(epoch FROM max(at)) || ' ' || count(*) FROM rpo")
  stop_pg "$dir/recovered"
  rpo_row "$n" "$acks" "$newest" "${m%% *}" "$wait_s"
  rm -rf "$dir"
}

rpo_row() {
  local n=$1 acks=$2 newest=$3 recover_s=$4 wait_s=$5
  awk -v n="$n" -v w="$wait_s" -v last="$(tail -1 "$acks")" -v acked="$(wc -l <"$acks")" -v newest="${newest% *}" \
    -v kept="${newest#* }" -v to="$ARCHIVE_TIMEOUT" -v margin="$RPO_MARGIN" -v r="$recover_s" \
    'BEGIN { rpo = last - newest; printf "| %d | %d | %d | %d | %d | %.2f | %s | %.1f |\n", n, to, w, acked, kept, rpo, (rpo <= to + margin ? "yes" : "**no**"), r }'
}

# Part 4: RPO trials; the table.
rpo() {
  local n
  echo "| trial | archive_timeout s | commits for s | commits acknowledged | commits recovered | RPO s (last acknowledged − newest recovered) | ≤ archive_timeout + ${RPO_MARGIN} s | recover wall s |"
  echo "|---:|---:|---:|---:|---:|---:|---|---:|"
  for ((n = 1; n <= RPO_TRIALS; n++)); do rpo_trial "$n"; done
  echo
}

# The WAL a recovery from base backup $1 replays: from its start to the current position.
wal_since() {
  local start
  start=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["startLsn"])' "$WORK/s3/bench/phys/$PHYS_DB/base/$1/backup.json")
  sql -d postgres -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$start')"
}

physical() {
  cd "$WORK" || return   # PostgreSQL's user runs the agent from here
  agent_script
  phys_instance
  base_backups "$PHYS_RAW"
  if [[ $PHYS_BASE_ONLY == 1 ]]; then stop_pg "$PHYS_DATA"; return; fi
  wal_archiving
  restores "dbop-run$RUNS" "$(wal_since "dbop-run$RUNS")"
  stop_pg "$PHYS_DATA"
  rpo
}
