//! Prints the folder of a sysfs fixture, written out once under the Cargo target directory
//! ([`tap_engine::testdata::materialised`]), for scripts that need a directory rather than the
//! fixture's dump file: hack/bench-ir.sh measures on it, so that the measured process reads the
//! fixture as it reads `/sys` and nothing else.
//!
//! `fixture_dir NAME` (a file name under fixtures/sysfs)

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name] = args.as_slice() else {
        eprintln!("usage: fixture_dir NAME");
        return std::process::ExitCode::from(2);
    };
    match tap_engine::testdata::materialised(name) {
        Ok(dir) => {
            println!("{}", dir.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fixture {name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
