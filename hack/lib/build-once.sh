# Sourced by the setup scripts that build a tool once per machine into /var/cache/kunpeng-tap.

# build_once NAME CHECK...: exits the calling script (status 0) when the command CHECK...
# succeeds (the tool is cached). Else takes the host-wide lock /var/lock/kunpeng-tap-NAME-build
# for the rest of the script (a run building the same tool is waited for) and checks again, so
# one run builds it and the others find it built.
build_once() {
  local name=$1
  shift
  "$@" && exit 0
  exec 9>"/var/lock/kunpeng-tap-$name-build"
  flock 9
  "$@" && exit 0
  return 0
}
