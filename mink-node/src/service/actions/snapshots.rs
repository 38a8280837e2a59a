//! Snapshot actions: a primary-key bucket's latest KV snapshot (`lake_snapshot` is in
//! [`super::super::lake`], beside the lake it reads).

use mink_flight::actions::KvSnapshotInfo;

use super::*;

impl NodeService {
    pub(super) async fn latest_kv_snapshot(&self, bucket: TableBucket) -> Result<KvSnapshotInfo> {
        let info = self.kv_snapshot(bucket).await?;
        Ok(KvSnapshotInfo {
            log_offset: info.log_offset,
            location: info.location,
            rows: info.rows,
            bytes: info.bytes,
            written_at_ms: info.written_at_ms,
        })
    }
}
