//! Object-store request accounting: every request a node makes, counted by operation
//! and purpose, with bytes, failures and latency.
//!
//! Object storage bills per request, also when nothing happens, so a node must be able
//! to say what it asks for and why. [`AccountedStore`] wraps the real store and is
//! tagged with one [`Purpose`]; [`Stores`] hands every component its own tagged handle
//! over one shared [`Accounting`]. Each call that reaches the wrapped store is counted
//! once, when it completes:
//!
//! - `put_opts` is a `put`; `get_opts` is a `head` (`GetOptions::head`), a `get_range`
//!   (a range) or a `get`; `get_ranges` is one `get_range` per coalesced range (the
//!   trait's default, which this wrapper keeps so that each real request is seen);
//!   `list`, `list_with_offset` and `list_with_delimiter` are one `list` per page of
//!   1,000 entries returned (S3's page size), at least one; `delete_stream` is one
//!   `delete` per object; a copy is a `put` (S3 bills COPY as a PUT); a multipart
//!   upload is one `put` to start it, one per part and one to complete it.
//! - **Failures** are errors other than the answers the protocols expect:
//!   `NotFound`, `AlreadyExists` (a lost conditional create), `Precondition` and
//!   `NotModified` are requests that succeeded at the store.
//! - **Bytes** sent are payload bytes of PUTs; bytes received are the lengths of the
//!   GET bodies the store answered with (what it sends, whether or not the caller reads
//!   it all).
//!
//! Where retries happen decides what a count means. Mink's own retries (a WAL upload
//! retried with backoff, an `ObjectLog` append retried after a conflict) call the store
//! again, so every attempt is counted. The retries inside object_store's HTTP client
//! (S3: up to `RetryConfig::max_retries` on 5xx, throttling and connection errors) are
//! below the wrapper: one logical request that was retried twice counts once. (On
//! `s3://` stores the HTTP client counts every attempt, retries included, in
//! `mink_object_store_http_requests_total`; see [`crate::store`].)
//! [`Stores::with_faults`] puts the fault injector of tests *above* the accounting, so
//! an injected failure (which never reaches the store) is not counted and an injected
//! timeout of a request that was applied counts as the request it was.
//!
//! The counters are plain atomics (read by `node_stats` and tests) and are also
//! reported to the `metrics` recorder as `mink_object_store_requests_total{op,purpose}`,
//! `mink_object_store_failures_total{op,purpose}`,
//! `mink_object_store_bytes_sent_total{purpose}`,
//! `mink_object_store_bytes_received_total{purpose}` and the histogram
//! `mink_object_store_request_duration_seconds{op}`.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use async_trait::async_trait;
use futures::stream::{BoxStream, Stream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use serde::Serialize;

/// S3 returns at most this many entries per LIST request.
pub const LIST_PAGE_ENTRIES: u64 = 1_000;

/// The kind of a request, as billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Put,
    Get,
    GetRange,
    Head,
    List,
    Delete,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Put,
        Op::Get,
        Op::GetRange,
        Op::Head,
        Op::List,
        Op::Delete,
    ];

    /// The label value in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::GetRange => "get_range",
            Op::Head => "head",
            Op::List => "list",
            Op::Delete => "delete",
        }
    }

    /// What one request of this kind costs at S3 Standard's list prices (us-east-1),
    /// in US dollars: PUT (and COPY) and LIST $0.005 per 1,000, GET and HEAD $0.0004
    /// per 1,000, DELETE free.
    pub const fn list_price_usd(self) -> f64 {
        match self {
            Op::Put | Op::List => 0.005 / 1000.0,
            Op::Get | Op::GetRange | Op::Head => 0.0004 / 1000.0,
            Op::Delete => 0.0,
        }
    }
}

/// Why a request was made: which component made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// WAL objects: generation claims, group uploads, fences, reads of uncompacted
    /// records, takeover recovery.
    Wal,
    /// Segment writes and reads.
    Segment,
    /// The metadata logs (cluster metadata and stream metadata): appends, tailing,
    /// snapshots, deletion of covered entries.
    Meta,
    /// Heartbeat objects: writing one's own, watching the others'.
    Heartbeat,
    /// KV snapshots.
    KvSnapshot,
    /// Writer-state checkpoints of log tablets.
    Checkpoint,
    /// Lake tiering.
    Lake,
    /// Garbage collection: WAL objects below the floor, dead generations, orphan and
    /// trimmed segments, and the clock object ages are judged by.
    Gc,
}

