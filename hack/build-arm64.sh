#!/usr/bin/env bash
# Builds the release agent (`kunpeng-tap`) and operator (`kunpeng-tap-operator`) for arm64
# (Kunpeng) as static aarch64-unknown-linux-musl binaries with Debian trixie's Rust toolchain,
# in a trixie chroot kept under /var/cache/kunpeng-tap/arm64; with --test, also tests them
# under qemu-user. Run as root from anywhere in the checkout.
#
#   bash hack/build-arm64.sh [--agent-only] [--test] [--copy-to DIR]
#     --agent-only   build only kunpeng-tap (env TAP_ARM64_AGENT_ONLY=1 does the same)
#     --test         then run tap-engine's and node-agent's tests for aarch64 under qemu-user,
#                    check that the binaries are static aarch64 ELF files, and compare the arm64
#                    agent's --explain with the amd64 release agent's (built with the host's
#                    cargo into its usual target dir), byte for byte, on the Kunpeng 920-shaped
#                    fixtures in FIXTURES below
#     --amd64-profile dev|release   the amd64 agent --test compares with (default release;
#                    the test tier uses dev, which its unit tier has built already)
#     --dev-agent    with --test: no release build; the agent checked, run and compared is the
#                    tests' own (dev profile, also static musl) build. CI's arm64 tier: the
#                    release build (about 17 min cold on 2 cores) adds nothing its tests check
#     --copy-to DIR  copy the stripped binaries to DIR as well
#     --guest        also build what the arm64 NUMA guest runs (e2e/tests/numa_vm.rs) after the
#                    tests' build: tap-e2e's numa_vm test (its CRI client and checks run in the
#                    guest) and tap-touch, copied with the tests' agent to $OUT/guest/; implies
#                    --dev-agent. Without --test: those builds only, nothing run (setup-vm.sh)
#
# Output (stripped): /var/cache/kunpeng-tap/arm64/out/{kunpeng-tap,kunpeng-tap-operator}.
# Cache: /var/cache/kunpeng-tap/arm64/{chroot,target,cargo,out} (env TAP_ARM64_CACHE moves it).
# A rebuild with nothing changed takes seconds; the first run makes the chroot (about 2 min)
# and compiles std and every dependency (see docs/design/build-and-test.md, "arm64 (Kunpeng)").
#
# Toolchain: trixie's rustc-web/cargo-web (Rust 1.96; trixie's plain `rustc` is 1.85, older than
# the lock file needs) with libstd-rust-web-dev:arm64 (aarch64 *glibc* std). Debian ships no
# musl std for aarch64, so std is compiled from rust-web-src with cargo's `-Zbuild-std`. That is
# an unstable cargo feature: a stable cargo accepts -Z flags only with RUSTC_BOOTSTRAP=1, and its
# flags and behaviour may change from one Rust release to the next. So it is pinned:
#   - the toolchain: the chroot must have Rust $RUST_SERIES (below), and rustc-web, cargo-web,
#     rust-web-src and libstd-rust-web-dev:arm64 must come from one Debian source version (std's
#     source must be exactly the compiler's); anything else stops the build with a message. The
#     chroot is made once and never upgraded, so its toolchain stays as it was checked; when
#     trixie moves on, a new chroot fails here until $RUST_SERIES is raised and this build and
#     its tests (--test) pass again with it.
#   - std's own dependencies: exactly the versions in rust-web-src's library/Cargo.lock.
# The linker is musl-dev:arm64's aarch64-linux-musl-gcc (the cross gcc with musl's specs).
# std's unwinder links `-lunwind` statically on musl, and Debian has none for musl: we give it
# the cross gcc's libgcc_eh.a plus `_dl_find_object` (gcc 14's libgcc_eh, built for glibc, asks
# glibc for an address's unwind tables with it; musl has no such function), written here with
# dl_iterate_phdr. The agent catches panics (a failing hook fails open), so unwinding must work:
# its tests under qemu check it.
set -euo pipefail

