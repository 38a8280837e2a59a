//! mink-query's errors and the gRPC statuses they answer with: by what the client
//! does next, like the nodes' (docs/query.md "Errors").

use datafusion::common::DataFusionError;
use mink_types::MinkError;
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("the query ran longer than query.timeout_ms ({0} ms) and was cancelled")]
    Timeout(u64),
    #[error(
        "mink-query runs at most {0} queries at once (query.concurrent_max); retry when one ends"
    )]
    Busy(usize),
    #[error(
        "mink-query only reads: {0} is not served (create and change tables through a node: the mink CLI or the node's Flight actions)"
    )]
    ReadOnly(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("not implemented: {0}")]
    Unimplemented(String),
    #[error(transparent)]
    Engine(#[from] DataFusionError),
    #[error(transparent)]
    Mink(#[from] MinkError),
}

impl QueryError {
    pub fn to_status(&self) -> Status {
        match self {
            QueryError::Timeout(_) => Status::deadline_exceeded(self.to_string()),
            QueryError::Busy(_) => Status::resource_exhausted(self.to_string()),
            QueryError::ReadOnly(_) | QueryError::Unimplemented(_) => {
                Status::unimplemented(self.to_string())
            }
            QueryError::InvalidArgument(m) => Status::invalid_argument(m.clone()),
            QueryError::Mink(e) => mink_flight::server::status(e.clone()),
            QueryError::Engine(e) => engine_status(e),
        }
    }
}

impl From<QueryError> for Status {
    fn from(e: QueryError) -> Self {
        e.to_status()
    }
}

/// DataFusion's error, by its root cause.
pub fn engine_status(e: &DataFusionError) -> Status {
    let root = e.find_root();
    match root {
        DataFusionError::External(inner) => {
            if let Some(m) = inner.downcast_ref::<MinkError>() {
                return mink_flight::server::status(m.clone());
            }
            if let Some(q) = inner.downcast_ref::<QueryError>() {
                return q.to_status();
            }
            Status::internal(root.to_string())
        }
        DataFusionError::SQL(..) => Status::invalid_argument(format!("SQL syntax: {root}")),
        DataFusionError::Plan(_) | DataFusionError::SchemaError(..) => {
            Status::invalid_argument(root.to_string())
        }
        DataFusionError::ArrowError(..) | DataFusionError::Execution(_) => {
            Status::invalid_argument(root.to_string())
        }
        DataFusionError::NotImplemented(_) => Status::unimplemented(root.to_string()),
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(format!(
            "{root} (query.memory_limit_bytes bounds the memory of all running queries)"
        )),
        _ => Status::internal(root.to_string()),
    }
}

/// A DataFusion error carrying a mink-query one (inside streams).
pub fn to_engine(e: QueryError) -> DataFusionError {
    match e {
        QueryError::Engine(e) => e,
        other => DataFusionError::External(Box::new(other)),
    }
}