impl Purpose {
    pub const ALL: [Purpose; 8] = [
        Purpose::Wal,
        Purpose::Segment,
        Purpose::Meta,
        Purpose::Heartbeat,
        Purpose::KvSnapshot,
        Purpose::Checkpoint,
        Purpose::Lake,
        Purpose::Gc,
    ];

    /// The label value in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Wal => "wal",
            Purpose::Segment => "segment",
            Purpose::Meta => "meta",
            Purpose::Heartbeat => "heartbeat",
            Purpose::KvSnapshot => "kv_snapshot",
            Purpose::Checkpoint => "checkpoint",
            Purpose::Lake => "lake",
            Purpose::Gc => "gc",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Default)]
struct Cell {
    requests: AtomicU64,
    failures: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    latency_us: AtomicU64,
}

/// One node's request counters, by purpose and operation. Shared by every
/// [`AccountedStore`] handle of the node.
pub struct Accounting {
    cells: Vec<Cell>,
}

impl Default for Accounting {
    fn default() -> Self {
        Self {
            cells: (0..Purpose::ALL.len() * Op::ALL.len())
                .map(|_| Cell::default())
                .collect(),
        }
    }
}

impl fmt::Debug for Accounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Accounting({} requests)", self.report().requests)
    }
}

/// Counters of one (operation, purpose) pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub op: Op,
    pub purpose: Purpose,
    pub requests: u64,
    pub failures: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Mean latency of the requests counted, in microseconds.
    pub latency_us_mean: u64,
}

/// A copy of the counters: totals and every non-zero (operation, purpose) pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccountingReport {
    pub requests: u64,
    pub failures: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub by_kind: Vec<Usage>,
}

impl AccountingReport {
    /// Requests of one purpose, every operation.
    pub fn requests_for(&self, purpose: Purpose) -> u64 {
        self.by_kind
            .iter()
            .filter(|u| u.purpose == purpose)
            .map(|u| u.requests)
            .sum()
    }

    /// Requests of one operation, every purpose.
    pub fn requests_of(&self, op: Op) -> u64 {
        self.by_kind
            .iter()
            .filter(|u| u.op == op)
            .map(|u| u.requests)
            .sum()
    }
}

impl Accounting {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn cell(&self, op: Op, purpose: Purpose) -> &Cell {
        &self.cells[purpose.index() * Op::ALL.len() + op as usize]
    }

    /// Counts one request that completed (or failed) after `started`.
    pub fn record(
        &self,
        op: Op,
        purpose: Purpose,
        failed: bool,
        bytes_sent: u64,
        bytes_received: u64,
        started: Option<Instant>,
    ) {
        let cell = self.cell(op, purpose);
        let (o, p) = (op.as_str(), purpose.as_str());
        cell.requests.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("mink_object_store_requests_total", "op" => o, "purpose" => p)
            .increment(1);
        if failed {
            cell.failures.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("mink_object_store_failures_total", "op" => o, "purpose" => p)
                .increment(1);
        }
        if bytes_sent > 0 {
            cell.bytes_sent.fetch_add(bytes_sent, Ordering::Relaxed);
            metrics::counter!("mink_object_store_bytes_sent_total", "purpose" => p)
                .increment(bytes_sent);
        }
        if bytes_received > 0 {
            cell.bytes_received
                .fetch_add(bytes_received, Ordering::Relaxed);
            metrics::counter!("mink_object_store_bytes_received_total", "purpose" => p)
                .increment(bytes_received);
        }
        if let Some(started) = started {
            let elapsed = started.elapsed();
            cell.latency_us
                .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
            metrics::histogram!("mink_object_store_request_duration_seconds", "op" => o)
                .record(elapsed.as_secs_f64());
        }
    }

    /// A copy of the counters.
    pub fn report(&self) -> AccountingReport {
        let mut by_kind = Vec::new();
        for purpose in Purpose::ALL {
            for op in Op::ALL {
                let c = self.cell(op, purpose);
                let requests = c.requests.load(Ordering::Relaxed);
                if requests == 0 {
                    continue;
                }
                by_kind.push(Usage {
                    op,
                    purpose,
                    requests,
                    failures: c.failures.load(Ordering::Relaxed),
                    bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
                    bytes_received: c.bytes_received.load(Ordering::Relaxed),
                    latency_us_mean: c.latency_us.load(Ordering::Relaxed) / requests,
                });
            }
        }
        AccountingReport {
            requests: by_kind.iter().map(|u| u.requests).sum(),
            failures: by_kind.iter().map(|u| u.failures).sum(),
            bytes_sent: by_kind.iter().map(|u| u.bytes_sent).sum(),
            bytes_received: by_kind.iter().map(|u| u.bytes_received).sum(),
            by_kind,
        }
    }
}