RUST_SERIES=1.96
TARGET=aarch64-unknown-linux-musl
CACHE=${TAP_ARM64_CACHE:-/var/cache/kunpeng-tap/arm64}
ROOT=$CACHE/chroot
OUT=$CACHE/out
# Packages of the chroot (trixie main). Changing the list: bump CHROOT_STAMP.
PKGS=(
  rustc-web cargo-web libstd-rust-web-dev:arm64 rust-web-src  # Rust 1.96, std's source
  gcc-aarch64-linux-gnu musl-dev:arm64                        # C compiler/linker, musl libc
  qemu-user protobuf-compiler ca-certificates file            # test runner, k8s-cri's protoc
)
CHROOT_STAMP=.kunpeng-tap-chroot-v1
UNWIND_STAMP=/opt/musl-unwind/.v1
# Where the caches appear inside the chroot; the checkout appears at its own path (C_SRC, set
# below), so paths in messages are the host's.
C_TARGET=/tap/target
C_CARGO=/tap/cargo
FIXTURES=(synthetic-2s-4numa-96c-gpu synthetic-2s-4numa-32c-8npu-bmc synthetic-2s-4numa-96c-kunpeng920)

ARGS=("$@")
agent_only=${TAP_ARM64_AGENT_ONLY:-0}
run_tests=0
copy_to=
amd64_profile=release
dev_agent=0
guest=0
while [ $# -gt 0 ]; do
  case "$1" in
    --agent-only) agent_only=1 ;;
    --test) run_tests=1 ;;
    --copy-to) copy_to=${2:?--copy-to needs a directory}; shift ;;
    --amd64-profile) amd64_profile=${2:?--amd64-profile needs dev or release}; shift ;;
    --dev-agent) dev_agent=1 ;;
    --guest) guest=1 ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "build-arm64: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

[ "$dev_agent" = 0 ] || [ "$run_tests" = 1 ] || {
  echo "build-arm64: --dev-agent goes with --test" >&2
  exit 2
}
[ "$dev_agent" = 0 ] || agent_only=1
# --guest: the agent is the tests' build's (as --dev-agent); without --test nothing is run.
[ "$guest" = 0 ] || { dev_agent=1; agent_only=1; }

