//! The browser of the console's tests: Debian's `chromium` and `chromium-driver`
//! (browsers cannot be downloaded here; the distribution's packages can).

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Installs Chromium and its WebDriver with apt when they are missing.
pub fn ensure_chromium() -> Result<()> {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return Ok(());
    }
    eprintln!(
        "interop: installing Debian's chromium and chromium-driver (the console's browser tests) ..."
    );
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "chromium", "chromium-driver"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    if !install().is_ok_and(|s| s.success()) {
        // The package lists may be stale or absent on a fresh machine.
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        if !install().is_ok_and(|s| s.success()) {
            bail!(
                "cannot install chromium and chromium-driver with apt-get; the console's \
                 browser tests need {CHROMIUM} and {CHROMEDRIVER}"
            );
        }
    }
    Ok(())
}
