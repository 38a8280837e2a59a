//! The Iceberg REST catalog every node serves on `listeners.iceberg_rest`: the lake
//! tables by name, for the engines that find Iceberg tables through a catalog
//! (pyiceberg, DuckDB, Spark, Trino). The protocol is the Apache Iceberg REST OpenAPI
//! specification; this is its read side, and every write answers 406
//! `UnsupportedOperationException` (tables are made and changed through Mink).
//!
//! Names map as they do in mink-query's SQL: a namespace is a Mink database (one
//! level), a table is a lake-enabled table of it (`kafka."orders.v1"` is namespace
//! `kafka`, table `orders.v1`). `loadTable` answers the lake table's newest metadata
//! version as the node reads it from the object store, with what an engine needs to
//! read the files: the store's endpoint and region, and its credentials only with
//! `iceberg_rest.vend_credentials` (the catalog authenticates nobody).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use mink_types::{DatabaseName, MinkError, TableName, TablePath};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::service::NodeService;

/// The most names one page of a listing holds.
pub const PAGE_SIZE_MAX: usize = 1000;

/// The namespace-level separator of a multi-level namespace in a path (the spec's
/// `%1F`). Mink's namespaces have one level.
const NAMESPACE_SEPARATOR: char = '\u{1f}';

/// The endpoints `GET /v1/config` lists: what this server implements.
const ENDPOINTS: [&str; 9] = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
    "GET /v1/{prefix}/namespaces/{namespace}/views",
    "HEAD /v1/{prefix}/namespaces/{namespace}/views/{view}",
];

type Shared = State<Arc<NodeService>>;

/// Serves the catalog until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    service: Arc<NodeService>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    if let Err(e) = axum::serve(listener, routes().with_state(service))
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!("the Iceberg REST catalog stopped: {e}");
    }
}

fn routes() -> Router<Arc<NodeService>> {
    let refused = || post(read_only).put(read_only).delete(read_only);
    Router::new()
        .route("/v1/config", get(config))
        .route("/v1/namespaces", get(list_namespaces).post(read_only))
        .route(
            "/v1/namespaces/{namespace}",
            get(load_namespace).head(namespace_exists).delete(read_only),
        )
        .route("/v1/namespaces/{namespace}/properties", refused())
        .route("/v1/namespaces/{namespace}/register", refused())
        .route("/v1/namespaces/{namespace}/register-view", refused())
        .route(
            "/v1/namespaces/{namespace}/tables",
            get(list_tables).post(read_only),
        )
        .route(
            "/v1/namespaces/{namespace}/tables/{table}",
            get(load_table)
                .head(table_exists)
                .post(read_only)
                .delete(read_only),
        )
        .route(
            "/v1/namespaces/{namespace}/tables/{table}/metrics",
            post(report_metrics),
        )
        .route(
            "/v1/namespaces/{namespace}/views",
            get(list_views).post(read_only),
        )
        .route(
            "/v1/namespaces/{namespace}/views/{view}",
            get(load_view)
                .head(load_view)
                .post(read_only)
                .delete(read_only),
        )
        .route("/v1/tables/rename", refused())
        .route("/v1/views/rename", refused())
        .route("/v1/transactions/commit", refused())
        .fallback(no_route)
}

/// An error as the spec's `ErrorModel`.
#[derive(Debug)]
struct RestError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl RestError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequestException", message)
    }

    fn no_namespace(namespace: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NoSuchNamespaceException",
            format!("Namespace does not exist: {namespace}"),
        )
    }

    /// A node error met while serving a table.
    fn of_table(e: MinkError) -> Self {
        let (status, kind) = match &e {
            MinkError::NotFound(_) => (StatusCode::NOT_FOUND, "NoSuchTableException"),
            MinkError::InvalidArgument { .. } => (StatusCode::BAD_REQUEST, "BadRequestException"),
            MinkError::Unavailable(_) | MinkError::StorageFailure(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableException",
            ),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError"),
        };
        Self::new(status, kind, e.to_string())
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "code": self.status.as_u16(),
        }});
        (self.status, axum::Json(body)).into_response()
    }
}

type Answer = std::result::Result<Response, RestError>;

fn ok_json(body: Value) -> Answer {
    Ok(axum::Json(body).into_response())
}

async fn read_only(method: Method, uri: Uri) -> RestError {
    RestError::new(
        StatusCode::NOT_ACCEPTABLE,
        "UnsupportedOperationException",
        format!(
            "{method} {}: Mink's Iceberg catalog is read-only; lake tables are created and \
             changed through Mink (its Flight actions, Kafka or SQL), and their lake is \
             written by the nodes' tiering rounds",
            uri.path()
        ),
    )
}