SRC=$(cd "$(dirname "$0")/.." && pwd -P)
C_SRC=$SRC
say() { echo "build-arm64: $*"; }
die() { echo "build-arm64: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (chroot, mounts)"
[ "$(uname -m)" = x86_64 ] || die "runs on an x86_64 (amd64) Debian host; this is $(uname -m)"
case "$SRC" in
  / | /usr | /usr/* | /etc* | /proc* | /dev* | /sys* | /tap* | /bin* | /sbin* | /lib* | /opt/musl-unwind*)
    die "the checkout ($SRC) is in a path the chroot uses itself" ;;
esac

# Everything below runs in a private mount namespace: the bind mounts into the chroot vanish
# with this process, whatever way it ends, and nobody else sees them.
if [ -z "${TAP_ARM64_IN_NS:-}" ]; then
  mkdir -p "$CACHE"
  exec unshare --mount --propagation private env TAP_ARM64_IN_NS=1 bash "$0" ${ARGS[@]+"${ARGS[@]}"}
fi
# One build at a time per cache.
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  say "waiting for another build-arm64 run ($CACHE/.lock)"
  flock 9
fi

T0=$SECONDS
phase_start=$SECONDS
timings=()
phase() { # phase NAME: closes the previous phase's timing
  local now=$SECONDS
  [ -n "${cur_phase:-}" ] && timings+=("$(printf '%-28s %4d s' "$cur_phase" $((now - phase_start)))")
  cur_phase=$1
  phase_start=$now
  [ -n "$1" ] && say "== $1"
  return 0
}
print_timings() {
  phase ""
  say "timings:"
  printf '  %s\n' "${timings[@]}"
  say "total $((SECONDS - T0)) s"
}

# debian_archive: the mirror comes from this system's apt configuration.
. "$SRC/hack/lib/debian-apt.sh"

# --- the chroot ---------------------------------------------------------------------------------
phase chroot
if [ ! -e "$ROOT/$CHROOT_STAMP" ]; then
  if ! command -v mmdebstrap >/dev/null; then
    say "installing mmdebstrap"
    flock /var/lock/kunpeng-tap-apt sh -c \
      'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap' >/dev/null
  fi
  archive=$(debian_archive)
  [ -n "$archive" ] || die "no Debian archive in this system's apt sources"
  say "creating a trixie chroot (amd64 + arm64) from $archive"
  rm -rf "$ROOT" "$ROOT.new"
  nice -n 19 mmdebstrap --quiet --variant=apt --architectures=amd64,arm64 \
    --aptopt='APT::Install-Recommends "false"' \
    --include="$(IFS=,; echo "${PKGS[*]}")" trixie "$ROOT.new" "$archive"
  printf '%s\n' "${PKGS[@]}" > "$ROOT.new/$CHROOT_STAMP"
  mv "$ROOT.new" "$ROOT"
fi

# The pin (see the head of this file).
versions=$(chroot "$ROOT" dpkg-query -W -f '${Package}:${Architecture} ${source:Version}\n' \
  rustc-web cargo-web rust-web-src libstd-rust-web-dev:arm64)
if [ "$(awk '{print $2}' <<<"$versions" | sort -u | wc -l)" != 1 ]; then
  die "the chroot's Rust packages are not from one source version:
$versions"
fi
rustc_v=$(chroot "$ROOT" rustc -V)
case "$rustc_v" in
  "rustc $RUST_SERIES".*) ;;
  *) die "the chroot has $rustc_v, this script is pinned to Rust $RUST_SERIES (-Zbuild-std is
unstable). Check this build and --test with the new toolchain, then raise RUST_SERIES in
$0 (or remove $ROOT to make a fresh chroot)." ;;
esac
say "$rustc_v, Debian $(awk 'NR==1{print $2}' <<<"$versions")"

# This host's extra CA certificates (a TLS-intercepting egress, where there is one), for
# cargo's downloads inside the chroot.
certs_changed=0
for c in /usr/local/share/ca-certificates/*.crt; do
  [ -e "$c" ] || continue
  d="$ROOT/usr/local/share/ca-certificates/$(basename "$c")"
  cmp -s "$c" "$d" || { cp "$c" "$d"; certs_changed=1; }
done
[ "$certs_changed" = 0 ] || chroot "$ROOT" update-ca-certificates >/dev/null 2>&1

# The unwinder for musl: /opt/musl-unwind/libunwind.a = libgcc_eh.a + _dl_find_object.
if [ ! -e "$ROOT$UNWIND_STAMP" ]; then
  say "making /opt/musl-unwind/libunwind.a"
  mkdir -p "$ROOT/opt/musl-unwind"
  cat > "$ROOT/opt/musl-unwind/dl_find_object.c" <<'EOF'
/* _dl_find_object for static musl programs, as gcc 14's libgcc_eh (_Unwind_Find_FDE) calls it:
 * find the loaded object holding `pc` and its PT_GNU_EH_FRAME (.eh_frame_hdr). The struct is
 * glibc's layout on aarch64 (no dlfo_eh_dbase, no dlfo_eh_count). Returns 0, or -1 when no
 * object holds pc. */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>

struct dl_find_object {
  unsigned long long dlfo_flags;
  void *dlfo_map_start;
  void *dlfo_map_end;
  struct link_map *dlfo_link_map;
  void *dlfo_eh_frame;
  unsigned long long dlfo_reserved[7];
};

struct query {
  uintptr_t pc;
  struct dl_find_object *result;
};

static int visit(struct dl_phdr_info *info, size_t size, void *arg) {
  struct query *q = arg;
  uintptr_t start = UINTPTR_MAX, end = 0;
  void *eh_frame = 0;
  int holds_pc = 0;
  (void)size;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD) {
      uintptr_t hi = lo + ph->p_memsz;
      holds_pc |= q->pc >= lo && q->pc < hi;
      start = lo < start ? lo : start;
      end = hi > end ? hi : end;
    } else if (ph->p_type == PT_GNU_EH_FRAME) {
      eh_frame = (void *)lo;
    }
  }
  if (!holds_pc)
    return 0;
  q->result->dlfo_flags = 0;
  q->result->dlfo_map_start = (void *)start;
  q->result->dlfo_map_end = (void *)end;
  q->result->dlfo_link_map = 0;
  q->result->dlfo_eh_frame = eh_frame;
  return 1;
}

int _dl_find_object(void *pc, struct dl_find_object *result) {
  struct query q = {(uintptr_t)pc, result};
  return dl_iterate_phdr(visit, &q) ? 0 : -1;
}
EOF
  chroot "$ROOT" sh -euc '
    cd /opt/musl-unwind
    eh=$(aarch64-linux-gnu-gcc -print-file-name=libgcc_eh.a)
    [ -f "$eh" ] || { echo "no libgcc_eh.a for aarch64" >&2; exit 1; }
    aarch64-linux-musl-gcc -O2 -fPIC -Wall -Werror -c dl_find_object.c -o dl_find_object.o
    cp "$eh" libunwind.a.new
    aarch64-linux-gnu-ar rs libunwind.a.new dl_find_object.o 2>/dev/null
    mv libunwind.a.new libunwind.a'
  touch "$ROOT$UNWIND_STAMP"
