//! One benchmark table for `cargo xtask bench`, and the one source of `docs/benchmarks.md`'s table.
//!
//! Each benchmark appends its rows here as JSON lines (to the file named by
//! `NRI_RESIZE_BENCH_TABLE`, when set). `cargo xtask bench` names each row with the benchmark
//! that wrote it (a benchmark that writes none fails the run), adds when, at which commit, on
//! which kernel and runtimes it ran, and writes the whole as [`RESULTS_PATH`], committed. The
//! docs/benchmarks.md's benchmark table is [`render_results`] of that file, between [`BEGIN`] and [`END`];
//! the unit test `the_readme_carries_the_bench_results` keeps the two in step, and rewrites the
//! docs/benchmarks.md's block itself when run with `NRI_RESIZE_BLESS=1` (which `cargo xtask bench` does).

use std::fmt::Write as _;
use std::io::Write as _;

use serde::{Deserialize, Serialize};

/// Where rows go (set by `cargo xtask bench`).
pub const ENV: &str = "NRI_RESIZE_BENCH_TABLE";

/// The committed results file, relative to the workspace root.
pub const RESULTS_PATH: &str = "docs/bench-results.json";

/// docs/benchmarks.md's table is what lies between these two lines.
pub const BEGIN: &str =
    "<!-- bench-results: rendered from docs/bench-results.json by `cargo xtask bench`; do not edit by hand -->";
pub const END: &str = "<!-- /bench-results -->";

/// One measured row, with its baseline measured in the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// The benchmark that wrote the row (filled in by `cargo xtask bench`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bench: String,
    pub measure: String,
    /// The baseline and its value (`no-op handler: 0.7 µs p99`).
    pub baseline: String,
    pub ours: String,
    /// Ours / baseline, where the two are the same quantity.
    pub ratio: Option<f64>,
    /// The target and whether it is met (`p99 < 1 ms: met`).
    pub target: String,
}

/// A whole `cargo xtask bench` run: where and when, and every row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    /// UTC, `2026-11-23 21:40 UTC`.
    pub date: String,
    /// `git describe`-like: the commit, `-dirty` when the tree had changes.
    pub commit: String,
    /// `uname -r`.
    pub kernel: String,
    /// The container runtimes the benchmarks drove, with their versions.
    pub runtimes: Vec<String>,
    /// CPUs and load while measuring (the machines are shared).
    pub machine: String,
    pub rows: Vec<BenchRow>,
}

/// Appends `row` to the table file, if one is set; a write error is printed, never fatal.
pub fn report(row: &BenchRow) {
    let Some(path) = std::env::var_os(ENV) else {
        return;
    };
    let line = match serde_json::to_string(row) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bench table: {e}");
            return;
        }
    };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        eprintln!("bench table {}: {e}", path.to_string_lossy());
    }
}

/// Shorthand for [`report`].
pub fn row(measure: &str, baseline: &str, ours: &str, ratio: Option<f64>, target: &str) {
    report(&BenchRow {
        bench: String::new(),
        measure: measure.into(),
        baseline: baseline.into(),
        ours: ours.into(),
        ratio,
        target: target.into(),
    });
}

/// `met` / `NOT met`.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

fn ratio(r: Option<f64>) -> String {
    match r {
        None => "—".to_string(),
        Some(x) if x > 0.0 && x < 0.01 => format!("{x:.1e}×"),
        Some(x) => format!("{x:.2}×"),
    }
}

/// The rows of a table file as a Markdown table.
pub fn render(rows: &[BenchRow]) -> String {
    let mut s = String::from(
        "| benchmark | measure | baseline | ours | ratio | target |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let bench = if r.bench.is_empty() {
            String::new()
        } else {
            format!("`{}`", r.bench)
        };
        let _ = writeln!(
            s,
            "| {bench} | {} | {} | {} | {} | {} |",
            r.measure,
            r.baseline,
            r.ours,
            ratio(r.ratio),
            r.target
        );
    }
    s
}

