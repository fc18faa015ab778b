#!/bin/sh
# Entrypoint of the apptainer-builder image. The container starts as root only to make its
# own /dev/fuse usable (hosts often ship it 0600) and to give the caller's uid a passwd
# entry (apptainer refuses unknown users) and subordinate ids (`apptainer build --fakeroot`
# maps them; a debootstrap bootstrap cannot do without); then it drops to
# TORCHBUILD_UID:TORCHBUILD_GID for good, so everything written to the mounts belongs to the caller.
set -eu
uid="${TORCHBUILD_UID:-0}"
gid="${TORCHBUILD_GID:-$uid}"
if [ -c /dev/fuse ]; then chmod 0666 /dev/fuse; fi
getent group "$gid" >/dev/null || echo "torchbuild:x:${gid}:" >>/etc/group
getent passwd "$uid" >/dev/null || echo "torchbuild:x:${uid}:${gid}:torchbuild:${HOME:-/tmp}:/bin/sh" >>/etc/passwd
# root too: without the capabilities a root build's %post asks for, it builds with --fakeroot
user="$(getent passwd "$uid" | cut -d: -f1)"
for ids in /etc/subuid /etc/subgid; do
  grep -q "^${user}:" "$ids" 2>/dev/null || echo "${user}:100000:65536" >>"$ids"
done
if [ "$uid" = 0 ]; then exec "$@"; fi
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"
