//! A local S3 API server (moto in server mode) for tests and manual work.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::{Context, Result, bail};

/// A running moto server; stopped when dropped.
pub struct S3Server {
    child: Child,
    _stdin: Option<ChildStdin>,
    pub endpoint: String,
}

/// The bucket the server is started with (tests/interop/s3_server.py).
pub const BUCKET: &str = "mink-test";

impl S3Server {
    pub fn start(root: &Path, python: &Path) -> Result<Self> {
        let script = root.join("tests/interop/s3_server.py");
        let mut child = Command::new(python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {}", script.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("cannot read the S3 server's endpoint")?;
        let Some(endpoint) = line.trim().strip_prefix("MINK_S3_ENDPOINT=") else {
            let _ = child.kill();
            bail!("the S3 server did not start (it printed {line:?})");
        };
        let endpoint = endpoint.to_string();
        let stdin = child.stdin.take();
        Ok(Self {
            child,
            _stdin: stdin,
            endpoint,
        })
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run_foreground(root: &Path) -> Result<()> {
    let python = crate::python::ensure_venv(root)?;
    let mut server = S3Server::start(root, &python)?;
    println!("S3 endpoint: {}  bucket: {BUCKET}", server.endpoint);
    println!(
        "  MINK_OBJECT_STORE__URL=s3://{BUCKET}/mink MINK_OBJECT_STORE__ENDPOINT={} \\\n  MINK_OBJECT_STORE__ALLOW_HTTP=true AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test",
        server.endpoint
    );
    println!("Ctrl-C stops it.");
    server.child.wait().context("waiting for the S3 server")?;
    Ok(())
}