fi

# --- mounts (private to this process) ------------------------------------------------------------
mkdir -p "$CACHE/target" "$CACHE/cargo" "$OUT" "$ROOT$C_SRC" "$ROOT$C_TARGET" "$ROOT$C_CARGO"
mount --bind "$SRC" "$ROOT$C_SRC"
mount -o remount,bind,ro "$ROOT$C_SRC"
mount --bind "$CACHE/target" "$ROOT$C_TARGET"
mount --bind "$CACHE/cargo" "$ROOT$C_CARGO"
mount -t proc proc "$ROOT/proc"
mount --bind /dev "$ROOT/dev"

# One target dir serves every checkout (dependencies are built once). Cargo judges a workspace
# crate fresh when its artifact is newer than its sources: after a build from another checkout
# with newer files, an older checkout's crates would pass for built. So when the checkout is not
# the one built last, the workspace crates' fingerprints go and they are compiled again.
last_src=$(cat "$CACHE/target/.last-checkout" 2>/dev/null || true)
if [ "$last_src" != "$SRC" ]; then
  for toml in "$SRC"/*/Cargo.toml; do
    n=$(awk -F'"' '/^name = /{print $2; exit}' "$toml")
    [ -n "$n" ] || continue
    find "$CACHE/target" -maxdepth 4 -type d -path '*/.fingerprint/*' \
      -name "$n-????????????????" -exec rm -rf {} +
  done
  [ -z "$last_src" ] || say "last built from $last_src: the workspace's crates are rebuilt for $SRC"
  echo "$SRC" > "$CACHE/target/.last-checkout"
fi

# Runs a command in the chroot, in the checkout, with a clean environment.
in_chroot() {
  local pass=()
  for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY CARGO_TERM_COLOR; do
    [ -z "${!v:-}" ] || pass+=("$v=${!v}")
  done
  chroot "$ROOT" /usr/bin/env -i -C "$C_SRC" HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 CARGO_HOME="$C_CARGO" CARGO_TARGET_DIR="$C_TARGET" "${pass[@]}" "$@"
}
T=${TARGET^^}
T=${T//-/_}
CARGO_ENV=(
  RUSTC_BOOTSTRAP=1 # lets a stable cargo take -Zbuild-std (see the head of this file)
  # The tests' (dev profile) build: no debug info and no incremental state, which halve its
  # time and disk; the release profile is the workspace's own.
  CARGO_PROFILE_DEV_DEBUG=0
  CARGO_INCREMENTAL=0
  "CARGO_TARGET_${T}_LINKER=aarch64-linux-musl-gcc"
  "CC_${TARGET//-/_}=aarch64-linux-musl-gcc"
  "AR_${TARGET//-/_}=aarch64-linux-gnu-ar"
  # musl's own crt objects and libc come with the gcc wrapper; the unwinder from /opt/musl-unwind.
  # (The binary is a non-PIE static executable: no relocations at start-up, so nothing to pack
  # as hack/static-rustflags does for amd64's static-pie.)
  "CARGO_TARGET_${T}_RUSTFLAGS=-C link-self-contained=no -L native=/opt/musl-unwind"
  "CARGO_TARGET_${T}_RUNNER=qemu-aarch64"
)
cargo_t() { # cargo SUBCOMMAND ARGS... for the musl target, std built from source
  local sub=$1
  shift
  in_chroot "${CARGO_ENV[@]}" nice -n 19 cargo "$sub" --locked --target "$TARGET" \
    -Zbuild-std=std,panic_abort "$@"
}

# --- build ---------------------------------------------------------------------------------------
# copy_guest_programs PROFILE_DIR: the numa_vm test binary (from the build's JSON messages),
# tap-touch and the agent, into $OUT/guest.
copy_guest_programs() {
  local exe
  exe=$(grep -o '"executable":"[^"]*/numa_vm-[0-9a-f]*"' "$OUT/guest-build.json" | tail -1 | cut -d'"' -f4)
  [ -n "$exe" ] || die "the tests' build made no numa_vm test binary"
  mkdir -p "$OUT/guest"
  cp "$CACHE/target/${exe#"$C_TARGET"/}" "$OUT/guest/numa_vm.new"
  cp "$CACHE/target/$TARGET/$1/tap-touch" "$OUT/guest/tap-touch.new"
  cp "$OUT/kunpeng-tap" "$OUT/guest/kunpeng-tap.new"
  for b in numa_vm tap-touch kunpeng-tap; do
    mv "$OUT/guest/$b.new" "$OUT/guest/$b"
    say "$OUT/guest/$b: $(stat -c %s "$OUT/guest/$b") bytes"
  done
}

