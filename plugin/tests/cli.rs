//! The `nri-resize` binary on bad input: it must say what is wrong and exit non-zero.

use std::process::Command;

fn nri_resize(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nri-resize"))
        .args(args)
        .output()
        .expect("run nri-resize");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn a_config_that_does_not_parse_stops_the_daemon_with_its_path_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "jurnal_size = 3\n").expect("write config");
    let api = dir.path().join("api.sock");
    let (code, text) = nri_resize(&[
        "run",
        "--config",
        cfg.to_str().expect("utf8"),
        "--nri-socket",
        "/nonexistent/nri.sock",
        "--api-socket",
        api.to_str().expect("utf8"),
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("bad.toml") && text.contains("jurnal_size"),
        "error names the file and the key:\n{text}"
    );
}

#[test]
fn a_bad_plugin_index_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = dir.path().join("api.sock");
    let (code, text) = nri_resize(&[
        "run",
        "--plugin-idx",
        "7",
        "--nri-socket",
        "/nonexistent/nri.sock",
        "--api-socket",
        api.to_str().expect("utf8"),
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("two digits"), "{text}");
}

#[test]
fn status_without_a_daemon_explains_itself() {
    let (code, text) = nri_resize(&["status", "--api-socket", "/nonexistent/api.sock"]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("cannot reach the nri-resize API") && text.contains("/nonexistent/api.sock"),
        "{text}"
    );
}

#[test]
fn update_without_anything_to_change_is_refused() {
    let (code, text) = nri_resize(&["update", "abc", "--api-socket", "/nonexistent/api.sock"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("nothing to update"), "{text}");
}
