//! Opening an object store from a URL.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;

use crate::config::ObjectStoreConfig;
use crate::error::{WalError, WalResult};

/// The object store's own clock, in milliseconds since the epoch: the modification
/// time of a small object written under `key` just now. Age checks against objects'
/// `last_modified` use this, never the node's clock: a node whose clock runs ten
/// minutes fast must not delete objects ten minutes too young.
pub async fn store_now_ms(store: &Arc<dyn ObjectStore>, key: &str) -> WalResult<i64> {
    use object_store::ObjectStoreExt;
    let path = object_store::path::Path::from(key);
    store
        .put(&path, object_store::PutPayload::from_static(b"clock"))
        .await?;
    Ok(store.head(&path).await?.last_modified.timestamp_millis())
}

/// The HTTP client of S3 stores: object_store's own (reqwest), counting every HTTP
/// request it sends in `mink_object_store_http_requests_total{method,status}`
/// (`status`: `2xx`, `3xx`, `4xx`, `5xx`, `throttled` or `error`, see
/// [`status_class`]). The
/// node's request accounting (`crate::accounting`) counts one per store call; object_store
/// retries failed requests inside that call (5xx, throttling, connection errors), and
/// those retries show here only: the difference is what was retried. Process-wide
/// (the client does not know which node or purpose sends).
#[derive(Debug, Default)]
struct CountingConnector;

impl object_store::client::HttpConnector for CountingConnector {
    fn connect(
        &self,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let inner = object_store::client::HttpConnector::connect(
            &object_store::client::ReqwestConnector::default(),
            options,
        )?;
        Ok(object_store::client::HttpClient::new(CountingService {
            inner,
        }))
    }
}

#[derive(Debug)]
struct CountingService {
    inner: object_store::client::HttpClient,
}

#[async_trait::async_trait]
impl object_store::client::HttpService for CountingService {
    async fn call(
        &self,
        req: object_store::client::HttpRequest,
    ) -> Result<object_store::client::HttpResponse, object_store::client::HttpError> {
        let method = match req.method().as_str() {
            "GET" => "get",
            "PUT" => "put",
            "POST" => "post",
            "HEAD" => "head",
            "DELETE" => "delete",
            _ => "other",
        };
        let result = self.inner.execute(req).await;
        let status = match &result {
            Ok(r) => status_class(r.status().as_u16()),
            Err(_) => "error",
        };
        metrics::counter!("mink_object_store_http_requests_total", "method" => method, "status" => status)
            .increment(1);
        result
    }
}

