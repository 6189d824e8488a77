# Sourced by the other scripts: where builds go and which tools they use.
# A target directory outside the clone survives fresh clones, so CI and the next session
# build incrementally; set CARGO_TARGET_DIR to put it elsewhere. There is one per checkout
# path: cargo names a workspace's artifacts by paths relative to the workspace, so two
# checkouts sharing a target directory could each run test binaries the other compiled.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target-$(printf %s "$root" | sha256sum | cut -c1-12)}"
# wasm-opt: scripts/bin/wasm-opt keeps the output of every input it has optimised (an
# unchanged release build then takes seconds) in front of npm's binaryen 132 (Debian's
# binaryen 108 breaks hydration).
export PATH="$root/scripts/bin:$root/end2end/node_modules/.bin:$HOME/.cargo/bin:$PATH"
