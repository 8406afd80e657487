#!/bin/sh
# One container of the Kubernetes tier's pod runtime (docs/k8s-tier.md,
# "The pod runtime"). Run as root, already inside the pod's network
# namespace and inside a fresh, private mount namespace:
#
#   nsenter --net=/run/netns/NS -- unshare --mount --propagation private -- \
#     container.sh DIR -- setpriv ... COMMAND...
#
# DIR (the container's directory in the pod's) holds:
#   mounts   one mount per line, fields separated by one TAB:
#              KIND SOURCE TARGET MODE
#            KIND is dir (a directory bind mount) or file (a file bind
#            mount: a subPath, /etc/hosts); MODE is ro or rw.
#   hide     directories (one a line) covered with an empty read-only
#            tmpfs after the mounts: the runtime's own files (every pod's
#            Secrets) are not in the container's view.
#   workdir  the directory the command starts in.
#   rootro   present: the root file system is read-only
#            (readOnlyRootFilesystem).
#   fs/      an empty directory: the container's root is built there.
#
# The container's root is an overlay whose lower layer is the host's root
# file system (the "image") and whose upper layer is a tmpfs, so mount
# points that the image lacks (/workspace, /etc/condukt, a subPath file)
# are created in the container only, never on the host. /dev, /proc and
# /sys are the host's. Then pivot_root, and the old root is detached:
# nothing outside the mounts above is reachable. Every mount lives in
# this mount namespace, which dies with its last process; nothing
# propagates to the host (private propagation).
set -eu

dir=$1
shift
[ "$1" = "--" ] && shift

fs=$dir/fs
mount -t tmpfs -o mode=0755 condukt-ctr "$fs"
mkdir "$fs/upper" "$fs/work" "$fs/root"
mount -t overlay condukt-ctr -o "lowerdir=/,upperdir=$fs/upper,workdir=$fs/work" "$fs/root"
root=$fs/root

for d in dev proc sys; do
  mount --rbind "/$d" "$root/$d"
done

tab=$(printf '\t')
while IFS="$tab" read -r kind src dst mode; do
  [ -n "$kind" ] || continue
  case $kind in
    dir) mkdir -p "$root$dst" ;;
    file)
      mkdir -p "$root$(dirname "$dst")"
      [ -e "$root$dst" ] || : >"$root$dst"
      ;;
    *) echo "container.sh: unknown mount kind $kind" >&2; exit 120 ;;
  esac
  mount --bind "$src" "$root$dst"
  if [ "$mode" = ro ]; then
    mount -o remount,bind,ro "$root$dst"
  fi
done <"$dir/mounts"

if [ -f "$dir/hide" ]; then
  while read -r path; do
    [ -n "$path" ] || continue
    if [ -d "$root$path" ]; then
      mount -t tmpfs -o ro,mode=0755,size=4k condukt-hidden "$root$path"
    fi
  done <"$dir/hide"
fi

workdir=$(cat "$dir/workdir")
rootro=false
[ -e "$dir/rootro" ] && rootro=true

cd "$root"
mkdir -p .condukt-oldroot
pivot_root . .condukt-oldroot
cd /
umount -l /.condukt-oldroot
rmdir /.condukt-oldroot
if [ "$rootro" = true ]; then
  mount -o remount,bind,ro /
fi
cd "$workdir"
exec "$@"
