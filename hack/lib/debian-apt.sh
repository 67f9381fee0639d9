# Sourced by the setup scripts that fetch Debian packages without touching the system's apt
# configuration (hack/e2e/setup-containerd.sh, hack/e2e/setup-vm.sh, hack/build-arm64.sh).

# The URI of the main Debian archive this system's apt uses (the entry whose release is the
# system's own codename, origin and label "Debian": not -security, not -updates, not a
# third-party repository), as apt itself parsed the sources (one-line or deb822). No mirror is
# named in this repository.
debian_archive() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || return 0
  if ! apt-cache policy 2>/dev/null | grep -q "n=$codename,"; then
    flock /var/lock/kunpeng-tap-apt apt-get -qq update >/dev/null
  fi
  apt-cache policy 2>/dev/null | awk -v cn="$codename" '
    /^ *[0-9]+ [a-z]+:\/\// { uri = $2; suite = $3; next }
    /^ *release / {
      if (uri != "" && suite == cn "/main" && index($0, "o=Debian,") && index($0, ",l=Debian,") && index($0, "n=" cn ",")) { print uri; exit }
      uri = ""
    }'
}

# private_apt_options DIR: sets the array `aptopts` to an apt configuration of its own under DIR
# (sources DIR/etc/sources.list, lists, status and archive cache), makes those folders and an
# empty status file. The caller writes the sources and adds options (architectures) after.
private_apt_options() {
  local d=$1
  mkdir -p "$d/lists/partial" "$d/archives/partial" "$d/etc/sources.list.d" "$d/etc/preferences.d" "$d/cache"
  : > "$d/status"
  aptopts=(
    -o "Dir::Etc::SourceList=$d/etc/sources.list"
    -o "Dir::Etc::SourceParts=$d/etc/sources.list.d"
    -o "Dir::Etc::Preferences=$d/etc/preferences"
    -o "Dir::Etc::PreferencesParts=$d/etc/preferences.d"
    -o "Dir::State::Lists=$d/lists"
    -o "Dir::State::Status=$d/status"
    -o "Dir::Cache::Archives=$d/archives"
    -o "Dir::Cache=$d/cache"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
  )
}

# apt_install_quietly [apt-get install options...] PKG...: installs packages with the system's
# apt (after an update) without starting their services: a policy-rc.d, only if none exists,
# keeps the package scripts from starting them. One apt user at a time on this machine.
apt_install_quietly() {
  flock /var/lock/kunpeng-tap-apt sh -c '
    set -e
    own=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own=1
    fi
    rc=0
    { apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } || rc=$?
    [ "$own" = 1 ] && rm -f /usr/sbin/policy-rc.d
    exit $rc' sh "$@"
}

# apt_tool SCRIPT TOOL PACKAGE: unless TOOL is on PATH, installs Debian's PACKAGE from the
# system's own apt configuration (SCRIPT names the caller in what it prints); fails when TOOL
# is still missing then.
apt_tool() {
  local script=$1 tool=$2 package=$3 start
  command -v "$tool" >/dev/null 2>&1 && return 0
  echo "$script: installing Debian's $package package (for $tool)"
  start=$(date +%s)
  apt_install_quietly --no-install-recommends "$package"
  command -v "$tool" >/dev/null 2>&1 || {
    echo "$script: the $package package installed no $tool" >&2
    return 1
  }
  echo "$script: installed in $(( $(date +%s) - start ))s"
}
