#!/bin/sh
# Rebuilds priv/ca-certificates/mozilla.pem from Debian's ca-certificates
# package: the Mozilla root programme's certificates, exactly as Debian
# ships them under /usr/share/ca-certificates/mozilla/, concatenated in
# name order. Records the package version and date in SOURCE next to it.
set -eu

src=/usr/share/ca-certificates/mozilla
out=priv/ca-certificates/mozilla.pem
version=$(dpkg-query -W -f='${Version}' ca-certificates)
count=$(ls "$src"/*.crt | wc -l)

[ "$count" -gt 50 ] || { echo "refresh: only $count roots in $src" >&2; exit 1; }

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for f in $(ls "$src"/*.crt | LC_ALL=C sort); do
  printf '# %s\n' "$(basename "$f" .crt)" >> "$tmp"
  cat "$f" >> "$tmp"
  # Some files lack a final newline; keep PEM blocks apart.
  [ -z "$(tail -c1 "$f")" ] || echo >> "$tmp"
done
mv "$tmp" "$out"
trap - EXIT

cat > priv/ca-certificates/SOURCE <<SRC
Mozilla root certificate snapshot used to verify upstream TLS servers and to
build the workspace trust bundle (Mozilla roots + the per-session CA).

source:   Debian package ca-certificates $version ($src/*.crt)
roots:    $count certificates, concatenated in file-name order
taken:    $(date -u +%Y-%m-%d)
refresh:  make mozilla-pem   (after apt-get install --only-upgrade ca-certificates)
SRC
echo "refresh: wrote $out ($count roots, ca-certificates $version)"
