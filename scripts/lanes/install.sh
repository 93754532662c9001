#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lane `--install`: `cmake --install` of the release build into a temporary prefix, which is then moved (the tree
# must be relocatable); runs the installed `maxsim info`; builds the README's C and C++ examples (extracted from
# README.md) as a consumer would, three ways: find_package from the prefix (shared and static), pkg-config
# (shared, and static through Libs.private), FetchContent of this checkout; runs each. Environment: JOBS,
# BUILD_DIR (default build; an existing release build is reused and only the library and CLI are built).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
JOBS=${JOBS:-$(nproc)}
BUILD_DIR=${BUILD_DIR:-build}
root=$PWD
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
step() { echo "install: $*"; }

step "building the library and the CLI in $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=(maxsim maxsim_static maxsim_cli)
ninja -C "$BUILD_DIR" -t query maxsim_plugin_cuda >/dev/null 2>&1 && targets+=(maxsim_plugin_cuda)
test_plugin=""  # the CPU test plugin (a release build with tests has it): proves the default plugin folder
if ninja -C "$BUILD_DIR" -t query test_plugin_0 >/dev/null 2>&1; then
  targets+=(test_plugin_0)
  test_plugin=$BUILD_DIR/test-plugins/libmaxsim-plugin-testcpu.so
fi
ninja -C "$BUILD_DIR" -j"$JOBS" "${targets[@]}"
version=$(sed -n 's/^#define MAXSIM_VERSION_STRING "\(.*\)"$/\1/p' "$BUILD_DIR/include/maxsim/version.h")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/maxsim-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step "cmake --install into $tmp/stage, then moved to $tmp/prefix"
cmake --install "$BUILD_DIR" --prefix "$tmp/stage" >/dev/null
mv "$tmp/stage" "$tmp/prefix"
P=$tmp/prefix
for f in lib/libmaxsim.so lib/libmaxsim.a bin/maxsim include/maxsim/maxsim.h include/maxsim/maxsim.hpp \
         include/maxsim/plugin.h include/maxsim/packed_format.h include/maxsim/version.h \
         lib/cmake/maxsim/maxsimConfig.cmake lib/cmake/maxsim/maxsimConfigVersion.cmake lib/pkgconfig/maxsim.pc; do
  [ -e "$P/$f" ] || { echo "install: $f was not installed" >&2; exit 1; }
done
if grep -rlF -e "$root" -e "$tmp/stage" "$P/lib/cmake" "$P/lib/pkgconfig" "$P/include"; then
  echo "install: the files above name a build or staging path (not relocatable)" >&2; exit 1
fi
info=$(env -u MAXSIM_PLUGIN_PATH "$P/bin/maxsim" info)
echo "$info" | grep -q "^libmaxsim $version\$" || { echo "install: 'maxsim info' does not say libmaxsim $version:" >&2; echo "$info" >&2; exit 1; }
echo "$info" | grep -qF "$P/lib/maxsim/plugins" || { echo "install: the installed library does not search $P/lib/maxsim/plugins:" >&2; echo "$info" >&2; exit 1; }
step "installed maxsim info: libmaxsim $version, plugins searched in $P/lib/maxsim/plugins"
if [ -n "$test_plugin" ]; then
  mkdir -p "$P/lib/maxsim/plugins"
  cp "$test_plugin" "$P/lib/maxsim/plugins/"
  env -u MAXSIM_PLUGIN_PATH "$P/bin/maxsim" info | grep -q "^  testcpu  $P/lib/maxsim/plugins/libmaxsim-plugin-testcpu.so\$" ||
    { echo "install: a plugin in $P/lib/maxsim/plugins was not loaded by default:" >&2; "$P/bin/maxsim" info >&2; exit 1; }
  rm "$P/lib/maxsim/plugins/libmaxsim-plugin-testcpu.so"
  step "a plugin in $P/lib/maxsim/plugins is loaded with no plugin path set"
fi

python3 tests/consumer/extract_examples.py README.md "$tmp/examples" >/dev/null
# Each example packs three documents and queries one of them: it must rank first.
check() {  # check NAME EXPECTED_ID PROGRAM
  local out
  out=$(cd "$tmp" && "$3") || { echo "install: $1 failed" >&2; exit 1; }
  echo "$out" | head -1 | grep -q "^rank 1: document $2, score 4\.0000$" ||
    { echo "install: $1 printed something else:" >&2; echo "$out" >&2; exit 1; }
  step "$1: $(echo "$out" | head -1)"
}

step "consumer 1: find_package(maxsim) from the prefix"
cmake -S tests/consumer -B "$tmp/c1" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" -DCMAKE_PREFIX_PATH="$P" \
  -DMAXSIM_CONSUMER_MODE=package -DMAXSIM_EXAMPLES_DIR="$tmp/examples" >/dev/null
ninja -C "$tmp/c1" -j"$JOBS" >/dev/null
check "find_package, C (shared)" 101 "$tmp/c1/quickstart_c"
check "find_package, C++ (shared)" 102 "$tmp/c1/quickstart_cpp"
check "find_package, C++ (static)" 102 "$tmp/c1/quickstart_cpp_static"

step "consumer 2: pkg-config"
export PKG_CONFIG_PATH=$P/lib/pkgconfig
[ "$(pkg-config --modversion maxsim)" = "$version" ] || { echo "install: pkg-config --modversion maxsim is not $version" >&2; exit 1; }
libdir=$(pkg-config --variable=libdir maxsim)
mkdir -p "$tmp/c2"
cc -O2 -o "$tmp/c2/quickstart_c" "$tmp/examples/quickstart.c" $(pkg-config --cflags --libs maxsim) -Wl,-rpath,"$libdir"
c++ -O2 -std=c++17 -o "$tmp/c2/quickstart_cpp" "$tmp/examples/quickstart.cc" $(pkg-config --cflags --libs maxsim) \
  -Wl,-rpath,"$libdir"
# Static: the archive by name, then what Libs.private says it needs.
cc -O2 -o "$tmp/c2/quickstart_c_static" "$tmp/examples/quickstart.c" $(pkg-config --cflags maxsim) \
  $(pkg-config --static --libs maxsim | sed 's/-lmaxsim\b/-l:libmaxsim.a/')
check "pkg-config, C (shared)" 101 "$tmp/c2/quickstart_c"
check "pkg-config, C++ (shared)" 102 "$tmp/c2/quickstart_cpp"
check "pkg-config, C (static)" 101 "$tmp/c2/quickstart_c_static"

step "consumer 3: FetchContent of this checkout (only the library builds)"
cmake -S tests/consumer -B "$tmp/c3" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DMAXSIM_CONSUMER_MODE=subproject -DMAXSIM_SOURCE_DIR="$root" -DMAXSIM_EXAMPLES_DIR="$tmp/examples" >/dev/null
ninja -C "$tmp/c3" -j"$JOBS" | sed -n '$p'
check "FetchContent, C" 101 "$tmp/c3/quickstart_c"
check "FetchContent, C++" 102 "$tmp/c3/quickstart_cpp"
step "passed"
