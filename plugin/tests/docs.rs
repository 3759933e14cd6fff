//! The README and `docs/` against the binary and each other: every `nri-resize` command and
//! flag they name exists in the binary's `--help`, and every relative link resolves (the file,
//! and the heading an anchor names).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// README.md and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("read docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// `nri-resize <args> --help`: its text, or `None` when the binary refuses `args`.
fn help(args: &[&str]) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_nri-resize"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run nri-resize --help");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The subcommands a `--help` text lists under `Commands:`.
fn subcommands(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The text a reader sees as code: inline code spans and fenced blocks, one entry per line.
fn code(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push(line.to_string());
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let Some(span) = parts.next() {
            out.push(span.to_string());
            parts.next();
        }
    }
    out
}

/// Every `nri-resize <subcommand...> [--flag...]` a page shows as code: the subcommand path and
/// the flags after it on the same command (up to a pipe, `;`, `&&` or a comment).
fn commands(code_line: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    let mut rest = code_line;
    while let Some(i) = rest.find("nri-resize ") {
        let before = rest[..i].chars().last();
        let after = &rest[i + "nri-resize ".len()..];
        rest = after;
        if before.is_some_and(|c| !(c.is_whitespace() || c == '(')) {
            continue; // a path (`/var/lib/nri-resize`), an image or a chart name
        }
        // `cargo test -p nri-resize`, `helm install nri-resize ...`: a package or a release.
        let previous = code_line[..code_line.len() - after.len() - "nri-resize ".len()]
            .split_whitespace()
            .last()
            .unwrap_or_default();
        if (previous.starts_with('-') && previous != "--")
            || ["install", "upgrade", "uninstall", "template"].contains(&previous)
        {
            continue;
        }
        let command = after
            .split(['|', ';', '#'])
            .next()
            .unwrap_or_default()
            .split("&&")
            .next()
            .unwrap_or_default();
        let mut path = Vec::new();
        let mut flags = Vec::new();
        for token in command.split_whitespace() {
            if let Some(flag) = token.strip_prefix("--") {
                let flag: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if !flag.is_empty() {
                    flags.push(format!("--{flag}"));
                }
            } else if flags.is_empty()
                && token.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                && !token.starts_with('-')
            {
                path.push(token.to_string());
            }
        }
        found.push((path, flags));
    }
    found
}

#[test]
fn every_command_and_flag_the_docs_name_is_in_the_binarys_help() {
    let top = help(&[]).expect("nri-resize --help");
    let top_level = subcommands(&top);
    assert!(
        top_level.contains("run") && top_level.contains("status"),
        "{top}"
    );
    let mut checked = 0;
    let mut wrong = Vec::new();
    for page in pages() {
        let name = page
            .strip_prefix(root())
            .unwrap_or(&page)
            .display()
            .to_string();
        for line in code(&read(&page)) {
            for (path, flags) in commands(&line) {
                // The subcommand path: as deep as the binary has subcommands.
                let mut args: Vec<&str> = Vec::new();
                let mut level = top_level.clone();
                for word in &path {
                    if level.is_empty() {
                        break; // positional arguments
                    }
                    if !level.contains(word) {
                        if args.is_empty() {
                            // `helm install nri-resize deploy/...`: not our command at all.
                            break;
                        }
                        wrong.push(format!(
                            "{name}: `nri-resize {}`: no subcommand {word:?}",
                            path.join(" ")
                        ));
                        break;
                    }
                    args.push(word);
                    level = subcommands(&help(&args).unwrap_or_default());
                }
                if args.is_empty() {
                    if !flags.is_empty() && path.is_empty() {
                        // `nri-resize --version` and the like.
                        for f in &flags {
                            if !top.contains(f.as_str()) {
                                wrong.push(format!("{name}: `nri-resize {f}` is not in --help"));
                            }
                        }
                    }
                    continue;
                }
                let text = help(&args).unwrap_or_default();
                for f in &flags {
                    if !text.contains(&format!("{f} "))
                        && !text.contains(&format!("{f}\n"))
                        && !text.contains(&format!("{f}="))
                        && !text.contains(&format!("{f},"))
                        && !text.contains(&format!("{f}["))
                        && !text.contains(&format!("{f} <"))
                    {
                        wrong.push(format!(
                            "{name}: `nri-resize {} {f}`: not in `nri-resize {} --help`",
                            args.join(" "),
                            args.join(" ")
                        ));
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "only {checked} commands found in the docs");
    assert!(
        wrong.is_empty(),
        "the docs name what the binary does not have:\n{}",
        wrong.join("\n")
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        let dir = page.parent().expect("a page's directory");
        let name = page
            .strip_prefix(root())
            .unwrap_or(&page)
            .display()
            .to_string();
        for (i, _) in text.match_indices("](") {
            let target: String = text[i + 2..].chars().take_while(|c| *c != ')').collect();
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            if !resolved.exists() {
                broken.push(format!("{name}: ({target}): no {}", resolved.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if resolved.extension().is_some_and(|x| x == "md")
                    && !anchors(&read(&resolved)).contains(anchor)
                {
                    broken.push(format!("{name}: ({target}): no heading #{anchor}"));
                }
            }
            // Nothing outside the repository.
            let canonical = resolved.canonicalize().expect("canonicalize");
            if !canonical.starts_with(root().canonicalize().expect("root")) {
                broken.push(format!("{name}: ({target}) points outside the repository"));
            }
        }
    }
    assert!(checked >= 20, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: details belong in docs/"
    );
    for command in ["cargo xtask demo", "cargo xtask test"] {
        assert!(readme.contains(command), "README.md names {command}");
    }
}