# The agent and the operator in two invocations: together, Cargo would unify their kube
# features, and the agent would differ from (and rebuild after) an --agent-only build.
# Doc tests left out (--lib --bins --tests): rustdoc links them outside the chroot's musl sysroot
# (no crt1.o there); they are the same on every target and the unit tier runs them on amd64.
TEST_ARGS=(-p tap-engine -p node-agent --lib --bins --tests)
[ "${TAP_ARM64_TEST_PROFILE:-test}" != release ] || TEST_ARGS+=(--release)
if [ "$dev_agent" = 1 ]; then
  # The tests' build makes the agent too (its integration tests run it).
  phase "tests under qemu (build, the agent included)"
  cargo_t test --no-run "${TEST_ARGS[@]}"
  test_dir=debug
  [ "${TAP_ARM64_TEST_PROFILE:-test}" != release ] || test_dir=release
  cp "$CACHE/target/$TARGET/$test_dir/kunpeng-tap" "$OUT/kunpeng-tap"
  if [ "$guest" = 1 ]; then
    # A `cargo test` build as well: -Zbuild-std builds std differently for `cargo build`, which
    # would compile every dependency again. Its own invocation, as target selection (--test)
    # applies to every package named: the e2e crate's dev-dependency tap-operator turns on
    # more of kube's features, so kube's crates and those above them (node-agent's library)
    # are compiled a second time, beside the tests' own.
    phase "the arm64 NUMA guest's programs (build)"
    cargo_t test --no-run --message-format=json-render-diagnostics -p tap-e2e --test numa_vm \
      > "$OUT/guest-build.json"
    copy_guest_programs "$test_dir"
  fi
  bins=(kunpeng-tap)
  if [ -n "$copy_to" ]; then
    mkdir -p "$copy_to"
    cp "$OUT/kunpeng-tap" "$copy_to/kunpeng-tap"
  fi
else
  phase "build kunpeng-tap"
  cargo_t build --release -p node-agent --bin kunpeng-tap
  bins=(kunpeng-tap)
  if [ "$agent_only" != 1 ]; then
    phase "build kunpeng-tap-operator"
    cargo_t build --release -p tap-operator --bin kunpeng-tap-operator
    bins+=(kunpeng-tap-operator)
  fi
  phase "strip"
  for b in "${bins[@]}"; do
    in_chroot aarch64-linux-gnu-strip -o "$C_TARGET/$b.stripped" "$C_TARGET/$TARGET/release/$b"
    mv "$CACHE/target/$b.stripped" "$OUT/$b"
    say "$OUT/$b: $(stat -c %s "$OUT/$b") bytes ($(stat -c %s "$CACHE/target/$TARGET/release/$b") unstripped)"
    if [ -n "$copy_to" ]; then
      mkdir -p "$copy_to"
      cp "$OUT/$b" "$copy_to/$b"
    fi
  done
fi
[ -z "$copy_to" ] || say "copied to $copy_to"

if [ "$run_tests" != 1 ]; then
  print_timings
  exit 0
fi

# --- tests ---------------------------------------------------------------------------------------
phase "check binaries"
for b in "${bins[@]}"; do
  desc=$(chroot "$ROOT" file -b - < "$OUT/$b") # the chroot's file(1): the host may have none
  echo "  $b: $desc"
  case "$desc" in
    *"ARM aarch64"*) ;;
    *) die "$b is not an aarch64 ELF file" ;;
  esac
  case "$desc" in
    *"statically linked"* | *"static-pie linked"*) ;;
    *) die "$b is not statically linked" ;;
  esac
  "$ROOT/usr/bin/qemu-aarch64" "$OUT/$b" --version >/dev/null || die "$b --version failed under qemu"
done

if [ "$dev_agent" = 0 ]; then
  phase "tests under qemu (build)"
  cargo_t test --no-run "${TEST_ARGS[@]}"
fi

