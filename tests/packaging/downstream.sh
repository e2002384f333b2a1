#!/bin/sh
# CTest Packaging.Downstream: install the build into a fresh prefix, then build and run the
# downstream example (examples/downstream) against it twice: through find_package(mxmoe CONFIG)
# and, where pkg-config exists, through mxmoe.pc (a C program with cc $(pkg-config ...)).
# Usage: downstream.sh BUILD_DIR SOURCE_DIR WORK_DIR CMAKE C_COMPILER CXX_COMPILER [GENERATOR]
set -eu
build=$1 src=$2 work=$3 cmake=$4 cc=$5 cxx=$6 generator=${7:-}
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"

echo "== cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
for f in include/mxmoe/mxmoe.h include/mxmoe/version.h include/mxmoe/export.h bin/mxmoe; do
  test -e "$prefix/$f" || { echo "not installed: $f"; exit 1; }
done
find "$prefix" -name 'libmxmoe.so*' -o -name 'mxmoeConfig*.cmake' -o -name mxmoe.pc | sed "s|$prefix/||" | sort

echo "== find_package(mxmoe CONFIG) from examples/downstream"
set -- -S "$src/examples/downstream" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx"
if [ -n "$generator" ]; then set -- "$@" -G "$generator"; fi
"$cmake" "$@" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
grep "mxmoe .* from " "$work/configure.log"
"$cmake" --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/build/mxmoe_downstream"
"$work/build/mxmoe_downstream_c"

if command -v pkg-config >/dev/null 2>&1; then
  echo "== pkg-config mxmoe"
  export PKG_CONFIG_PATH="$(dirname "$(find "$prefix" -name mxmoe.pc | head -n 1)")"
  echo "mxmoe.pc: version $(pkg-config --modversion mxmoe): $(pkg-config --cflags --libs mxmoe)"
  libdir=$(pkg-config --variable=libdir mxmoe)
  # shellcheck disable=SC2046
  "$cc" -o "$work/c_version_pc" "$src/examples/downstream/c_version.c" $(pkg-config --cflags --libs mxmoe) \
    -Wl,-rpath,"$libdir"
  "$work/c_version_pc"
else
  echo "== pkg-config not found: mxmoe.pc not checked"
fi
echo "downstream: OK"
