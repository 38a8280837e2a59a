//! The console's files, embedded in the binary: nothing to install, no JavaScript
//! toolchain at build time. The vendored libraries and their licences are listed in
//! `mink-node/console/vendor/VENDOR.md`.

/// `(path under /console/, content type, bytes)`.
pub const FILES: &[(&str, &str, &[u8])] = &[
    ("app.js", JS, include_bytes!("../../console/app.js")),
    ("style.css", CSS, include_bytes!("../../console/style.css")),
    (
        "vendor/preact.mjs",
        JS,
        include_bytes!("../../console/vendor/preact.mjs"),
    ),
    (
        "vendor/preact-hooks.mjs",
        JS,
        include_bytes!("../../console/vendor/preact-hooks.mjs"),
    ),
    (
        "vendor/htm.mjs",
        JS,
        include_bytes!("../../console/vendor/htm.mjs"),
    ),
    (
        "vendor/uPlot.iife.min.js",
        JS,
        include_bytes!("../../console/vendor/uPlot.iife.min.js"),
    ),
    (
        "vendor/uPlot.min.css",
        CSS,
        include_bytes!("../../console/vendor/uPlot.min.css"),
    ),
    (
        "vendor/VENDOR.md",
        TEXT,
        include_bytes!("../../console/vendor/VENDOR.md"),
    ),
    (
        "vendor/LICENSE.preact",
        TEXT,
        include_bytes!("../../console/vendor/LICENSE.preact"),
    ),
    (
        "vendor/LICENSE.htm",
        TEXT,
        include_bytes!("../../console/vendor/LICENSE.htm"),
    ),
    (
        "vendor/LICENSE.uplot",
        TEXT,
        include_bytes!("../../console/vendor/LICENSE.uplot"),
    ),
];

/// The page every console URL loads (the pages are drawn by `app.js`).
pub const INDEX: &str = include_str!("../../console/index.html");

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// A file by its path under `/console/`.
pub fn file(path: &str) -> Option<(&'static str, &'static [u8])> {
    FILES
        .iter()
        .find(|(p, ..)| *p == path)
        .map(|(_, ct, bytes)| (*ct, *bytes))
}
