//! The Python virtual environment of the interop suites, under `target/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::run_checked;

/// Creates `target/interop-venv` from `tests/interop/requirements.txt`, or reuses it
/// when it was built from the same requirements. Returns the venv's `python`.
pub fn ensure_venv(root: &Path) -> Result<PathBuf> {
    let venv = root.join("target/interop-venv");
    let python = venv.join("bin/python");
    let requirements = root.join("tests/interop/requirements.txt");
    let wanted = std::fs::read_to_string(&requirements)
        .with_context(|| format!("cannot read {}", requirements.display()))?;
    let stamp = venv.join("mink-requirements.txt");
    if python.exists() && std::fs::read_to_string(&stamp).is_ok_and(|have| have == wanted) {
        return Ok(python);
    }
    eprintln!("interop: creating {} ...", venv.display());
    let interpreter = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run_checked(Command::new(&interpreter).args(["-m", "venv"]).arg(&venv))?;
    pip_install(&python, &requirements)?;
    std::fs::write(&stamp, wanted).context("cannot write the venv stamp")?;
    Ok(python)
}

/// Installs `requirements` (a pip requirements file) with the venv's `python`.
pub fn pip_install(python: &Path, requirements: &Path) -> Result<()> {
    run_checked(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(requirements),
    )
}
