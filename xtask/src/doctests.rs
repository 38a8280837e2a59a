//! Which workspace crates hold doctests, so that `cargo xtask test` runs `cargo test
//! --doc` for those alone (rustdoc over every crate costs about half a minute for
//! nothing where there are none).

use std::path::Path;

use anyhow::{Context, Result};

/// Whether Rust doc text holds a code block rustdoc would run: a fence opened with no
/// language, `rust`, or rustdoc's attributes (`no_run`, `should_panic`, ...), but not
/// `text`, `sh`, `ignore` and the like. `lines` are the doc lines' text, without the
/// comment markers. Pure.
pub fn has_doctest<'a>(lines: impl IntoIterator<Item = &'a str>) -> bool {
    const RUST: [&str; 5] = ["", "rust", "no_run", "should_panic", "compile_fail"];
    let mut open = false;
    for line in lines {
        let Some(info) = line.trim().strip_prefix("```") else {
            continue;
        };
        if open {
            open = false;
            continue;
        }
        open = true;
        if info
            .split(',')
            .map(str::trim)
            .any(|word| RUST.contains(&word) || word.starts_with("edition"))
            && !info.split(',').any(|w| w.trim() == "ignore")
        {
            return true;
        }
    }
    false
}

/// The doc text of a Rust source file: its `//!` and `///` lines (markers removed),
/// and a file it includes as docs (`#[doc = include_str!("../README.md")]`, inner or
/// outer), whose whole text is doc.
fn doc_lines(file: &Path, source: &str) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for line in source.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("//!").or_else(|| t.strip_prefix("///")) {
            lines.push(rest.to_string());
        } else if let Some(included) = t
            .strip_prefix("#!")
            .or_else(|| t.strip_prefix('#'))
            .and_then(|r| r.strip_prefix("[doc = include_str!(\""))
            .and_then(|r| r.split_once('"'))
            .map(|(p, _)| p)
        {
            let path = file.parent().unwrap_or(Path::new(".")).join(included);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            lines.extend(text.lines().map(str::to_string));
        }
    }
    Ok(lines)
}

/// The workspace's packages (`(name, directory)`) whose `src/` holds a doctest.
pub fn packages_with_doctests(packages: &[(String, std::path::PathBuf)]) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for (name, dir) in packages {
        let mut stack = vec![dir.join("src")];
        let mut any = false;
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for entry in entries {
                let path = entry?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let source = std::fs::read_to_string(&path)?;
                    let lines = doc_lines(&path, &source)?;
                    any |= has_doctest(lines.iter().map(String::as_str));
                }
            }
        }
        if any {
            found.push(name.clone());
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_blocks_rustdoc_runs_count() {
        assert!(has_doctest([" Example:", " ```", " let x = 1;", " ```"]));
        assert!(has_doctest(["```rust,no_run", "x", "```"]));
        assert!(has_doctest(["```no_run", "x", "```"]));
        assert!(!has_doctest(["```text", "lake/{db}/", "```"]));
        assert!(!has_doctest([
            "```sh",
            "cargo run",
            "```",
            "```toml",
            "a = 1",
            "```"
        ]));
        assert!(!has_doctest(["```rust,ignore", "x", "```"]));
        // A closing fence is not an opening one.
        assert!(!has_doctest(["```text", "x", "```", "after"]));
        assert!(has_doctest(["```text", "x", "```", "```", "y", "```"]));
    }

    #[test]
    fn the_workspace_s_doctests_are_found_where_they_are() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let packages: Vec<(String, std::path::PathBuf)> = crate::layers::ALLOWED
            .iter()
            .map(|(name, _)| (name.to_string(), root.join(name)))
            .collect();
        let found = packages_with_doctests(&packages).unwrap();
        // mink-wal's README is its crate docs, with Rust examples; mink-lake's only
        // fence is a `text` block.
        assert!(found.contains(&"mink-wal".to_string()), "{found:?}");
        assert!(!found.contains(&"mink-lake".to_string()), "{found:?}");
    }
}
