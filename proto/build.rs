//! Generates the NRI bindings into `OUT_DIR` on every build; the output is never checked in.
use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=nri/api.proto");
    Codegen::new()
        .out_dir(&out)
        .inputs(["nri/api.proto"])
        .include("nri")
        .rust_protobuf()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .run()
        .expect("ttrpc-codegen failed on nri/api.proto");
    // Generated files carry inner attributes, so they are included as modules (paths resolve
    // relative to OUT_DIR), not pasted with include!.
    std::fs::write(
        format!("{out}/mod.rs"),
        "pub mod api;\npub mod api_ttrpc;\n",
    )
    .expect("write OUT_DIR/mod.rs");
}
