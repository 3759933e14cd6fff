//! Builds the harness's two image archives for another architecture on the host and prints
//! `<pause archive>:<busybox archive>`, the value of `NRI_RESIZE_TEST_IMAGES` for a guest of
//! that architecture (the VM tier's arm64 guest has no compiler).
//!
//! Usage: `test_images <oci arch> <static busybox of that arch> <C compiler for that arch>`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [arch, busybox, gcc] = args.as_slice() else {
        eprintln!("usage: test_images <oci arch> <busybox binary> <C compiler>");
        std::process::exit(2);
    };
    let dir = std::env::var_os("NRI_RESIZE_CACHE")
        .map_or_else(
            || std::path::PathBuf::from("/var/cache/nri-resize"),
            std::path::PathBuf::from,
        )
        .join("images");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("create {}: {e}", dir.display());
        std::process::exit(1);
    }
    let a = nri_resize_tests::build_archives(
        &dir,
        std::path::Path::new(gcc),
        std::path::Path::new(busybox),
        arch,
    );
    println!("{}:{}", a.pause.display(), a.busybox.display());
}
