//! Stores for the backend matrix: every test runs on `memory://`, `file://` and,
//! when `cargo xtask test` started one, the local S3 API server (moto).
#![allow(dead_code)]

use std::sync::Arc;

use mink_wal::{ObjectStoreConfig, open_object_store};
use object_store::ObjectStore;

/// A store of one backend, with whatever keeps it alive.
pub struct TestStore {
    pub store: Arc<dyn ObjectStore>,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

pub fn memory() -> TestStore {
    TestStore {
        store: open_object_store(&config("memory://")).unwrap(),
        url: "memory://".into(),
        _dir: None,
    }
}

pub fn file() -> TestStore {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    TestStore {
        store: open_object_store(&config(&url)).unwrap(),
        url,
        _dir: Some(dir),
    }
}

/// The moto server's store under a fresh prefix, or `None` (with a note) outside
/// `cargo xtask test`.
pub fn s3() -> Option<TestStore> {
    let (Ok(endpoint), Ok(bucket)) = (
        std::env::var("MINKTEST_S3_ENDPOINT"),
        std::env::var("MINKTEST_S3_BUCKET"),
    ) else {
        eprintln!("S3 case skipped: MINKTEST_S3_ENDPOINT is not set (cargo xtask test sets it)");
        return None;
    };
    let url = format!("s3://{bucket}/wal-test-{}", uuid::Uuid::new_v4());
    let config = ObjectStoreConfig {
        url: url.clone(),
        endpoint: Some(endpoint),
        allow_http: true,
        ..Default::default()
    };
    Some(TestStore {
        store: open_object_store(&config).unwrap(),
        url,
        _dir: None,
    })
}

pub fn config(url: &str) -> ObjectStoreConfig {
    ObjectStoreConfig {
        url: url.into(),
        ..Default::default()
    }
}

/// Generates `mod memory`, `mod file` and `mod s3` running `$body(store)` each.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident => $body:path;)*) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $body(super::common::memory()).await;
                }
            )*
        }
        mod file {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $body(super::common::file()).await;
                }
            )*
        }
        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(store) = super::common::s3() {
                        $body(store).await;
                    }
                }
            )*
        }
    };
}
