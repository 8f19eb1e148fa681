#!/usr/bin/env bash
# Output flood: RANKS ranks each print LINES lines of WIDTH bytes through `mltrain run`, and the
# same flood through a plain `sh -c 'gen & gen & ... wait' | cat` peer. Checks that mltrain lost,
# tore and duplicated nothing (console and rank-N.log files), then prints medians of RUNS runs.
# A performance script, not a test: it never fails on speed, only on lost or corrupt output.
#
#   bench/output_flood.sh                      # 8 ranks x 200000 lines x 100 bytes, 3 runs
#   RANKS=4 LINES=50000 RUNS=5 bench/output_flood.sh
#   MLTRAIN_BIN=/path/to/mltrain bench/output_flood.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
MLTRAIN_BIN=${MLTRAIN_BIN:-$repo/build/mltrain}
RANKS=${RANKS:-8}
LINES=${LINES:-200000}
WIDTH=${WIDTH:-100}   # bytes per line, newline included (at least 20)
RUNS=${RUNS:-3}
TMP=${TMPDIR:-/tmp}

[ -x "$MLTRAIN_BIN" ] || { echo "output_flood: no mltrain at $MLTRAIN_BIN (build it or set MLTRAIN_BIN)" >&2; exit 2; }
[ "$WIDTH" -ge 20 ] || { echo "output_flood: WIDTH must be at least 20" >&2; exit 2; }
[ "$RANKS" -ge 1 ] && [ "$RANKS" -le 10 ] || { echo "output_flood: RANKS must be 1-10" >&2; exit 2; }
have_time=0
[ -x /usr/bin/time ] && have_time=1

work=$(mktemp -d "$TMP/mltrain-flood.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The generator: line i of rank r is "r iiiiiii xxx...x\n", WIDTH bytes in all.
GEN='BEGIN { r = ENVIRON["RANK"]; pad = sprintf("%0*d", W, 0); gsub(/0/, "x", pad);
  for (i = 0; i < N; i++) { s = r " " sprintf("%07d", i) " "; printf "%s%s\n", s, substr(pad, 1, W - 1 - length(s)) } }'

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# Checks the console copy: every rank's lines in order, whole, once. Prints nothing when fine.
# A line whose rest came over 200 ms after its start, with other ranks' lines printed between (a
# loaded machine), is shown as its first part, then the rest on a line of its own with the same
# prefix (runner/supervise/output.h, docs/spec.md "Console output"): the check joins the two.
check_console() {
  awk -v R="$RANKS" -v N="$LINES" -v W="$WIDTH" '
    { if (substr($0, 1, 1) != "[" || substr($0, 3, 2) != "] ") { bad++; next }
      r = substr($0, 2, 1) + 0; body = part[r] substr($0, 5); part[r] = ""
      if (length(body) < W - 1) { part[r] = body; next }  # a first part: the rest comes later
      if (length(body) != W - 1 || body + 0 != r || substr(body, 3, 7) + 0 != next_i[r]) bad++
      next_i[r]++ }
    END { for (r = 0; r < R; r++) {
            if (part[r] != "") bad++
            if (next_i[r] != N) printf "rank %d: %d lines, want %d\n", r, next_i[r], N }
          if (bad) printf "%d torn, duplicated or reordered lines\n", bad }' "$1"
}

check_log() {  # $1: rank-N.log, $2: rank
  awk -v N="$LINES" -v W="$WIDTH" -v r="$2" '
    { if (length($0) != W - 1 || $1 != r || $2 + 0 != NR - 1) bad++ }
    END { if (NR != N || bad) printf "rank-%d.log: %d lines (want %d), %d bad\n", r, NR, N, bad + 0 }' "$1"
}

