#!/bin/sh
# Enables NRI in containerd's config (what the install guide does by hand) and restarts
# containerd when the file changed. Idempotent: an already enabled config is left alone and
# containerd is not restarted.
#
# The chart's optional `enable-nri` init container runs it on the host, through
# `nsenter --mount=/host/proc/1/ns/mnt --uts=... --ipc=... --net=... -- sh -s` (the host's /proc
# mounted at /host/proc; no hostPID), so it uses the host's files, sh, awk and systemctl.
# Environment:
#   CONTAINERD_CONFIG  containerd's config (default /etc/containerd/config.toml)
#   NRI_SOCKET_PATH    socket_path written into a new NRI section (default /var/run/nri/nri.sock)
#   RESTART_COMMAND    run after a change (default `systemctl restart containerd`)
#
# It handles the NRI table written as [plugins."io.containerd.nri.v1.nri"] or with single
# quotes (config version 3): `disable` and `disable_connections` are set to false, a missing
# `disable` is added, a missing table is appended, a missing file is created. The previous file
# is kept as <config>.kunpeng-tap.bak.
set -eu

CONFIG="${CONTAINERD_CONFIG:-/etc/containerd/config.toml}"
SOCKET="${NRI_SOCKET_PATH:-/var/run/nri/nri.sock}"
RESTART="${RESTART_COMMAND:-systemctl restart containerd}"

say() { echo "enable-nri: $*"; }

if [ ! -e "$CONFIG" ]; then
  mkdir -p "$(dirname "$CONFIG")"
  printf 'version = 2\n' > "$CONFIG.kunpeng-tap.new"
  src="$CONFIG.kunpeng-tap.new"
  created=1
else
  src="$CONFIG"
  created=0
fi

tmp="$CONFIG.kunpeng-tap.tmp"
# Literal brackets as [[] and []] so that awk's -v escape processing leaves the regex alone.
hdr='^[[:space:]]*[[]plugins[.]["'"'"']io[.]containerd[.]nri[.]v1[.]nri["'"'"'][]][[:space:]]*(#.*)?$'
awk -v hdr="$hdr" -v sock="$SOCKET" '
  function close_nri() {
    if (in_nri && !saw_disable) print "  disable = false"
    in_nri = 0
  }
  {
    line = $0
    if (line ~ /^[[:space:]]*\[/) {
      close_nri()
      if (line ~ hdr) { in_nri = 1; found = 1; saw_disable = 0 }
      print line
      next
    }
    if (in_nri && line ~ /^[[:space:]]*disable[[:space:]]*=/) {
      saw_disable = 1
      sub(/=.*/, "= false", line)
    } else if (in_nri && line ~ /^[[:space:]]*disable_connections[[:space:]]*=/) {
      sub(/=.*/, "= false", line)
    }
    print line
  }
  END {
    close_nri()
    if (!found) {
      print ""
      print "[plugins.\"io.containerd.nri.v1.nri\"]"
      print "  disable = false"
      print "  disable_connections = false"
      print "  socket_path = \"" sock "\""
    }
  }
' "$src" > "$tmp"

if [ "$created" = 0 ] && cmp -s "$CONFIG" "$tmp"; then
  rm -f "$tmp"
  say "NRI already enabled in $CONFIG; containerd not restarted"
  [ -S "$SOCKET" ] || say "warning: $SOCKET does not exist yet; is containerd >= 1.7 running with this config?"
  exit 0
fi

if [ "$created" = 0 ]; then
  cp -p "$CONFIG" "$CONFIG.kunpeng-tap.bak"
else
  rm -f "$CONFIG.kunpeng-tap.new"
fi
mv "$tmp" "$CONFIG"
say "enabled NRI in $CONFIG (socket $SOCKET); restarting containerd: $RESTART"
sh -c "$RESTART"
say "done"
