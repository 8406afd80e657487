#!/bin/sh
# Checks what building condukt-egress needs, before anything is compiled,
# and names the Debian package for each missing piece in ONE line, so that
# a user sees "install libssl-dev" instead of a thousand linker errors.
#
#   scripts/check-build-deps.sh          the release binary (priv/condukt-egress)
#   scripts/check-build-deps.sh --test   also the C test suite and the fuzzers
#
# Exit status 0 when everything is present, 1 otherwise (the line goes to
# stderr). EI_DIR, CC and PKG_CONFIG are honoured as the Makefile does.
set -u

CC=${CC:-cc}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
missing=""

need() { # need PACKAGE: record a missing Debian package once
  case " $missing " in *" $1 "*) ;; *) missing="$missing $1" ;; esac
}

command -v make >/dev/null 2>&1 || need make
command -v "$CC" >/dev/null 2>&1 || need gcc
if command -v "$PKG_CONFIG" >/dev/null 2>&1; then
  # pkg-config module -> the Debian package that ships its .pc file
  for pair in jansson:libjansson-dev libuv:libuv1-dev openssl:libssl-dev \
              libwebsockets:libwebsockets-dev yaml-0.1:libyaml-dev \
              libnghttp2:libnghttp2-dev; do
    "$PKG_CONFIG" --exists "${pair%%:*}" 2>/dev/null || need "${pair#*:}"
  done
  # libwebsockets loads its libuv event loop as a plugin at run time.
  if "$PKG_CONFIG" --exists libwebsockets 2>/dev/null; then
    libdir=$("$PKG_CONFIG" --variable=libdir libwebsockets)
    ls "$libdir"/libwebsockets-evlib_uv.so* >/dev/null 2>&1 ||
      ls "$libdir"/libwebsockets*/libwebsockets-evlib_uv.so* >/dev/null 2>&1 ||
      need libwebsockets-evlib-uv
  fi
else
  need pkg-config
  need "libjansson-dev libuv1-dev libssl-dev libwebsockets-dev libyaml-dev libnghttp2-dev"
fi
[ -f /usr/include/unistr.h ] || need libunistring-dev

# erl_interface (ei) comes with Erlang's development files.
ei=${EI_DIR:-$(ls -d /usr/lib/erlang/lib/erl_interface-* 2>/dev/null | sort | tail -n 1)}
if [ -z "$ei" ] || [ ! -f "$ei/include/ei.h" ] || [ ! -f "$ei/lib/libei.a" ]; then
  need erlang-dev
fi

if [ "${1:-}" = "--test" ]; then
  if command -v "$PKG_CONFIG" >/dev/null 2>&1; then
    "$PKG_CONFIG" --exists criterion 2>/dev/null || need libcriterion-dev
  fi
  command -v clang >/dev/null 2>&1 || need clang
  # clang's sanitizer and libFuzzer runtimes
  ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 ||
    need libclang-rt-14-dev
fi

if [ -n "$missing" ]; then
  # shellcheck disable=SC2086
  set -- $missing
  echo "condukt: cannot build condukt-egress: missing Debian package(s): $* (install with: apt-get install $*; or run 'make setup')" >&2
  exit 1
fi
exit 0
