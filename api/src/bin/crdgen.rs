//! Writes the CRD YAML: `crdgen` prints every CRD (multi-document YAML); `crdgen DIR...` writes
//! one file per CRD into each DIR (e.g. `crds charts/kunpeng-tap/crds`).

fn main() -> std::process::ExitCode {
    let files = match tap_api::crd_files() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let dirs: Vec<String> = std::env::args().skip(1).collect();
    if dirs.is_empty() {
        for (_, yaml) in &files {
            println!("---\n{}", yaml.trim_end());
        }
        return std::process::ExitCode::SUCCESS;
    }
    for dir in &dirs {
        for (name, yaml) in &files {
            let path = std::path::Path::new(dir).join(name);
            if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, yaml)) {
                eprintln!("crdgen: writing {}: {e}", path.display());
                return std::process::ExitCode::FAILURE;
            }
            eprintln!("wrote {}", path.display());
        }
    }
    std::process::ExitCode::SUCCESS
}
