#!/bin/sh
# CTest Packaging.ExportedSymbols: libmxmoe.so exports the C ABI (mxmoe_*) and the public C++ API
# (namespace mxmoe, its classes' type info and vtables) and nothing else: no mxmoe::detail::, no
# backend internals, no std:: instantiations. Also checks the SONAME (libmxmoe.so.<ABI version>).
# Usage: exported_symbols.sh LIBRARY EXPECTED_SONAME
set -eu
lib=$1 soname=$2
found=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$found" = "$soname" ] || { echo "SONAME of $lib is '$found', expected '$soname'"; exit 1; }

syms=$(nm -D --defined-only -P "$lib" | awk '{ print $1 }' | sort -u)
# A public function may take a detail:: type (SavedState's constructor does); none may live there.
bad=$(echo "$syms" | c++filt | grep -v -E '^(mxmoe_[A-Za-z0-9_]+|((typeinfo|typeinfo name|vtable) for )?mxmoe::.*)$' || true)
bad=$(printf '%s\n%s' "$bad" "$(echo "$syms" | c++filt | grep -E '^((typeinfo|typeinfo name|vtable) for )?mxmoe::detail::' || true)" |
      sed '/^$/d')
if [ -n "$bad" ]; then
  echo "$lib exports symbols outside the public API:"
  echo "$bad" | head -n 40
  exit 1
fi
for want in mxmoe_forward mxmoe_backward mxmoe_version mxmoe_permute_tokens mxmoe_release_cached_memory \
            'mxmoe::forward(' 'mxmoe::permute_tokens(' 'mxmoe::release_cached_memory(' \
            'mxmoe::Context::Context(' 'typeinfo for mxmoe::Error'; do
  echo "$syms" | c++filt | grep -q -F "$want" || { echo "$lib does not export $want"; exit 1; }
done
echo "$lib ($soname): $(echo "$syms" | wc -l) exported symbols, all C ABI or namespace mxmoe:"
echo "$syms" | c++filt | sed 's/^/  /'
