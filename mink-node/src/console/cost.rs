//! The cost page's numbers: a sample of the node's own counters every [`EVERY`],
//! the last [`SAMPLES`] kept, turned into rates. Requests, failures and bytes come
//! from the object-store accounting (`mink_wal::accounting`); WAL acknowledgement
//! latency and upload sizes from the quantiles the node's Prometheus recorder reports
//! (`mink_wal_ack_latency_seconds`, `mink_wal_group_bytes`); retries, upload failures
//! and writes refused as overloaded from its counters. The price of a rate is S3
//! Standard's list price ([`Op::list_price_usd`]) over a 30-day month.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use mink_wal::accounting::{AccountingReport, Op};
use serde_json::{Value, json};

/// How often the counters are sampled.
pub const EVERY: Duration = Duration::from_secs(2);
/// Samples kept: ten minutes.
pub const SAMPLES: usize = 300;
const SECONDS_PER_MONTH: f64 = 30.0 * 24.0 * 3600.0;

/// Metrics read off the Prometheus rendering, by the name and labels they are
/// rendered with.
const QUANTILES: [(&str, &str); 4] = [
    (
        "wal_ack_p50_s",
        "mink_wal_ack_latency_seconds{quantile=\"0.5\"}",
    ),
    (
        "wal_ack_p99_s",
        "mink_wal_ack_latency_seconds{quantile=\"0.99\"}",
    ),
    ("upload_bytes_p50", "mink_wal_group_bytes{quantile=\"0.5\"}"),
    (
        "upload_bytes_p99",
        "mink_wal_group_bytes{quantile=\"0.99\"}",
    ),
];
/// Gauges, as last reported: the key they are reported under and the metric.
const GAUGES: [(&str, &str); 1] = [("wal_put_rate_max", "mink_wal_put_rate_max")];
/// Counters: the key they are reported under, the metric, and what its series must
/// contain to count (`""`: every series; a counter with labels is the sum of its
/// series).
const COUNTERS: [(&str, &str, &str); 7] = [
    ("wal_uploads", "mink_wal_uploads_total", ""),
    ("wal_upload_bytes", "mink_wal_upload_bytes_total", ""),
    ("wal_upload_retries", "mink_wal_upload_retries_total", ""),
    ("wal_upload_failures", "mink_wal_upload_failures_total", ""),
    (
        "writes_refused_overloaded",
        "mink_node_writes_refused_overloaded_total",
        "",
    ),
    // S3 stores only: every HTTP attempt (object_store's retries included), and the
    // answers asking the client to slow down (503 SlowDown, 429).
    ("http_requests", "mink_object_store_http_requests_total", ""),
    (
        "http_throttled",
        "mink_object_store_http_requests_total",
        "status=\"throttled\"",
    ),
];

/// One look at the counters.
#[derive(Debug, Clone, Default)]
struct Sample {
    at_ms: i64,
    /// Requests by operation (`Op::as_str`), every purpose.
    by_op: BTreeMap<&'static str, u64>,
    /// Requests by purpose, every operation.
    by_purpose: BTreeMap<&'static str, u64>,
    failures: u64,
    bytes_sent: u64,
    bytes_received: u64,
    /// Quantiles as last reported (not rates).
    quantiles: BTreeMap<&'static str, f64>,
    /// Gauges as last reported.
    gauges: BTreeMap<&'static str, f64>,
    /// Monotonic counters.
    counters: BTreeMap<&'static str, f64>,
}

/// The samples of the last minutes.
#[derive(Default)]
pub struct CostHistory {
    samples: Mutex<VecDeque<Sample>>,
}

