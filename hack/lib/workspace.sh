# Sourced by the scripts that name release artifacts (hack/release.sh, hack/build-images.sh).

# The workspace's version: [workspace.package] version in the root Cargo.toml (run from the
# checkout's root). Prints nothing when there is none.
workspace_version() {
  awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{gsub(/[" ]/, "", $0); sub(/^version=/, "", $0); print; exit}' Cargo.toml
}