phase "tests under qemu (run)"
# Cargo runs each test binary with qemu-aarch64 (its target runner). Some tests start the agent
# binary themselves (CARGO_BIN_EXE_kunpeng-tap): for those the kernel needs a binfmt_misc
# handler for aarch64. Unless one is there already, one is registered for the tests (the
# chroot's static qemu-aarch64, opened at registration: flag F) and removed afterwards.
BINFMT=/proc/sys/fs/binfmt_misc
BINFMT_NAME=kunpeng-tap-aarch64
binfmt_off() { [ ! -e "$BINFMT/$BINFMT_NAME" ] || echo -1 > "$BINFMT/$BINFMT_NAME"; }
binfmt_off # a stale one from a killed run (this run holds the cache's lock)
[ -e "$BINFMT/register" ] || mount -t binfmt_misc binfmt_misc "$BINFMT" # private mount
if "$OUT/kunpeng-tap" --version >/dev/null 2>&1; then
  say "this kernel already runs aarch64 binaries (binfmt_misc)"
else
  trap binfmt_off EXIT
  printf '%s' ":$BINFMT_NAME:M::\\x7fELF\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00:\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff:$ROOT/usr/bin/qemu-aarch64:F" \
    > "$BINFMT/register"
  "$OUT/kunpeng-tap" --version >/dev/null || die "aarch64 binaries do not run through binfmt_misc"
  say "registered binfmt_misc handler $BINFMT_NAME for the tests"
fi
# The readme_commands tests run the README's `cargo run` lines for the build host (amd64, a
# build of its own) and hack/test.sh: not arm64 tests; the unit tier runs them.
cargo_t test "${TEST_ARGS[@]}" -- --skip readme_commands:: 2>&1 |
  tee "$OUT/tests.log"
awk '/^test result:/ { p += $4; f += $6; s += $8 + $12 }
  END { printf "build-arm64: aarch64 tests under qemu: %d passed, %d failed, %d skipped\n", p, f, s }' \
  "$OUT/tests.log"
binfmt_off
trap - EXIT

phase "--explain arm64 vs amd64"
# The amd64 agent, built with the host's own toolchain into its usual target dir.
case "$amd64_profile" in
  release) (cd "$SRC" && nice -n 19 cargo build -q --release --locked -p node-agent --bin kunpeng-tap)
    amd64_bin="${CARGO_TARGET_DIR:-$SRC/target}/release/kunpeng-tap" ;;
  dev) (cd "$SRC" && nice -n 19 cargo build -q --locked -p node-agent --bin kunpeng-tap)
    amd64_bin="${CARGO_TARGET_DIR:-$SRC/target}/debug/kunpeng-tap" ;;
  *) die "--amd64-profile: dev or release, not $amd64_profile" ;;
esac
[ -x "$amd64_bin" ] || die "$amd64_bin missing after cargo build"
qemu="$ROOT/usr/bin/qemu-aarch64" # a static binary: runs on the host too
for f in "${FIXTURES[@]}"; do
  args=(--sysfs-root "fixtures/sysfs/$f" --explain)
  # The CPU model comes from the fixture (midr_el1, or its proc/cpuinfo), never from the host's
  # /proc/cpuinfo, which qemu-user rewrites for an arm64 process.
  if [ -d "$SRC/fixtures/proc/$f" ]; then
    args+=(--proc-root "fixtures/proc/$f")
  else
    mkdir -p "$OUT/no-proc" && args+=(--proc-root "$OUT/no-proc")
  fi
  # Both run here, from the checkout's root, with the same clean environment.
  # stdout is compared; the log (stderr, with timestamps) is kept beside it.
  for arch in arm64 amd64; do
    if [ $arch = arm64 ]; then run=("$qemu" "$OUT/kunpeng-tap"); else run=("$amd64_bin"); fi
    (cd "$SRC" && env -i PATH=/usr/bin:/bin NO_COLOR=1 "${run[@]}" "${args[@]}") \
      > "$OUT/explain-$f.$arch.txt" 2> "$OUT/explain-$f.$arch.log" ||
      die "$arch kunpeng-tap ${args[*]} failed: see $OUT/explain-$f.$arch.log"
  done
  if ! cmp -s "$OUT/explain-$f.arm64.txt" "$OUT/explain-$f.amd64.txt"; then
    diff -u "$OUT/explain-$f.amd64.txt" "$OUT/explain-$f.arm64.txt" | head -40 >&2 || true
    die "--explain on $f differs between arm64 and amd64"
  fi
  say "--explain on $f: identical on arm64 and on amd64 (its $amd64_profile build; $(wc -l < "$OUT/explain-$f.arm64.txt") lines, $(stat -c %s "$OUT/explain-$f.arm64.txt") bytes; $OUT/explain-$f.arm64.txt)"
done
print_timings
