#!/bin/sh
# The Rust toolchain for Condukt.Sandbox.Virtual's NIF (native/condukt_virtual,
# `make virtual-nif`) and its lint (`make virtual-nif-check`: clippy).
#
# bashkit is an edition 2024 crate: it needs Rust 1.85 or later. In order:
#   1. a cargo >= 1.85 with clippy already on the PATH (or in ~/.cargo/bin,
#      where rustup puts it): nothing to do;
#   2. rustup present: it updates its stable toolchain (with clippy);
#   3. otherwise Debian's own: bookworm's `cargo-web`, `rustc-web` and
#      `rust-web-clippy` (1.85 in bookworm, newer in bookworm-security),
#      the toolchain Debian keeps for building Firefox. Plain `cargo` in
#      bookworm (0.66) is too old.
# Crates are fetched by cargo from the Rust crate registry at build time,
# pinned by native/condukt_virtual/Cargo.lock. Idempotent; needs root or
# sudo only when something is installed.
set -eu
PATH="$HOME/.cargo/bin:$PATH"
MIN_MINOR=85

minor() { cargo --version 2>/dev/null | sed -n 's/^cargo 1\.\([0-9]*\)\..*/\1/p'; }
ok() {
  have=$(minor || true)
  [ -n "$have" ] && [ "$have" -ge "$MIN_MINOR" ] && cargo clippy --version >/dev/null 2>&1
}

if ok; then
  echo "setup-rust: $(cargo --version) present"
  exit 0
fi

if command -v rustup >/dev/null 2>&1; then
  rustup toolchain install stable --profile minimal --component clippy
  rustup default stable
else
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
  elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "setup-rust: no cargo >= 1.$MIN_MINOR; run this as root or install sudo" >&2
    exit 1
  fi
  echo "setup-rust: installing Debian's cargo-web, rustc-web and rust-web-clippy"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    cargo-web rustc-web rust-web-clippy
fi

if ok; then
  echo "setup-rust: $(cargo --version) installed"
else
  echo "setup-rust: still no cargo >= 1.$MIN_MINOR with clippy after installing" >&2
  exit 1
fi