impl CostHistory {
    /// Records one sample of `report` (None: the store is not accounted) and of the
    /// Prometheus `rendered` text.
    pub fn record(&self, at_ms: i64, report: Option<&AccountingReport>, rendered: &str) {
        let mut sample = Sample {
            at_ms,
            ..Default::default()
        };
        if let Some(r) = report {
            for u in &r.by_kind {
                *sample.by_op.entry(u.op.as_str()).or_default() += u.requests;
                *sample.by_purpose.entry(u.purpose.as_str()).or_default() += u.requests;
            }
            sample.failures = r.failures;
            sample.bytes_sent = r.bytes_sent;
            sample.bytes_received = r.bytes_received;
        }
        let values = prometheus_values(rendered);
        for (key, series) in QUANTILES {
            if let Some(v) = values.get(series) {
                sample.quantiles.insert(key, *v);
            }
        }
        for (key, series) in GAUGES {
            if let Some(v) = values.get(series) {
                sample.gauges.insert(key, *v);
            }
        }
        for (key, name, having) in COUNTERS {
            let total: f64 = values
                .iter()
                .filter(|(series, _)| {
                    (series.as_str() == name || series.starts_with(&format!("{name}{{")))
                        && series.contains(having)
                })
                .map(|(_, v)| v)
                .sum();
            sample.counters.insert(key, total);
        }
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back(sample);
        while samples.len() > SAMPLES {
            samples.pop_front();
        }
    }

    /// The `/api/v1/cost` answer: rates over the newest interval (`now`) and over
    /// each interval of the kept history (`series`), with their monthly price.
    pub fn report(&self) -> Value {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let series: Vec<Value> = samples
            .iter()
            .zip(samples.iter().skip(1))
            .filter_map(|(a, b)| rates(a, b))
            .collect();
        let window = samples
            .len()
            .checked_sub(1)
            .and_then(|last| Some((samples.get(last.saturating_sub(15))?, samples.get(last)?)));
        let now = window.and_then(|(a, b)| rates(a, b));
        let prices: Vec<Value> = Op::ALL
            .iter()
            .map(|op| json!({"op": op.as_str(), "usd_per_1000": op.list_price_usd() * 1000.0}))
            .collect();
        json!({
            "sample_every_s": EVERY.as_secs_f64(),
            "samples": samples.len(),
            "prices": prices,
            "price_note": "S3 Standard list prices (us-east-1), 30-day month; storage (GB-month) and transfer are not counted",
            "now": now,
            "series": series,
        })
    }
}

/// Rates between two samples (`None` when no time passed).
fn rates(a: &Sample, b: &Sample) -> Option<Value> {
    let seconds = (b.at_ms - a.at_ms) as f64 / 1000.0;
    if seconds <= 0.0 {
        return None;
    }
    let per_s = |x: u64, y: u64| y.saturating_sub(x) as f64 / seconds;
    let by_op: BTreeMap<&str, f64> = Op::ALL
        .iter()
        .map(|op| {
            let name = op.as_str();
            let get = |s: &Sample| s.by_op.get(name).copied().unwrap_or(0);
            (name, per_s(get(a), get(b)))
        })
        .collect();
    let usd_per_month: f64 = Op::ALL
        .iter()
        .map(|op| by_op[op.as_str()] * op.list_price_usd() * SECONDS_PER_MONTH)
        .sum();
    let by_purpose: BTreeMap<&str, f64> = b
        .by_purpose
        .iter()
        .map(|(p, n)| {
            let before = a.by_purpose.get(p).copied().unwrap_or(0);
            (*p, per_s(before, *n))
        })
        .collect();
    let counter = |k: &str| {
        let get = |s: &Sample| s.counters.get(k).copied().unwrap_or(0.0);
        ((get(b) - get(a)) / seconds).max(0.0)
    };
    let counters: BTreeMap<&str, f64> = COUNTERS.iter().map(|(k, ..)| (*k, counter(k))).collect();
    // The group-commit budget (`wal.put_rate_max`) and how much of it the WAL uploads
    // use: null when the node keeps none.
    let budget = b
        .gauges
        .get("wal_put_rate_max")
        .copied()
        .filter(|n| *n > 0.0);
    let budget_used = budget.map(|n| counters["wal_uploads"] / n);
    Some(json!({
        "at_ms": b.at_ms,
        "requests_per_s": by_op.values().sum::<f64>(),
        "requests_per_s_by_op": by_op,
        "requests_per_s_by_purpose": by_purpose,
        "failures_per_s": per_s(a.failures, b.failures),
        "bytes_sent_per_s": per_s(a.bytes_sent, b.bytes_sent),
        "bytes_received_per_s": per_s(a.bytes_received, b.bytes_received),
        "usd_per_month": usd_per_month,
        "quantiles": b.quantiles,
        "per_s": counters,
        "wal_put_rate_max": budget,
        "wal_put_budget_used": budget_used,
    }))
}