/// docs/benchmarks.md's block: the run's particulars, then the table, between [`BEGIN`] and [`END`].
pub fn render_results(results: &BenchResults) -> String {
    format!(
        "{BEGIN}\n\nLast run: {}, commit `{}`, kernel {}, {}; {}.\n\n{}\n{END}\n",
        results.date,
        results.commit,
        results.kernel,
        results.runtimes.join(", "),
        results.machine,
        render(&results.rows)
    )
}

/// The block between [`BEGIN`] and [`END`] (both included, with the final newline) in `text`.
pub fn block(text: &str) -> Option<&str> {
    let start = text.find(BEGIN)?;
    let end = text[start..].find(END)? + start + END.len();
    let end = if text[end..].starts_with('\n') {
        end + 1
    } else {
        end
    };
    Some(&text[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<BenchRow> {
        vec![
            BenchRow {
                bench: "a".into(),
                measure: "a".into(),
                baseline: "b: 1 ms".into(),
                ours: "2 ms".into(),
                ratio: Some(2.0),
                target: "< 3 ms: met".into(),
            },
            BenchRow {
                bench: String::new(),
                measure: "c".into(),
                baseline: "zero".into(),
                ours: "0.1 %".into(),
                ratio: None,
                target: "≈ 0: met".into(),
            },
        ]
    }

    #[test]
    fn rows_render_as_one_markdown_table() {
        let rows = rows();
        let t = render(&rows);
        assert!(
            t.contains("| `a` | a | b: 1 ms | 2 ms | 2.00× | < 3 ms: met |"),
            "{t}"
        );
        assert!(t.contains("|  | c | zero | 0.1 % | — | ≈ 0: met |"), "{t}");
        let json = serde_json::to_string(&rows[0]).unwrap();
        assert_eq!(serde_json::from_str::<BenchRow>(&json).unwrap(), rows[0]);
        // A row as a benchmark writes it (no `bench` yet) still reads.
        let bare = r#"{"measure":"m","baseline":"b","ours":"o","ratio":null,"target":"t"}"#;
        assert!(serde_json::from_str::<BenchRow>(bare)
            .unwrap()
            .bench
            .is_empty());
    }

    #[test]
    fn tiny_ratios_keep_their_digits() {
        assert_eq!(ratio(Some(4e-7)), "4.0e-7×");
        assert_eq!(ratio(Some(1.234)), "1.23×");
    }

    #[test]
    fn the_block_is_found_between_its_markers() {
        let results = BenchResults {
            date: "d".into(),
            commit: "c".into(),
            kernel: "k".into(),
            runtimes: vec!["containerd 1.7.24".into()],
            machine: "m".into(),
            rows: rows(),
        };
        let b = render_results(&results);
        let text = format!("intro\n\n{b}\nafter\n");
        assert_eq!(block(&text), Some(b.as_str()));
        assert!(b.contains("Last run: d, commit `c`, kernel k, containerd 1.7.24; m."));
    }

    /// The docs/benchmarks.md's benchmark table is the rendering of the committed results file. With
    /// `NRI_RESIZE_BLESS=1` (set by `cargo xtask bench` after writing the file) docs/benchmarks.md's
    /// block is rewritten from it instead.
    #[test]
    fn the_docs_carry_the_bench_results() {
        let results: BenchResults =
            serde_json::from_str(include_str!("../../docs/bench-results.json"))
                .expect("docs/bench-results.json parses");
        let want = render_results(&results);
        if std::env::var_os("NRI_RESIZE_BLESS").is_some_and(|v| v == "1") {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/benchmarks.md");
            let readme = std::fs::read_to_string(path).expect("read docs/benchmarks.md");
            let have = block(&readme).expect("docs/benchmarks.md has the bench-results markers");
            let updated = readme.replacen(have, &want, 1);
            std::fs::write(path, updated).expect("write docs/benchmarks.md");
            return;
        }
        let readme = include_str!("../../docs/benchmarks.md");
        let have = block(readme).expect("docs/benchmarks.md has the bench-results markers");
        assert_eq!(
            have, want,
            "docs/benchmarks.md's benchmark table is not the rendering of docs/bench-results.json; \
             run `NRI_RESIZE_BLESS=1 cargo test -p nri-resize --lib bench_table` (or `cargo xtask bench`)"
        );
    }
}