async fn no_route(method: Method, uri: Uri) -> RestError {
    RestError::new(
        StatusCode::NOT_FOUND,
        "NoSuchEndpointException",
        format!(
            "{method} {}: not an endpoint of the Iceberg REST catalog",
            uri.path()
        ),
    )
}

/// `GET /v1/config`. A `warehouse` is accepted and ignored: a node serves one.
async fn config() -> Answer {
    ok_json(json!({"defaults": {}, "overrides": {}, "endpoints": ENDPOINTS}))
}

/// `pageToken` and `pageSize`, where a listing takes them.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Paging {
    page_token: Option<String>,
    page_size: Option<String>,
    /// `listNamespaces`: the parent namespace.
    parent: Option<String>,
}

/// One page of `names` (sorted here): after the name `pageToken` holds, at most
/// `pageSize` of them, and the token of the next page when there is one. Without
/// either parameter, every name. Pure.
fn page(
    mut names: Vec<String>,
    paging: &Paging,
) -> std::result::Result<(Vec<String>, Option<String>), RestError> {
    names.sort_unstable();
    let size = match paging.page_size.as_deref() {
        None if paging.page_token.is_none() => return Ok((names, None)),
        None => PAGE_SIZE_MAX,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=PAGE_SIZE_MAX).contains(&n) => n,
            _ => {
                return Err(RestError::bad_request(format!(
                    "pageSize {text:?} is not a number from 1 to {PAGE_SIZE_MAX}"
                )));
            }
        },
    };
    let start = match paging.page_token.as_deref() {
        None | Some("") => 0,
        Some(after) => names.partition_point(|n| n.as_str() <= after),
    };
    let rest = names.split_off(start.min(names.len()));
    let next = (rest.len() > size).then(|| rest[size - 1].clone());
    Ok((rest.into_iter().take(size).collect(), next))
}

/// A namespace of the path, as a database name: one level, a valid name.
fn database(namespace: &str) -> std::result::Result<String, RestError> {
    if namespace.contains(NAMESPACE_SEPARATOR) || DatabaseName::new(namespace).is_err() {
        return Err(RestError::no_namespace(
            &namespace.replace(NAMESPACE_SEPARATOR, "."),
        ));
    }
    Ok(namespace.to_string())
}

async fn list_namespaces(State(service): Shared, Query(paging): Query<Paging>) -> Answer {
    let names = match paging.parent.as_deref() {
        None | Some("") => service.catalog_namespaces(),
        Some(parent) => {
            // Namespaces have one level: a database has no children.
            let db = database(parent)?;
            if !service.catalog_namespace_exists(&db) {
                return Err(RestError::no_namespace(&db));
            }
            Vec::new()
        }
    };
    let (names, next) = page(names, &paging)?;
    let namespaces: Vec<[String; 1]> = names.into_iter().map(|n| [n]).collect();
    ok_json(json!({"namespaces": namespaces, "next-page-token": next}))
}

fn existing_database(service: &NodeService, namespace: &str) -> Result<String, RestError> {
    let db = database(namespace)?;
    if !service.catalog_namespace_exists(&db) {
        return Err(RestError::no_namespace(&db));
    }
    Ok(db)
}

async fn load_namespace(State(service): Shared, Path(namespace): Path<String>) -> Answer {
    let db = existing_database(&service, &namespace)?;
    ok_json(json!({"namespace": [db], "properties": {}}))
}

