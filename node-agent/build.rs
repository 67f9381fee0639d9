//! Generates the NRI messages and ttrpc services from `proto/nri.proto` with a pure-Rust
//! parser (no `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/nri.proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    ttrpc_codegen::Codegen::new()
        .out_dir(&out)
        .inputs(["proto/nri.proto"])
        .include("proto")
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ttrpc_codegen::ProtobufCustomize::default().gen_mod_rs(false))
        .run()
        .map_err(|e| format!("generating NRI code from proto/nri.proto: {e}"))?;
    // The generated files carry inner attributes, so they are mounted as modules by path
    // rather than `include!`d.
    let module = |name: &str| {
        format!(
            "#[path = {:?}]\npub mod {name};\n",
            out.join(format!("{name}.rs")).display().to_string()
        )
    };
    std::fs::write(
        out.join("nri_modules.rs"),
        module("nri") + &module("nri_ttrpc"),
    )
    .map_err(|e| format!("writing nri_modules.rs: {e}"))?;
    Ok(())
}