/// Whether an error is a failure, or an answer the caller expects.
fn is_failure(e: &object_store::Error) -> bool {
    !matches!(
        e,
        object_store::Error::NotFound { .. }
            | object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotModified { .. }
    )
}

/// A store whose every request is counted under one purpose.
#[derive(Clone)]
pub struct AccountedStore {
    inner: Arc<dyn ObjectStore>,
    purpose: Purpose,
    accounting: Arc<Accounting>,
}

impl AccountedStore {
    pub fn new(inner: Arc<dyn ObjectStore>, purpose: Purpose, accounting: Arc<Accounting>) -> Self {
        Self {
            inner,
            purpose,
            accounting,
        }
    }

    fn record<T>(
        &self,
        op: Op,
        result: &object_store::Result<T>,
        sent: u64,
        received: u64,
        started: Instant,
    ) {
        let failed = result.as_ref().err().is_some_and(is_failure);
        self.accounting
            .record(op, self.purpose, failed, sent, received, Some(started));
    }

    fn counted_list(
        &self,
        inner: BoxStream<'static, object_store::Result<ObjectMeta>>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        CountedList {
            inner,
            accounting: self.accounting.clone(),
            purpose: self.purpose,
            started: Some(Instant::now()),
            entries: 0,
        }
        .boxed()
    }
}

impl fmt::Debug for AccountedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Accounted({}, {})", self.purpose.as_str(), self.inner)
    }
}

impl fmt::Display for AccountedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A listing that counts one request when it starts and one more per
/// [`LIST_PAGE_ENTRIES`] entries beyond the first page.
struct CountedList {
    inner: BoxStream<'static, object_store::Result<ObjectMeta>>,
    accounting: Arc<Accounting>,
    purpose: Purpose,
    /// Set until the first request is counted (at the first answer or the end).
    started: Option<Instant>,
    entries: u64,
}

impl Stream for CountedList {
    type Item = object_store::Result<ObjectMeta>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.inner.poll_next_unpin(cx);
        let Poll::Ready(item) = polled else {
            return Poll::Pending;
        };
        let failed = matches!(&item, Some(Err(e)) if is_failure(e));
        if let Some(started) = self.started.take() {
            self.accounting
                .record(Op::List, self.purpose, failed, 0, 0, Some(started));
        } else if failed {
            self.accounting
                .record(Op::List, self.purpose, true, 0, 0, None);
        }
        if let Some(Ok(_)) = &item {
            self.entries += 1;
            if self.entries > 1 && (self.entries - 1).is_multiple_of(LIST_PAGE_ENTRIES) {
                // The first entry of the next page: another request.
                self.accounting
                    .record(Op::List, self.purpose, false, 0, 0, None);
            }
        }
        Poll::Ready(item)
    }
}

impl Drop for CountedList {
    fn drop(&mut self) {
        // A listing dropped before its first answer was still sent.
        if let Some(started) = self.started.take() {
            self.accounting
                .record(Op::List, self.purpose, false, 0, 0, Some(started));
        }
    }
}

/// A multipart upload whose parts and completion are counted as PUTs.
struct CountedUpload {
    inner: Box<dyn MultipartUpload>,
    store: AccountedStore,
}

impl fmt::Debug for CountedUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CountedUpload({:?})", self.inner)
    }
}

#[async_trait]
impl MultipartUpload for CountedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let len = data.content_length() as u64;
        let store = self.store.clone();
        let part = self.inner.put_part(data);
        Box::pin(async move {
            let started = Instant::now();
            let result = part.await;
            store.record(Op::Put, &result, len, 0, started);
            result
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let started = Instant::now();
        let result = self.inner.complete().await;
        self.store.record(Op::Put, &result, 0, 0, started);
        result
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        let started = Instant::now();
        let result = self.inner.abort().await;
        self.store.record(Op::Delete, &result, 0, 0, started);
        result
    }
}

