//! `cargo xtask check-layers`: DESIGN.md's dependency table, enforced from
//! `cargo metadata`.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// Each workspace crate and the workspace crates it may depend on (any dependency
/// kind: normal, dev or build). Crates not listed may depend on no workspace crate.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("mink-types", &[]),
    ("mink-wal", &[]),
    ("mink-log", &["mink-types", "mink-wal"]),
    ("mink-kv", &["mink-types", "mink-wal", "mink-log"]),
    ("mink-meta", &["mink-types", "mink-wal"]),
    ("mink-lake", &["mink-types", "mink-wal"]),
    ("mink-flight", &["mink-types"]),
    ("mink-kafka", &["mink-types"]),
    (
        "mink-node",
        &[
            "mink-types",
            "mink-wal",
            "mink-log",
            "mink-kv",
            "mink-meta",
            "mink-lake",
            "mink-flight",
            "mink-kafka",
        ],
    ),
    // A client of the nodes: Flight only (their Arrow-free protocol types).
    ("mink-query", &["mink-types", "mink-flight"]),
    ("xtask", &[]),
];

#[derive(Debug, Deserialize)]
pub struct Metadata {
    pub packages: Vec<Package>,
    pub workspace_members: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Package {
    pub name: String,
    pub id: String,
    pub dependencies: Vec<Dependency>,
}

#[derive(Debug, Deserialize)]
pub struct Dependency {
    pub name: String,
}

/// Every dependency edge between workspace crates that ALLOWED forbids, as
/// `from -> to` lines. Unknown workspace crates are violations too, so a new crate
/// must be placed in the table before it can depend on anything.
pub fn violations(metadata: &Metadata) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let members: Vec<&Package> = metadata
        .packages
        .iter()
        .filter(|p| metadata.workspace_members.contains(&p.id))
        .collect();
    let member_names: Vec<&str> = members.iter().map(|p| p.name.as_str()).collect();
    let mut out = Vec::new();
    for package in &members {
        let Some(may) = allowed.get(package.name.as_str()) else {
            out.push(format!(
                "{}: not in the layering table (xtask/src/layers.rs, DESIGN.md)",
                package.name
            ));
            continue;
        };
        for dep in &package.dependencies {
            if member_names.contains(&dep.name.as_str()) && !may.contains(&dep.name.as_str()) {
                out.push(format!("{} -> {}", package.name, dep.name));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

pub fn run(root: &std::path::Path) -> Result<()> {
    let output = Command::new("cargo")
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("cannot run cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: Metadata =
        serde_json::from_slice(&output.stdout).context("cannot parse cargo metadata")?;
    let bad = violations(&metadata);
    if !bad.is_empty() {
        bail!(
            "dependencies against DESIGN.md's layering:\n  {}",
            bad.join("\n  ")
        );
    }
    eprintln!(
        "check-layers: {} workspace crates, every dependency allowed",
        metadata.workspace_members.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(edges: &[(&str, &[&str])]) -> Metadata {
        let packages = edges
            .iter()
            .map(|(name, deps)| Package {
                name: name.to_string(),
                id: format!("path+file:///ws/{name}#0.1.0"),
                dependencies: deps
                    .iter()
                    .map(|d| Dependency {
                        name: d.to_string(),
                    })
                    .chain(std::iter::once(Dependency {
                        name: "serde".into(),
                    }))
                    .collect(),
            })
            .collect::<Vec<_>>();
        let workspace_members = packages.iter().map(|p: &Package| p.id.clone()).collect();
        Metadata {
            packages,
            workspace_members,
        }
    }

    #[test]
    fn the_designed_graph_passes() {
        assert!(violations(&metadata(ALLOWED)).is_empty());
    }

    #[test]
    fn an_upward_edge_fails() {
        let m = metadata(&[
            ("mink-types", &[]),
            ("mink-wal", &["mink-types"]),
            ("mink-log", &["mink-types", "mink-wal", "mink-node"]),
            ("mink-node", &["mink-log"]),
        ]);
        assert_eq!(
            violations(&m),
            vec![
                "mink-log -> mink-node".to_string(),
                "mink-wal -> mink-types".to_string()
            ]
        );
    }

    #[test]
    fn a_sideways_edge_fails() {
        let m = metadata(&[
            ("mink-types", &[]),
            ("mink-flight", &["mink-types", "mink-kafka"]),
            ("mink-kafka", &["mink-types"]),
        ]);
        assert_eq!(
            violations(&m),
            vec!["mink-flight -> mink-kafka".to_string()]
        );
    }

    #[test]
    fn an_unknown_crate_fails() {
        let m = metadata(&[("mink-extra", &[])]);
        assert_eq!(violations(&m).len(), 1);
        assert!(violations(&m)[0].starts_with("mink-extra: not in the layering table"));
    }
}