/// The `status` label of an HTTP answer: its class, except that the store's request
/// to slow down is told apart (`throttled`: S3's 503 SlowDown, and the 429 other
/// S3-compatible stores send), since it means the bucket is being asked too much, not
/// that something failed.
fn status_class(status: u16) -> &'static str {
    match status {
        429 | 503 => "throttled",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Opens the store `config.url` names:
/// - `file:///abs/dir`: a local directory (created if missing), every write fsynced;
/// - `memory://`: a fresh in-memory store (tests);
/// - `s3://bucket[/prefix]`: S3 or an S3-compatible store that honours
///   `If-None-Match: *`, with conditional create on.
pub fn open_object_store(config: &ObjectStoreConfig) -> WalResult<Arc<dyn ObjectStore>> {
    let url = config.url.as_str();
    let bad = |why: String| WalError::Config(format!("object_store.url {url:?}: {why}"));
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad("a file:// URL needs an absolute path".into()));
        }
        std::fs::create_dir_all(path)
            .map_err(|e| bad(format!("cannot create the directory: {e}")))?;
        let store = LocalFileSystem::new_with_prefix(path)
            .map_err(|e| bad(e.to_string()))?
            .with_fsync(true);
        return Ok(Arc::new(store));
    }
    if url == "memory://" || url == "memory:///" {
        return Ok(Arc::new(InMemory::new()));
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = match rest.split_once('/') {
            Some((bucket, prefix)) => (bucket, prefix.trim_matches('/')),
            None => (rest, ""),
        };
        if bucket.is_empty() {
            return Err(bad("an s3:// URL needs a bucket".into()));
        }
        let mut builder = AmazonS3Builder::from_env()
            .with_http_connector(CountingConnector)
            .with_bucket_name(bucket)
            .with_region(&config.region)
            .with_allow_http(config.allow_http)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_allow_http(config.allow_http)
                    .with_timeout(Duration::from_millis(config.request_timeout_ms)),
            );
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_virtual_hosted_style_request(false);
        }
        if let Some(key) = &config.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &config.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        let store = builder.build().map_err(|e| bad(e.to_string()))?;
        return Ok(if prefix.is_empty() {
            Arc::new(store)
        } else {
            Arc::new(PrefixStore::new(store, prefix))
        });
    }
    Err(bad("the scheme must be file://, memory:// or s3://".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::path::Path;
    use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

    fn config(url: &str) -> ObjectStoreConfig {
        ObjectStoreConfig {
            url: url.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn file_urls_create_the_directory_and_honour_conditional_create() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a/b");
        let store = open_object_store(&config(&format!("file://{}", root.display()))).unwrap();
        assert!(root.is_dir());
        let path = Path::from("x/1");
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        store
            .put_opts(&path, PutPayload::from_static(b"one"), create.clone())
            .await
            .unwrap();
        let err = store
            .put_opts(&path, PutPayload::from_static(b"two"), create)
            .await
            .unwrap_err();
        assert!(matches!(err, object_store::Error::AlreadyExists { .. }));
        let got = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"one");
    }

    #[test]
    fn bad_urls_are_rejected_with_the_reason() {
        for (url, why) in [
            ("file://relative", "absolute path"),
            ("s3://", "needs a bucket"),
            ("gs://b", "file://, memory:// or s3://"),
            ("", "file://, memory:// or s3://"),
        ] {
            let err = open_object_store(&config(url)).err().unwrap().to_string();
            assert!(err.contains(why), "{url}: {err}");
            assert!(err.contains("object_store.url"), "{err}");
        }
        open_object_store(&config("memory://")).unwrap();
        open_object_store(&config("s3://bucket/some/prefix")).unwrap();
    }

    #[test]
    fn a_request_to_slow_down_is_told_apart_from_a_failure() {
        assert_eq!(status_class(503), "throttled");
        assert_eq!(status_class(429), "throttled");
        assert_eq!(status_class(500), "5xx");
        assert_eq!(status_class(404), "4xx");
        assert_eq!(status_class(412), "4xx");
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(304), "3xx");
    }
}

/// Against the real S3 API server `cargo xtask test` starts (moto): conditional
/// create must be honoured, or nothing in Mink's coordination holds.
#[cfg(test)]
mod s3_tests {
    use super::*;
    use object_store::path::Path;
    use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

    #[tokio::test]
    async fn s3_conditional_create_is_honoured() {
        let (Ok(endpoint), Ok(bucket)) = (
            std::env::var("MINKTEST_S3_ENDPOINT"),
            std::env::var("MINKTEST_S3_BUCKET"),
        ) else {
            eprintln!("skipped: MINKTEST_S3_ENDPOINT is not set (cargo xtask test sets it)");
            return;
        };
        let config = ObjectStoreConfig {
            url: format!("s3://{bucket}/store-test-{}", uuid::Uuid::new_v4()),
            endpoint: Some(endpoint),
            allow_http: true,
            ..Default::default()
        };
        let store = open_object_store(&config).unwrap();
        let path = Path::from("log/00000000000000000001");
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        store
            .put_opts(&path, PutPayload::from_static(b"first"), create.clone())
            .await
            .unwrap();
        let err = store
            .put_opts(&path, PutPayload::from_static(b"second"), create)
            .await
            .unwrap_err();
        assert!(
            matches!(err, object_store::Error::AlreadyExists { .. }),
            "{err}"
        );
        let got = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"first");
    }
}
