#!/usr/bin/env bash
# Bounded fuzzing of every cargo-fuzz target in fuzz/, as CI runs it.
#
#   tools/fuzz.sh [SECONDS]     # per target, default 60
#
# Installs cargo-fuzz if missing, rebuilds the git-ignored corpus from the
# captures in tests/data (tests/wire/fuzz_seeds.rs), then runs each target from its
# corpus plus its committed seeds in fuzz/seeds/<target>. Exits non-zero on a
# crash; the input that caused it is in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi

cargo test --test wire -- --ignored --exact fuzz_seeds::export_fuzz_corpus

# Only a stable toolchain is available: let it accept the -Z flags cargo-fuzz
# passes (coverage instrumentation, AddressSanitizer).
export RUSTC_BOOTSTRAP=1

for target in $(cargo fuzz list); do
    corpus="fuzz/corpus/$target"
    seeds="fuzz/seeds/$target"
    mkdir -p "$corpus"
    inputs=("$corpus")
    if [ -d "$seeds" ]; then
        inputs+=("$seeds")
    fi
    echo "fuzzing $target for ${seconds}s"
    cargo fuzz run "$target" "${inputs[@]}" -- -max_total_time="$seconds"
done