/// `series → value` of a Prometheus text exposition (comments skipped).
fn prometheus_values(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_prices_follow_the_counters() {
        let history = CostHistory::default();
        let text = |uploads: u32| {
            format!(
                "# TYPE mink_wal_uploads_total counter\nmink_wal_uploads_total {uploads}\n\
                 mink_wal_ack_latency_seconds{{quantile=\"0.5\"}} 0.04\n\
                 mink_wal_ack_latency_seconds{{quantile=\"0.99\"}} 0.2\n\
                 mink_wal_put_rate_max 10\n\
                 mink_node_writes_refused_overloaded_total{{reason=\"bytes\"}} 3\n\
                 mink_object_store_http_requests_total{{method=\"put\",status=\"2xx\"}} {uploads}\n\
                 mink_object_store_http_requests_total{{method=\"put\",status=\"throttled\"}} {half}\n\
                 mink_object_store_http_requests_total{{method=\"get\",status=\"throttled\"}} {half}\n",
                half = uploads / 2
            )
        };
        let report = |puts: u64, gets: u64| AccountingReport {
            requests: puts + gets,
            failures: 0,
            bytes_sent: puts * 100,
            bytes_received: 0,
            by_kind: vec![
                mink_wal::accounting::Usage {
                    op: Op::Put,
                    purpose: mink_wal::accounting::Purpose::Wal,
                    requests: puts,
                    failures: 0,
                    bytes_sent: puts * 100,
                    bytes_received: 0,
                    latency_us_mean: 1,
                },
                mink_wal::accounting::Usage {
                    op: Op::Get,
                    purpose: mink_wal::accounting::Purpose::Meta,
                    requests: gets,
                    failures: 0,
                    bytes_sent: 0,
                    bytes_received: 0,
                    latency_us_mean: 1,
                },
            ],
        };
        assert!(history.report()["now"].is_null(), "no interval yet");
        history.record(0, Some(&report(0, 0)), &text(0));
        history.record(2_000, Some(&report(20, 10)), &text(8));
        let r = history.report();
        let now = &r["now"];
        assert_eq!(now["requests_per_s_by_op"]["put"], 10.0);
        assert_eq!(now["requests_per_s_by_op"]["get"], 5.0);
        assert_eq!(now["requests_per_s_by_purpose"]["wal"], 10.0);
        assert_eq!(now["per_s"]["wal_uploads"], 4.0);
        // Throttled answers of every method, told apart from the other HTTP answers.
        assert_eq!(now["per_s"]["http_throttled"], 4.0);
        assert_eq!(now["per_s"]["http_requests"], 8.0);
        assert_eq!(now["quantiles"]["wal_ack_p99_s"], 0.2);
        // 4 uploads a second of a budget of 10.
        assert_eq!(now["wal_put_rate_max"], 10.0);
        assert_eq!(now["wal_put_budget_used"], 0.4);
        let month = 30.0 * 24.0 * 3600.0;
        let expected = (10.0 * 0.005 / 1000.0 + 5.0 * 0.0004 / 1000.0) * month;
        assert!((now["usd_per_month"].as_f64().unwrap() - expected).abs() < 1e-9);
        assert_eq!(r["series"].as_array().unwrap().len(), 1);
        for i in 0..(SAMPLES as i64 + 10) {
            history.record(4_000 + i * 2_000, None, "");
        }
        assert_eq!(history.report()["samples"], SAMPLES);
    }
}
