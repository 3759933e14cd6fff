//! Builds the tests' independent Go NRI plugin (`tests/go-plugin`, see `nri_resize_tests::go_plugin`)
//! into the cache and prints its path. The VM tier runs this on the host first: in a guest the
//! cache is read-only, so the suites there find the binary built already.

fn main() {
    println!("{}", nri_resize_tests::go_plugin_binary().display());
}
