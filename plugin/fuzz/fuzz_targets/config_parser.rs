//! The plugin configuration parser (runtime-provided text is untrusted input). Properties that
//! can fail, not the parser against itself:
//! - whatever parses is within every documented bound;
//! - it round-trips: written back as TOML, it parses to the same configuration;
//! - a top-level key the configuration does not know is refused;
//! - the runtime's overlay never changes what cannot change while running (`[capacity]`), and
//!   keeps the file's keys it does not name.
#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nri_resize::config::Config;
use nri_resize::policy::Share;

/// From the configuration itself: a new section is known as soon as it exists.
static KNOWN: LazyLock<Vec<String>> = LazyLock::new(Config::top_level_keys);

fn is_share(s: Share) -> bool {
    (0.0..=1.0).contains(&s.get())
}

fuzz_target!(|text: &str| {
    let parsed = Config::parse(text, "fuzz");
    if let Ok(table) = text.parse::<toml::Table>() {
        if table.keys().any(|k| !KNOWN.contains(k)) {
            assert!(parsed.is_err(), "an unknown key was accepted: {text:?}");
        }
    }
    let Ok(cfg) = parsed else {
        return;
    };
    assert!((1..=1_000_000).contains(&cfg.journal_size));
    assert!((1..=100).contains(&cfg.resize.max_attempts));
    assert!(cfg.resize.step_pause_ms <= 60_000);
    assert!(cfg.resize.reserved_cpu_millicores <= 100_000_000);
    let md = &cfg.memory_decrease;
    assert!((1_000..=3_600_000).contains(&md.timeout_ms));
    assert!(md.inline_max <= 4 << 30);
    assert!((1..=10_000).contains(&md.step_interval_ms) && md.headroom <= 64 << 30);
    assert!(is_share(md.max_stall));
    let resync = cfg.capacity.resync_interval;
    assert!(resync >= Duration::from_secs(1) && resync <= Duration::from_secs(3600));
    let v = &cfg.verdict;
    assert!(v.window >= Duration::from_secs(1) && v.window <= Duration::from_secs(3600));
    assert!(is_share(v.cpu_stall_increase));
    assert!(is_share(v.memory_stall_increase));
    assert!(is_share(v.throttle_increase));

    let written = toml::to_string(&cfg).expect("a parsed configuration serializes");
    let again = Config::parse(&written, "fuzz round trip")
        .unwrap_or_else(|e| panic!("written back it does not parse: {e}\n{written}"));
    assert_eq!(cfg, again, "round trip changed it:\n{written}");

    let file = Config::default();
    if let Ok((over, _ignored)) = file.runtime_overlay(text, "fuzz runtime") {
        assert_eq!(over.capacity, file.capacity, "the runtime changed [capacity]");
        if !text.contains("journal_size") {
            assert_eq!(over.journal_size, file.journal_size);
        }
    }
});
