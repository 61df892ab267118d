#!/usr/bin/env bash
# tools/rust-ibverbs/run.sh: programs written against the crates.io `ibverbs`
# crate (0.9.x; it links the system libibverbs.so.1 dynamically through
# ibverbs-sys) run unmodified on softroce through `softroce run`.
#
# Rows:
#   crate's examples/loopback.rs      the crate's own example, copied verbatim
#                                     from the source cargo downloaded, built
#                                     and run as it is
#   loopback                          the same steps (src/main.rs), with every
#                                     completion's status, opcode, length and
#                                     QP number checked, and a deadline
#   loopback, --preload               the same with LD_PRELOAD as well
#   pair                              two QPs of one process connected to each
#                                     other, 64 KiB each way, RC then UC
#   errors                            the crate's failures give rxe's errno
#   contexts                          two contexts of the device at once, a QP
#                                     of each connected to the other
#   parallel                          four threads each opening the device,
#                                     looping a SEND back and closing, ten
#                                     times (a crate's tests under cargo test)
#   server/client                     two processes (127.0.0.1, 127.0.0.2),
#                                     endpoints over TCP, 256 KiB each way
#
# The published crate ships no tests that need a device (only two serde unit
# tests), so there is nothing else of its own to run.
#
# Needs: cmake and libclang-dev (ibverbs-sys's build script configures and
# builds its vendored rdma-core 55 with cmake, then runs bindgen over its
# headers), libibverbs-dev (libibverbs.so to link against; it brings the
# libnl-3/libnl-route-3 headers rdma-core's cmake requires), pkg-config,
# python3, a C compiler. Installs the Debian packages that are missing.
# Cold build: about 2 minutes on 2 cores.
#
# Prints a table and a closing "N passed, N failed" line; exits non-zero if
# any row failed, printing the failed rows' output after the table.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

need=()
for pkg in cmake libclang-dev libibverbs-dev pkg-config python3; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "rust-ibverbs: installing ${need[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >/dev/null || { echo "rust-ibverbs: could not install ${need[*]}" >&2; exit 2; }
fi

# softroce's drop-in libibverbs.so.1 and the `softroce run` wrapper.
(cd "$repo" && cargo build --release -q -p softroce-tools -p softroce-ibverbs) || exit 1
sr=${CARGO_TARGET_DIR:-$repo/target}/release/softroce

# The checker, in its own target directory (it is not a workspace member).
target=$here/target
cd "$here" || exit 1
cargo fetch --locked -q || exit 1
crate_dir=$(cargo metadata --locked --offline --format-version 1 | python3 -c '
import json, os, sys
meta = json.load(sys.stdin)
print(next(os.path.dirname(p["manifest_path"]) for p in meta["packages"] if p["name"] == "ibverbs"))
') || exit 1
mkdir -p "$target/upstream"
cp "$crate_dir/examples/loopback.rs" "$target/upstream/loopback.rs" || exit 1
cargo build --release --locked -q --target-dir "$target" --bins --example upstream-loopback || exit 1
check=$target/release/rust-ibverbs-check
example=$target/release/examples/upstream-loopback
echo "ibverbs crate: $(basename "$crate_dir"), linked against $(ldd "$check" | awk '/libibverbs/ {print $1}')"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$work/failures"
passed=0 failed=0

row() { # NAME RESULT NOTE
  printf '%-40s %-5s %s\n' "$1" "$2" "$3"
}

# has FILE LINE...: each LINE is a whole line of FILE
has() {
  local file=$1 line; shift
  for line; do grep -qxF "$line" "$file" || return 1; done
}

# Every row on a RoCE port of its own choosing, so that a run beside other
# softroce programs on the host (another checkout's tests) cannot collide.
roce_port=$((20000 + RANDOM % 10000))

# one process: NAME "LINES IT MUST PRINT" [softroce run options] -- CMD...
single() {
  local name=$1 want=$2; shift 2
  local opts=()
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  # shellcheck disable=SC2086 # $want is a list of words
  if timeout 60 "$sr" run --addr 127.0.0.1 --port "$roce_port" "${opts[@]}" -- "$@" >"$work/out" 2>&1 \
    && has "$work/out" $want; then
    row "$name" pass "$(grep -vE '^ ' "$work/out" | tail -n 2 | head -n 1 | cut -c1-60)"
    passed=$((passed + 1))
  else
    row "$name" FAIL ""
    failed=$((failed + 1))
    { echo "== $name"; cat "$work/out"; } >>"$work/failures"
  fi
}

printf '%-40s %-5s %s\n' row result last-line
single "crate's examples/loopback.rs" "sent received" -- "$example"
single "loopback" ok -- "$check" loopback
single "loopback, --preload" ok --preload -- "$check" loopback
single "pair (RC, UC)" ok -- "$check" pair
single "errors" ok -- "$check" errors
single "contexts (two at once)" ok -- "$check" contexts
single "parallel (4 threads x 10 opens)" ok -- "$check" parallel

# Two processes: a server on 127.0.0.1, a client on 127.0.0.2.
tcp_port=$((30000 + RANDOM % 20000))
timeout 60 "$sr" run --addr 127.0.0.1 --port "$roce_port" -- "$check" server "127.0.0.1:$tcp_port" >"$work/server" 2>&1 &
server=$!
timeout 60 "$sr" run --addr 127.0.0.2 --port "$roce_port" -- "$check" client "127.0.0.1:$tcp_port" >"$work/client" 2>&1
client_rc=$?
server_rc=0
wait "$server" || server_rc=$?
if ((client_rc == 0 && server_rc == 0)) && has "$work/server" ok && has "$work/client" ok; then
  row "server/client (two processes)" pass "$(grep 'data intact' "$work/client" | cut -c1-60)"
  passed=$((passed + 1))
else
  row "server/client (two processes)" FAIL "client exit $client_rc, server exit $server_rc"
  failed=$((failed + 1))
  { echo "== client"; cat "$work/client"; echo "== server"; cat "$work/server"; } >>"$work/failures"
fi

if ((failed)); then
  echo
  cat "$work/failures"
fi
echo
echo "rust-ibverbs: $passed passed, $failed failed"
((failed == 0))
