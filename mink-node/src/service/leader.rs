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

impl NodeService {
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