async fn namespace_exists(State(service): Shared, Path(namespace): Path<String>) -> Answer {
    existing_database(&service, &namespace)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_tables(
    State(service): Shared,
    Path(namespace): Path<String>,
    Query(paging): Query<Paging>,
) -> Answer {
    let db = database(&namespace)?;
    let names = service
        .catalog_tables(&db)
        .ok_or_else(|| RestError::no_namespace(&db))?;
    let (names, next) = page(names, &paging)?;
    let identifiers: Vec<Value> = names
        .into_iter()
        .map(|name| json!({"namespace": [db], "name": name}))
        .collect();
    ok_json(json!({"identifiers": identifiers, "next-page-token": next}))
}

async fn list_views(
    State(service): Shared,
    Path(namespace): Path<String>,
    Query(paging): Query<Paging>,
) -> Answer {
    existing_database(&service, &namespace)?;
    page(Vec::new(), &paging)?;
    ok_json(json!({"identifiers": [], "next-page-token": null}))
}

async fn load_view(Path((namespace, view)): Path<(String, String)>) -> RestError {
    RestError::new(
        StatusCode::NOT_FOUND,
        "NoSuchViewException",
        format!("View does not exist: {namespace}.{view} (Mink serves no views)"),
    )
}

/// The table a path names; `NoSuchNamespace` or `NoSuchTable` when there is none.
async fn lake_table(
    service: &NodeService,
    namespace: &str,
    table: &str,
) -> std::result::Result<crate::service::CatalogTable, RestError> {
    let db = existing_database(service, namespace)?;
    let name = TableName::new(table)
        .map_err(|_| RestError::of_table(MinkError::NotFound(format!("table {db}.{table}"))))?;
    let db = DatabaseName::new(db).map_err(RestError::of_table)?;
    service
        .catalog_table(&TablePath::new(db, name))
        .await
        .map_err(RestError::of_table)
}

async fn table_exists(
    State(service): Shared,
    Path((namespace, table)): Path<(String, String)>,
) -> Answer {
    lake_table(&service, &namespace, &table).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `loadTable`'s query: `snapshots=all` (default) or `refs`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LoadQuery {
    snapshots: Option<String>,
}

async fn load_table(
    State(service): Shared,
    Path((namespace, table)): Path<(String, String)>,
    Query(query): Query<LoadQuery>,
    headers: HeaderMap,
) -> Answer {
    let refs_only = match query.snapshots.as_deref() {
        None | Some("all") => false,
        Some("refs") => true,
        Some(other) => {
            return Err(RestError::bad_request(format!(
                "snapshots={other:?}: the values are \"all\" and \"refs\""
            )));
        }
    };
    let found = lake_table(&service, &namespace, &table).await?;
    let metadata = &found.version.metadata;
    let etag = format!(
        "\"{}-{}{}\"",
        metadata.uuid(),
        found.version.version,
        if refs_only { "-refs" } else { "" }
    );
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let etag = HeaderValue::from_str(&etag)
        .map_err(|e| RestError::of_table(MinkError::Internal(format!("an ETag header: {e}"))))?;
    if unchanged {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    let mut metadata = serde_json::to_value(metadata).map_err(|e| {
        RestError::of_table(MinkError::Internal(format!("lake metadata as JSON: {e}")))
    })?;
    if refs_only {
        keep_referenced_snapshots(&mut metadata);
    }
    let store = service.catalog_store();
    let keys = match service.catalog_vends_credentials() {
        true => Keys::of(store),
        false => None,
    };
    let vend = keys.is_some();
    let config = file_io_config(store, keys.as_ref());
    let mut body = json!({
        "metadata-location": found.metadata_location,
        "metadata": metadata,
        "config": config,
    });
    if vend && !config.is_empty() {
        body["storage-credentials"] = json!([{"prefix": store.url, "config": config}]);
    }
    Ok(([(header::ETAG, etag)], axum::Json(body)).into_response())
}

/// Drops from table metadata JSON the snapshots no ref (branch or tag) names: the
/// spec's `snapshots=refs`.
fn keep_referenced_snapshots(metadata: &mut Value) {
    let referenced: Vec<Value> = metadata["refs"]
        .as_object()
        .map(|refs| refs.values().map(|r| r["snapshot-id"].clone()).collect())
        .unwrap_or_default();
    if let Some(snapshots) = metadata["snapshots"].as_array_mut() {
        snapshots.retain(|s| referenced.contains(&s["snapshot-id"]));
    }
}

/// Static S3 keys, as the node's store uses them.
struct Keys {
    id: String,
    secret: String,
    token: Option<String>,
}

impl Keys {
    /// The store's keys: its configuration's, else the AWS environment's (what the
    /// store itself falls back to). `None` where it has none to give (an instance
    /// profile's rotating credentials are never vended).
    fn of(store: &mink_wal::ObjectStoreConfig) -> Option<Self> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let id = store
            .access_key_id
            .clone()
            .or_else(|| env("AWS_ACCESS_KEY_ID"))?;
        let secret = store
            .secret_access_key
            .clone()
            .or_else(|| env("AWS_SECRET_ACCESS_KEY"))?;
        let token = match store.access_key_id {
            Some(_) => None,
            None => env("AWS_SESSION_TOKEN"),
        };
        Some(Self { id, secret, token })
    }
}

/// The FileIO properties an engine needs to read the store's files (the keys of
/// Iceberg's S3FileIO and pyiceberg): endpoint, region and path-style access for an
/// S3 store, and `keys` when given. Nothing for a local directory. Pure.
fn file_io_config(
    store: &mink_wal::ObjectStoreConfig,
    keys: Option<&Keys>,
) -> BTreeMap<String, String> {
    let mut config = BTreeMap::new();
    if !store.url.starts_with("s3://") {
        return config;
    }
    if let Some(endpoint) = &store.endpoint {
        config.insert("s3.endpoint".into(), endpoint.clone());
    }
    config.insert("s3.region".into(), store.region.clone());
    config.insert("client.region".into(), store.region.clone());
    // object_store addresses buckets by path unless told otherwise.
    config.insert("s3.path-style-access".into(), "true".into());
    if let Some(keys) = keys {
        config.insert("s3.access-key-id".into(), keys.id.clone());
        config.insert("s3.secret-access-key".into(), keys.secret.clone());
        if let Some(token) = &keys.token {
            config.insert("s3.session-token".into(), token.clone());
        }
    }
    config
}

/// `reportMetrics`: engines report their scans; the node takes and drops them.
async fn report_metrics(
    State(service): Shared,
    Path((namespace, table)): Path<(String, String)>,
) -> Answer {
    lake_table(&service, &namespace, &table).await?;
    metrics::counter!("mink_iceberg_rest_metrics_reports_total").increment(1);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn paging(token: Option<&str>, size: Option<&str>) -> Paging {
        Paging {
            page_token: token.map(str::to_string),
            page_size: size.map(str::to_string),
            parent: None,
        }
    }

    #[test]
    fn pages_follow_their_tokens_and_cover_every_name_once() {
        let all = names(&["e", "a", "d", "b", "c"]);
        assert_eq!(
            page(all.clone(), &paging(None, None)).unwrap(),
            (names(&["a", "b", "c", "d", "e"]), None)
        );
        let mut seen = Vec::new();
        let mut token = Some(String::new());
        while let Some(t) = token {
            let (got, next) = page(all.clone(), &paging(Some(&t), Some("2"))).unwrap();
            assert!(got.len() <= 2);
            seen.extend(got);
            token = next;
        }
        assert_eq!(seen, names(&["a", "b", "c", "d", "e"]));
        // Exactly a page's worth left: no further token.
        assert_eq!(
            page(all.clone(), &paging(Some("c"), Some("2"))).unwrap(),
            (names(&["d", "e"]), None)
        );
        // A token past the end, or of a name since dropped.
        assert_eq!(
            page(all.clone(), &paging(Some("z"), Some("2"))).unwrap().0,
            names(&[])
        );
        assert_eq!(
            page(all.clone(), &paging(Some("bb"), Some("1"))).unwrap(),
            (names(&["c"]), Some("c".into()))
        );
    }

    #[test]
    fn a_page_size_out_of_bounds_is_refused() {
        for bad in ["0", "-1", "x", "1001"] {
            let e = page(names(&["a"]), &paging(None, Some(bad))).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
        assert!(page(names(&["a"]), &paging(None, Some("1000"))).is_ok());
    }

    #[test]
    fn multi_level_and_invalid_namespaces_name_no_database() {
        assert_eq!(database("sales").unwrap(), "sales");
        for bad in ["a\u{1f}b", "", "bad name"] {
            let e = database(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::NOT_FOUND, "{bad:?}");
            assert_eq!(e.kind, "NoSuchNamespaceException");
        }
    }

    #[test]
    fn refs_keep_only_the_snapshots_a_ref_names() {
        let mut metadata = json!({
            "refs": {"main": {"snapshot-id": 3, "type": "branch"}},
            "snapshots": [{"snapshot-id": 1}, {"snapshot-id": 2}, {"snapshot-id": 3}],
        });
        keep_referenced_snapshots(&mut metadata);
        assert_eq!(metadata["snapshots"], json!([{"snapshot-id": 3}]));
    }

    #[test]
    fn store_keys_are_served_only_when_vending() {
        let store = mink_wal::ObjectStoreConfig {
            url: "s3://bucket/root".into(),
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: "eu-west-1".into(),
            access_key_id: Some("AKIA".into()),
            secret_access_key: Some("secret".into()),
            ..Default::default()
        };
        let plain = file_io_config(&store, None);
        assert_eq!(plain["s3.endpoint"], "http://127.0.0.1:9000");
        assert_eq!(plain["s3.region"], "eu-west-1");
        assert!(!plain.contains_key("s3.access-key-id"));
        assert!(!plain.values().any(|v| v == "secret"));
        let keys = Keys::of(&store).unwrap();
        assert!(
            keys.token.is_none(),
            "configured keys carry no session token"
        );
        let vended = file_io_config(&store, Some(&keys));
        assert_eq!(vended["s3.access-key-id"], "AKIA");
        assert_eq!(vended["s3.secret-access-key"], "secret");
        let local = mink_wal::ObjectStoreConfig {
            url: "file:///tmp/objects".into(),
            ..Default::default()
        };
        assert!(file_io_config(&local, Some(&keys)).is_empty());
    }
}
