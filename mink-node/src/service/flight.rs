//! The Flight adapter: [`MinkService`] over the node service. Thin by design: each
//! method names the concern that serves it.

use super::*;

#[async_trait]
impl MinkService for NodeService {
    fn applied_index(&self) -> u64 {
        self.meta.applied_index()
    }

    async fn wait_applied(&self, index: u64) -> Result<()> {
        self.meta
            .wait_for(
                index,
                Duration::from_millis(self.config.meta.applied_index_wait_max_ms),
            )
            .await
            .map(|_| ())
    }

    async fn action(&self, action: mink_flight::actions::Action) -> Result<Vec<u8>> {
        NodeService::action(self, action).await
    }

    async fn write(
        &self,
        descriptor: &WriteDescriptor,
        batch: RecordBatch,
        ipc: Option<IpcEncoded>,
        meta: WriteBatch,
    ) -> Result<WriteResult> {
        NodeService::write(self, descriptor, batch, ipc, meta).await
    }

    async fn read(&self, ticket: ReadTicket) -> Result<(SchemaRef, ReadBatches)> {
        NodeService::read(self, ticket).await
    }

    async fn tail(
        &self,
        bucket: TableBucket,
        poll: TailPoll,
    ) -> Result<(SchemaRef, Vec<ReadBatch>, i64)> {
        NodeService::tail(self, bucket, poll).await
    }

    async fn table_schema(&self, path: &TablePath) -> Result<SchemaRef> {
        NodeService::table_schema(self, path).await
    }

    async fn table_endpoints(&self, path: &TablePath) -> Result<(SchemaRef, Vec<TableEndpoint>)> {
        NodeService::table_endpoints(self, path).await
    }

    async fn tables(&self) -> Result<Vec<(TablePath, SchemaRef)>> {
        NodeService::tables(self).await
    }
}