#[async_trait]
impl ObjectStore for AccountedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let len = payload.content_length() as u64;
        let started = Instant::now();
        let result = self.inner.put_opts(location, payload, opts).await;
        self.record(Op::Put, &result, len, 0, started);
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let started = Instant::now();
        let result = self.inner.put_multipart_opts(location, opts).await;
        self.record(Op::Put, &result, 0, 0, started);
        Ok(Box::new(CountedUpload {
            inner: result?,
            store: self.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let op = if options.head {
            Op::Head
        } else if options.range.is_some() {
            Op::GetRange
        } else {
            Op::Get
        };
        let started = Instant::now();
        let result = self.inner.get_opts(location, options).await;
        let received = match (&result, op) {
            (Ok(got), Op::Get | Op::GetRange) => got.range.end.saturating_sub(got.range.start),
            _ => 0,
        };
        self.record(op, &result, 0, received, started);
        result
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let accounting = self.accounting.clone();
        let purpose = self.purpose;
        self.inner
            .delete_stream(locations)
            .map(move |r| {
                let failed = r.as_ref().err().is_some_and(is_failure);
                accounting.record(Op::Delete, purpose, failed, 0, 0, None);
                r
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counted_list(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counted_list(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let started = Instant::now();
        let result = self.inner.list_with_delimiter(prefix).await;
        self.record(Op::List, &result, 0, 0, started);
        result
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let started = Instant::now();
        let result = self.inner.copy_opts(from, to, options).await;
        self.record(Op::Put, &result, 0, 0, started);
        result
    }

    // `get_ranges` and `rename_opts` keep the trait's defaults, which call
    // `get_opts` (one range request per coalesced range) and `copy_opts` + delete
    // through this wrapper, so that each real request is counted.
}

/// The object store of one node, handed out per purpose: every component takes its
/// own handle ([`Stores::get`]), so that its requests are counted under its purpose.
/// Built from a bare store (`From`), nothing is counted.
#[derive(Clone)]
pub struct Stores {
    handles: Arc<Vec<Arc<dyn ObjectStore>>>,
    accounting: Option<Arc<Accounting>>,
}

impl fmt::Debug for Stores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stores({})", self.handles[0])
    }
}

impl Stores {
    /// Every purpose on `store`, uncounted.
    pub fn unaccounted(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            handles: Arc::new(Purpose::ALL.iter().map(|_| store.clone()).collect()),
            accounting: None,
        }
    }

    /// Every purpose on `store`, counted in `accounting`.
    pub fn accounted(store: Arc<dyn ObjectStore>, accounting: Arc<Accounting>) -> Self {
        Self::layered(store, accounting, |s| s)
    }

    /// [`Stores::accounted`] under the fault injector `faults` (its configuration and
    /// counters shared by every handle): injected failures never reach the store and
    /// are not counted.
    pub fn with_faults(
        store: Arc<dyn ObjectStore>,
        accounting: Arc<Accounting>,
        faults: &crate::fault::FaultyStore,
    ) -> Self {
        Self::layered(store, accounting, |s| Arc::new(faults.over(s)))
    }

    fn layered(
        store: Arc<dyn ObjectStore>,
        accounting: Arc<Accounting>,
        above: impl Fn(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    ) -> Self {
        let handles = Purpose::ALL
            .iter()
            .map(|p| {
                above(Arc::new(AccountedStore::new(
                    store.clone(),
                    *p,
                    accounting.clone(),
                )))
            })
            .collect();
        Self {
            handles: Arc::new(handles),
            accounting: Some(accounting),
        }
    }

    /// The handle for `purpose`.
    pub fn get(&self, purpose: Purpose) -> Arc<dyn ObjectStore> {
        self.handles[purpose.index()].clone()
    }

    /// The counters, when these stores count.
    pub fn accounting(&self) -> Option<&Arc<Accounting>> {
        self.accounting.as_ref()
    }
}

impl From<Arc<dyn ObjectStore>> for Stores {
    fn from(store: Arc<dyn ObjectStore>) -> Self {
        Self::unaccounted(store)
    }
}

impl<T: ObjectStore> From<Arc<T>> for Stores {
    fn from(store: Arc<T>) -> Self {
        Self::unaccounted(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{FaultConfig, FaultyStore};
    use futures::TryStreamExt;
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutMode};

    fn usage(report: &AccountingReport, op: Op, purpose: Purpose) -> (u64, u64, u64, u64) {
        report
            .by_kind
            .iter()
            .find(|u| u.op == op && u.purpose == purpose)
            .map_or((0, 0, 0, 0), |u| {
                (u.requests, u.failures, u.bytes_sent, u.bytes_received)
            })
    }

    #[tokio::test]
    async fn every_request_is_counted_once_by_operation_and_purpose() {
        let accounting = Accounting::new();
        let stores = Stores::accounted(Arc::new(InMemory::new()), accounting.clone());
        let wal = stores.get(Purpose::Wal);
        let gc = stores.get(Purpose::Gc);
        let p = Path::from("wal/a");
        wal.put(&p, PutPayload::from_static(b"hello"))
            .await
            .unwrap();
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        // A lost conditional create is an answer, not a failure.
        let err = wal
            .put_opts(&p, PutPayload::from_static(b"again"), create)
            .await
            .unwrap_err();
        assert!(matches!(err, object_store::Error::AlreadyExists { .. }));
        assert_eq!(wal.get(&p).await.unwrap().bytes().await.unwrap().len(), 5);
        assert_eq!(wal.get_range(&p, 1..3).await.unwrap().len(), 2);
        assert_eq!(wal.head(&p).await.unwrap().size, 5);
        assert!(wal.get(&Path::from("wal/missing")).await.is_err());
        for i in 0..(LIST_PAGE_ENTRIES + 1) {
            gc.put(
                &Path::from(format!("many/{i}")),
                PutPayload::from_static(b"x"),
            )
            .await
            .unwrap();
        }
        let listed: Vec<_> = gc
            .list(Some(&Path::from("many")))
            .try_collect()
            .await
            .unwrap();
        assert_eq!(listed.len() as u64, LIST_PAGE_ENTRIES + 1);
        let none: Vec<_> = gc
            .list(Some(&Path::from("nothing")))
            .try_collect()
            .await
            .unwrap();
        assert!(none.is_empty());
        let doomed = futures::stream::iter(vec![Ok(p.clone()), Ok(Path::from("many/1"))]).boxed();
        let _: Vec<Path> = gc.delete_stream(doomed).try_collect().await.unwrap();

        let r = accounting.report();
        assert_eq!(usage(&r, Op::Put, Purpose::Wal), (2, 0, 10, 0));
        assert_eq!(usage(&r, Op::Get, Purpose::Wal), (2, 0, 0, 5));
        assert_eq!(usage(&r, Op::GetRange, Purpose::Wal), (1, 0, 0, 2));
        assert_eq!(usage(&r, Op::Head, Purpose::Wal), (1, 0, 0, 0));
        assert_eq!(
            usage(&r, Op::Put, Purpose::Gc).0,
            LIST_PAGE_ENTRIES + 1,
            "puts under their own purpose"
        );
        assert_eq!(
            usage(&r, Op::List, Purpose::Gc).0,
            3,
            "two pages, and an empty listing"
        );
        assert_eq!(usage(&r, Op::Delete, Purpose::Gc).0, 2);
        assert_eq!(r.requests_for(Purpose::Wal), 6);
        assert_eq!(r.failures, 0);
        assert_eq!(
            r.requests,
            r.by_kind.iter().map(|u| u.requests).sum::<u64>()
        );
    }

    #[tokio::test]
    async fn faults_above_the_accounting_are_not_requests() {
        let accounting = Accounting::new();
        let faults = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let stores = Stores::with_faults(Arc::new(InMemory::new()), accounting.clone(), &faults);
        let meta = stores.get(Purpose::Meta);
        let p = Path::from("meta/log/1");
        // Injected before the store: no request reached it.
        faults.fail_next_puts(2);
        assert!(meta.put(&p, PutPayload::from_static(b"x")).await.is_err());
        assert!(meta.put(&p, PutPayload::from_static(b"x")).await.is_err());
        // Applied, then reported as a timeout: one request, which succeeded.
        faults.time_out_next_puts(1);
        assert!(meta.put(&p, PutPayload::from_static(b"x")).await.is_err());
        faults.set_down(true);
        assert!(meta.get(&p).await.is_err());
        faults.set_down(false);
        assert_eq!(meta.get(&p).await.unwrap().bytes().await.unwrap().len(), 1);
        let r = accounting.report();
        assert_eq!(usage(&r, Op::Put, Purpose::Meta), (1, 0, 1, 0));
        assert_eq!(usage(&r, Op::Get, Purpose::Meta), (1, 0, 0, 1));
        assert_eq!(r.requests, 2);
        // The injector's own counters see every attempt, shared by every handle.
        assert_eq!(faults.counters().puts.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn store_failures_are_counted_as_failures() {
        let accounting = Accounting::new();
        let broken = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        broken.set_down(true);
        let stores = Stores::accounted(Arc::new(broken), accounting.clone());
        let seg = stores.get(Purpose::Segment);
        assert!(seg.get(&Path::from("seg/x")).await.is_err());
        let listed: Vec<_> = seg.list(None).collect().await;
        assert!(listed.iter().all(|r| r.is_err()));
        let r = accounting.report();
        assert_eq!(usage(&r, Op::Get, Purpose::Segment), (1, 1, 0, 0));
        assert_eq!(usage(&r, Op::List, Purpose::Segment), (1, 1, 0, 0));
        assert_eq!(r.failures, 2);
    }
}
