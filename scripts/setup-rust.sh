#!/bin/sh
# The Rust toolchain for Condukt.Sandbox.Virtual's NIF (native/condukt_virtual,
# `make virtual-nif`). Optional: without cargo the rest of Condukt builds and
# the Virtual sandbox reports :not_available.
#
# What it relies on: rustup's stable toolchain in ~/.cargo/bin (the machine
# images and CI put it there; bashkit is an edition 2024 crate, so Rust 1.85
# or later; Debian bookworm's cargo is too old). When cargo is missing or too
# old and rustup is present, this updates the stable toolchain with rustup;
# when rustup is missing too, it says how to install it and exits 0, since
# the NIF is optional. Crates are fetched by cargo from the Rust crate
# registry at build time, pinned by native/condukt_virtual/Cargo.lock.
set -eu
PATH="$HOME/.cargo/bin:$PATH"
MIN_MINOR=85

minor() { cargo --version 2>/dev/null | sed -n 's/^cargo 1\.\([0-9]*\)\..*/\1/p'; }

have=$(minor || true)
if [ -n "$have" ] && [ "$have" -ge "$MIN_MINOR" ]; then
  echo "setup-rust: $(cargo --version) present"
  exit 0
fi

if command -v rustup >/dev/null 2>&1; then
  rustup toolchain install stable --profile minimal --component clippy
  rustup default stable
  echo "setup-rust: $(cargo --version) installed"
else
  echo "setup-rust: no cargo >= 1.$MIN_MINOR and no rustup; install rustup (https://rustup.rs) to build" \
    "Condukt.Sandbox.Virtual's NIF (optional)" >&2
fi
