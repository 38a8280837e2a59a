//! Who leads a bucket, as this node's metadata view says: the one lookup every path
//! that routes, redirects or forwards uses.

use super::*;

/// The leader of a bucket in this node's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Leader {
    /// This node, under this leader epoch.
    Me { epoch: u64 },
    /// Another node, at its advertised Flight address when the view has one.
    Other {
        node: String,
        address: Option<String>,
    },
    /// Nobody yet (a bucket just created, or one whose leader died).
    Unknown,
}

impl Leader {
    /// The redirect a request for `bucket` gets when this node does not lead it.
    pub(crate) fn redirect(&self, bucket: TableBucket) -> Option<MinkError> {
        match self {
            Leader::Me { .. } => None,
            Leader::Other { address, .. } => Some(MinkError::NotLeader {
                bucket,
                leader: address.clone(),
            }),
            Leader::Unknown => Some(MinkError::Unavailable(format!(
                "{bucket} has no leader yet"
            ))),
        }
    }

    /// The leader's Flight address, when another node leads.
    pub(crate) fn address(&self) -> Option<&str> {
        match self {
            Leader::Other { address, .. } => address.as_deref(),
            _ => None,
        }
    }
}

/// Where a request for a bucket is served ([`NodeService::route_bucket`]).
pub(crate) enum Route {
    /// Here: this node leads the bucket; its tablet.
    Here(Tablet),
    /// At the leader's Flight address: forward the request there.
    There(String),
}

impl NodeService {
    /// Where a request any node may take for `bucket` (a lookup, a list of offsets) is
    /// served: here when this node leads it, else at the leader's address, which the
    /// caller forwards to. The one place such requests decide it, from the view
    /// ([`NodeService::known_leader`]), not by catching a `NotLeader`.
    ///
    /// A request that was itself `forwarded` is never forwarded again. While a bucket
    /// moves, two nodes' views can each name the other as its leader; handing the
    /// request back and forth, every hop would hold an HTTP/2 stream of the hop before
    /// it, and once a connection's stream limit is reached no hop can finish, not even
    /// after the views agree. So a forwarded request catches this node's view up once
    /// and is served here, or answered `NotLeader` (see [`NodeService::at_leader`]).
    pub(crate) async fn route_bucket(&self, bucket: TableBucket, forwarded: bool) -> Result<Route> {
        let mut leader = self.known_leader(bucket).await?;
        if forwarded && !matches!(leader, Leader::Me { .. }) {
            self.meta.inner_catch_up().await;
            leader = self.known_leader(bucket).await?;
        }
        match leader {
            Leader::Me { epoch } => Ok(Route::Here(self.open_tablet(bucket, epoch).await?)),
            Leader::Other {
                address: Some(address),
                ..
            } if !forwarded => Ok(Route::There(address)),
            other => Err(other
                .redirect(bucket)
                .unwrap_or_else(|| MinkError::Unavailable(format!("{bucket} has no leader yet")))),
        }
    }

    /// Serves a request any node may take for `bucket`: `here` with its tablet when this
    /// node leads it, else `there` at the leader's address (a call that marks the
    /// request forwarded, so that the leader does not forward it again). A leader that
    /// answers it does not lead (the two views disagree while the bucket moves) makes
    /// this node catch its own view up and decide once more; a second disagreement
    /// answers `Unavailable`, which clients retry.
    pub(crate) async fn at_leader<T, H, HereFut, F, ThereFut>(
        &self,
        bucket: TableBucket,
        forwarded: bool,
        here: H,
        there: F,
    ) -> Result<T>
    where
        H: FnOnce(Tablet) -> HereFut,
        HereFut: Future<Output = Result<T>>,
        F: Fn(String) -> ThereFut,
        ThereFut: Future<Output = Result<T>>,
    {
        let mut caught_up = false;
        loop {
            let addr = match self.route_bucket(bucket, forwarded).await? {
                Route::Here(tablet) => return here(tablet).await,
                Route::There(addr) => addr,
            };
            match there(addr.clone()).await {
                Err(MinkError::NotLeader { .. }) if !caught_up => {
                    tracing::debug!(%bucket, %addr, "the leader in this view does not lead; catching up");
                    self.meta.inner_catch_up().await;
                    caught_up = true;
                }
                Err(MinkError::NotLeader { .. }) => {
                    return Err(MinkError::Unavailable(format!(
                        "{bucket} is moving: {addr} does not lead it, although this node's view says it does; retry"
                    )));
                }
                answered => return answered,
            }
        }
    }

    /// Who leads `bucket` in this node's current view; `None` for a bucket the view
    /// does not know.
    pub(crate) fn leader(&self, bucket: TableBucket) -> Option<Leader> {
        let me = self.meta.node_id();
        self.meta.read(|s| {
            let b = s.buckets.get(&bucket.stream_name())?;
            Some(match b.leader.as_deref() {
                Some(l) if l == me => Leader::Me { epoch: b.epoch },
                Some(l) => Leader::Other {
                    node: l.to_string(),
                    address: s.nodes.get(l).map(|n| n.flight_addr.clone()),
                },
                None => Leader::Unknown,
            })
        })
    }
}
