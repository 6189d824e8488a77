# Sourced by the other scripts: where builds go and which tools they use.
# A target directory outside the clone survives fresh clones, so CI and the next session
# build incrementally; set CARGO_TARGET_DIR to put it elsewhere.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}"
# wasm-opt comes from npm's binaryen 132 (Debian's binaryen 108 breaks hydration).
export PATH="$root/end2end/node_modules/.bin:$HOME/.cargo/bin:$PATH"
