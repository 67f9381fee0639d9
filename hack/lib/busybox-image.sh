# Sourced by the setup scripts that build the e2e tier's busybox image (hack/e2e/setup-containerd.sh
# for amd64, hack/e2e/setup-vm.sh for the arm64 guest).

# busybox_image BUSYBOX ARCH OUT BY: writes OUT, a docker-archive tarball of one layer (the static
# BUSYBOX with a few applet links, /etc/passwd and /etc/group), image architecture ARCH (amd64,
# arm64), tagged `tap.local/pause:1` (the sandbox image) and `tap.local/busybox:1`, its history
# "created by" BY (the calling script). Reproducible: the same busybox gives the same tarball.
busybox_image() {
  local busybox=$1 arch=$2 out=$3 by=$4 work diff cfg a
  work=$(mktemp -d)
  mkdir -p "$work/rootfs/bin" "$work/rootfs/etc" "$work/rootfs/tmp" "$work/rootfs/proc" \
    "$work/rootfs/sys" "$work/rootfs/dev"
  cp "$busybox" "$work/rootfs/bin/busybox"
  for a in sh sleep cat ls echo grep true; do ln -s busybox "$work/rootfs/bin/$a"; done
  echo 'root:x:0:0:root:/:/bin/sh' > "$work/rootfs/etc/passwd"
  echo 'root:x:0:' > "$work/rootfs/etc/group"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/rootfs" \
    -cf "$work/layer.tar" .
  diff=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  mkdir -p "$work/archive/$diff"
  mv "$work/layer.tar" "$work/archive/$diff/layer.tar"
  cat > "$work/config.json" <<CFG
{"architecture":"$arch","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/bin"],"Cmd":["/bin/sleep","2147483647"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:$diff"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"$by"}]}
CFG
  cfg=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  mv "$work/config.json" "$work/archive/$cfg.json"
  cat > "$work/archive/manifest.json" <<MAN
[{"Config":"$cfg.json","RepoTags":["tap.local/pause:1","tap.local/busybox:1"],"Layers":["$diff/layer.tar"]}]
MAN
  mkdir -p "$(dirname "$out")"
  tar -C "$work/archive" -cf "$out.new" .
  mv "$out.new" "$out"
  rm -rf "$work"
}
