//! Start-up and shutdown of a node.

use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStore;
use object_store::path::Path;

use crate::MinkConfig;

/// A node that has checked its data directory and object store.
pub struct Node {
    pub config: MinkConfig,
    pub store: Arc<dyn ObjectStore>,
}

impl Node {
    /// Creates the data directory, opens the object store and proves it answers.
    pub async fn start(config: MinkConfig) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            anyhow::anyhow!(
                "data_dir {}: cannot create it: {e}",
                config.data_dir.display()
            )
        })?;
        let store = mink_wal::open_object_store(&config.object_store)?;
        // One cheap request proves the store is reachable and the credentials work.
        let probe = Path::from("nodes");
        let mut listing = store.list(Some(&probe));
        if let Some(Err(e)) = listing.next().await {
            anyhow::bail!(
                "object store {} is not usable: {e}",
                config.object_store.url
            );
        }
        Ok(Self { config, store })
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(e) => {
                    tracing::warn!("cannot listen for SIGTERM: {e}");
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
