//! Image builds shared by the e2e tests: the static agent and operator binaries the
//! Dockerfiles' `prebuilt` path copies (built once on the host, `target/image/<arch>/<bin>`), and a
//! docker-archive writer for `scratch` images made of such files, which `ctr images import`
//! loads into containerd without a Docker engine (the cluster tier).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::util::workspace_root;

/// This machine's glibc target (x86_64 here, aarch64 on Kunpeng).
pub fn triple() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// This machine's architecture as OCI names it (`amd64`, `arm64`): the folder under
/// `target/image/` the Dockerfiles' `prebuilt` path copies from (their `TARGETARCH`).
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    }
}

/// Whether an ELF file has no program interpreter (PT_INTERP), i.e. is statically linked.
pub fn is_static_elf(path: &Path) -> bool {
    let b = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        b.len() > 64 && &b[..4] == b"\x7fELF",
        "{} is no ELF",
        path.display()
    );
    assert_eq!(b[4], 2, "64-bit ELF expected");
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) != 3
    })
}

/// RUSTFLAGS of the static binaries (`hack/static-rustflags`, which hack/release.sh reads too):
/// its last line that is not a comment.
pub fn static_rustflags() -> &'static str {
    include_str!("../../hack/static-rustflags")
        .lines()
        .rfind(|l| !l.starts_with('#') && !l.trim().is_empty())
        .unwrap_or("-C target-feature=+crt-static")
        .trim()
}

/// Cargo profile of the image binaries: `release` (what the Dockerfiles ship) unless
/// `TAP_IMAGE_PROFILE=dev` trades image size for build time (CI budget).
pub fn image_profile() -> (String, &'static str) {
    match std::env::var("TAP_IMAGE_PROFILE").as_deref() {
        Ok("dev") => ("dev".into(), "debug"),
        _ => ("release".into(), "release"),
    }
}

/// Builds `bin` of `package` static on the host and copies it to `target/image/<arch>/<bin>`.
pub fn build_static(package: &str, bin: &str) -> PathBuf {
    let root = workspace_root();
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("image-build");
    let (profile, profile_dir) = image_profile();
    let start = Instant::now();
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--profile", &profile, "--locked", "-p", package])
        .args(["--bin", bin])
        .args(["--target", &triple()])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env(
            format!(
                "CARGO_TARGET_{}_RUSTFLAGS",
                triple().to_uppercase().replace('-', "_")
            ),
            static_rustflags(),
        )
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_PROFILE_DEV_STRIP", "symbols")
        .status()
        .expect("running cargo");
    assert!(status.success(), "cargo build -p {package} (static) failed");
    eprintln!(
        "built static {bin} ({profile}) in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    let built = target_dir.join(triple()).join(profile_dir).join(bin);
    assert!(
        is_static_elf(&built),
        "{} is not statically linked",
        built.display()
    );
    let dest = root.join("target/image").join(oci_arch()).join(bin);
    fs::create_dir_all(dest.parent().unwrap()).expect("target/image");
    fs::copy(&built, &dest).expect("copying the binary into target/image");
    dest
}

/// One file of an image: a host file, its path in the image and its mode.
pub struct ImageFile {
    pub source: PathBuf,
    pub dest: String,
    pub mode: u32,
}

/// Writes a docker-archive (`docker save` layout) of a `scratch` image with one layer per
/// group of `layers`, the given entrypoint and user, tagged `tag`; returns its path.
/// Deterministic (sorted names, mtime 0, uid/gid 0).
pub fn scratch_image_archive(
    out: &Path,
    tag: &str,
    layers: &[Vec<ImageFile>],
    entrypoint: &[&str],
    user: &str,
) -> anyhow::Result<PathBuf> {
    use anyhow::{ensure, Context};
    let work = out.with_extension("work");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(work.join("archive"))?;
    let sha256 = |p: &Path| -> anyhow::Result<String> {
        let o = Command::new("sha256sum").arg(p).output()?;
        ensure!(o.status.success(), "sha256sum {}", p.display());
        Ok(String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string())
    };
    let mut diff_ids = Vec::new();
    let mut layer_paths = Vec::new();
    for (i, files) in layers.iter().enumerate() {
        let root = work.join(format!("rootfs{i}"));
        for f in files {
            let dest = root.join(f.dest.trim_start_matches('/'));
            fs::create_dir_all(dest.parent().unwrap())?;
            if f.source.is_dir() {
                let st = Command::new("cp")
                    .arg("-a")
                    .arg(&f.source)
                    .arg(&dest)
                    .status()?;
                ensure!(st.success(), "cp -a {}", f.source.display());
            } else {
                fs::copy(&f.source, &dest)
                    .with_context(|| format!("copying {}", f.source.display()))?;
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(&dest, fs::Permissions::from_mode(f.mode))?;
            }
        }
        let tar = work.join(format!("layer{i}.tar"));
        let st = Command::new("tar")
            .args([
                "--sort=name",
                "--mtime=@0",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-C",
            ])
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()?;
        ensure!(st.success(), "tar of layer {i}");
        let diff = sha256(&tar)?;
        fs::create_dir_all(work.join("archive").join(&diff))?;
        fs::rename(&tar, work.join("archive").join(&diff).join("layer.tar"))?;
        layer_paths.push(format!("{diff}/layer.tar"));
        diff_ids.push(format!("sha256:{diff}"));
    }
    let config = serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": entrypoint, "User": user, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let cfg_path = work.join("config.json");
    fs::write(&cfg_path, serde_json::to_vec(&config)?)?;
    let cfg = sha256(&cfg_path)?;
    fs::rename(&cfg_path, work.join("archive").join(format!("{cfg}.json")))?;
    let manifest = serde_json::json!([{
        "Config": format!("{cfg}.json"),
        "RepoTags": [tag],
        "Layers": layer_paths,
    }]);
    fs::write(
        work.join("archive/manifest.json"),
        serde_json::to_vec(&manifest)?,
    )?;
    let st = Command::new("tar")
        .arg("-C")
        .arg(work.join("archive"))
        .arg("-cf")
        .arg(out)
        .arg(".")
        .status()?;
    ensure!(st.success(), "tar of the archive");
    let _ = fs::remove_dir_all(&work);
    Ok(out.to_path_buf())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_static_rustflags_are_the_files_last_line() {
        let flags = super::static_rustflags();
        assert_eq!(
            flags,
            "-C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs"
        );
    }
}