run_mltrain() {  # writes "wall_s rss_kb" to $work/result; exits the script on lost output
  local home="$work/home" out="$work/console" rss="$work/rss" t0 t1 problems
  rm -rf "$home"; mkdir -p "$home"
  t0=$(now)
  if [ $have_time = 1 ]; then
    MLTRAIN_HOME=$home NO_COLOR=1 /usr/bin/time -f %M -o "$rss" \
      "$MLTRAIN_BIN" run -n "$RANKS" -- awk -v N="$LINES" -v W="$WIDTH" "$GEN" 2>"$work/stderr" | cat > "$out"
  else
    MLTRAIN_HOME=$home NO_COLOR=1 \
      "$MLTRAIN_BIN" run -n "$RANKS" -- awk -v N="$LINES" -v W="$WIDTH" "$GEN" 2>"$work/stderr" | cat > "$out"
    echo 0 > "$rss"
  fi
  t1=$(now)
  problems=$(check_console "$out")
  local dir
  dir=$(ls -d "$home"/runs/*/ | head -1)
  for ((r = 0; r < RANKS; r++)); do problems+=$(check_log "$dir/rank-$r.log" "$r"); done
  if [ -n "$problems" ]; then
    echo "output_flood: mltrain lost or corrupted output:" >&2
    echo "$problems" >&2
    tail -5 "$work/stderr" >&2
    exit 1
  fi
  rm -f "$out"; rm -rf "$home"
  echo "$(elapsed "$t0" "$t1") $(tail -1 "$rss")" > "$work/result"
}

run_peer() {  # writes "wall_s" to $work/result
  local out="$work/peer" t0 t1 script=""
  for ((r = 0; r < RANKS; r++)); do
    script+="RANK=$r awk -v N=$LINES -v W=$WIDTH \"\$GEN\" & "
  done
  script+="wait"
  t0=$(now)
  GEN=$GEN sh -c "$script" | cat > "$out"
  t1=$(now)
  local n
  n=$(wc -l < "$out")
  [ "$n" -eq $((RANKS * LINES)) ] || { echo "output_flood: the peer printed $n lines" >&2; exit 1; }
  rm -f "$out"
  elapsed "$t0" "$t1" > "$work/result"
}

m_wall=() m_rss=() p_wall=()
for ((i = 1; i <= RUNS; i++)); do
  run_mltrain   # not in a subshell, so a failed check ends the script
  read -r w k < "$work/result"
  m_wall+=("$w"); m_rss+=("$k")
  run_peer
  p_wall+=("$(cat "$work/result")")
  echo "run $i/$RUNS: mltrain ${w}s (peak RSS ${k} kB), peer ${p_wall[-1]}s" >&2
done

mw=$(printf '%s\n' "${m_wall[@]}" | median)
mr=$(printf '%s\n' "${m_rss[@]}" | median)
pw=$(printf '%s\n' "${p_wall[@]}" | median)
total=$((RANKS * LINES))
bytes=$((total * WIDTH))

awk -v R="$RANKS" -v L="$total" -v B="$bytes" -v mw="$mw" -v pw="$pw" -v mr="$mr" -v ht="$have_time" -v runs="$RUNS" 'BEGIN {
  printf "output flood, median of %d runs (%d ranks x %d lines x %d bytes)\n", runs, R, L / R, B / L
  printf "%-18s %5s %9s %11s %8s %10s %8s %13s\n", "", "ranks", "lines", "bytes", "wall_s", "lines/s", "MB/s", "peak_RSS_MB"
  rss = ht ? sprintf("%.1f", mr / 1024) : "-"
  printf "%-18s %5d %9d %11d %8.3f %10.0f %8.1f %13s\n", "mltrain run", R, L, B, mw, L / mw, B / mw / 1e6, rss
  printf "%-18s %5d %9d %11d %8.3f %10.0f %8.1f %13s\n", "sh & ... | cat", R, L, B, pw, L / pw, B / pw / 1e6, "-"
  printf "mltrain rate = %.2f x the plain peer (1.00 = as fast as a pipe into cat)\n", pw / mw
  if (ht) print "peak RSS: /usr/bin/time %M of the launcher, the most any one of its processes used"
}'
