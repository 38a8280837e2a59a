// The Mink console: pages drawn from the node's JSON API (/api/v1, docs/operations.md).
// Preact + htm, no build step; uPlot for the charts. Read-only: nothing here writes.

import { h, render } from "preact";
import { useState, useEffect, useRef } from "preact/hooks";
import htm from "htm";

const html = htm.bind(h);

// ---- data ------------------------------------------------------------------------

/** GETs a JSON API path; an API error becomes an Error with its message. */
async function getJson(path, signal) {
  const response = await fetch(path, { signal, headers: { accept: "application/json" } });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body && body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${response.status}`;
    throw new Error(message);
  }
  return body;
}

/** The answer of `path`, refetched every `everyMs` (0: once). */
function useApi(path, everyMs) {
  const [state, setState] = useState({ data: null, error: null });
  useEffect(() => {
    if (!path) return undefined;
    const controller = new AbortController();
    let timer = null;
    const load = async () => {
      try {
        const data = await getJson(path, controller.signal);
        setState({ data, error: null });
      } catch (e) {
        if (controller.signal.aborted) return;
        setState((s) => ({ data: s.data, error: e.message }));
      }
      if (everyMs > 0 && !controller.signal.aborted) timer = setTimeout(load, everyMs);
    };
    load();
    return () => {
      controller.abort();
      clearTimeout(timer);
    };
  }, [path, everyMs]);
  return state;
}

const fmt = new Intl.NumberFormat("en-US");
const num = (v) => (v === null || v === undefined ? "—" : fmt.format(v));
const fixed = (v, digits = 2) => (v === null || v === undefined ? "—" : Number(v).toFixed(digits));
const ms = (seconds) => (seconds === null || seconds === undefined ? "—" : `${(seconds * 1000).toFixed(1)} ms`);
const bytes = (b) => {
  if (b === null || b === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i += 1; }
  return `${b.toFixed(i ? 1 : 0)} ${units[i]}`;
};
const age = (millis) => {
  if (millis === null || millis === undefined) return "—";
  const s = Math.round(millis / 1000);
  return s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${Math.round(s / 3600)} h`;
};
const enc = encodeURIComponent;
const tableUrl = (db, t) => `/api/v1/tables/${enc(db)}/${enc(t)}`;

function ErrorBox({ error }) {
  return error ? html`<div class="error" role="alert">${error}</div>` : null;
}

function Card({ k, v, testid }) {
  return html`<div class="card" data-card=${testid || k}><div class="v">${v}</div><div class="k">${k}</div></div>`;
}

// ---- pages -------------------------------------------------------------------------

function ClusterPage() {
  const { data, error } = useApi("/api/v1/cluster", 2000);
  return html`<h1>Cluster</h1>
    <${ErrorBox} error=${error} />
    ${data && html`
      <div class="cards">
        <${Card} k="nodes" v=${data.nodes.length} />
        <${Card} k="serving" v=${data.nodes.filter((n) => n.state === "serving").length} />
        <${Card} k="tables" v=${data.tables} />
        <${Card} k="buckets" v=${data.buckets} />
        <${Card} k="buckets without leader" v=${data.buckets_without_leader} testid="leaderless" />
        <${Card} k=${`lease holder (term ${data.lease.term})`} v=${data.lease.holder || "none"} testid="lease" />
        <${Card} k="metadata applied index (this node)" v=${num(data.applied_index)} testid="applied" />
      </div>
      <table id="nodes">
        <thead><tr><th>node</th><th>state</th><th>Flight</th><th>Kafka</th><th class="num">incarnation</th>
          <th>WAL generation</th><th class="num">buckets led</th><th class="num">tablets open</th>
          <th class="num">applied index</th><th>role</th></tr></thead>
        <tbody>${data.nodes.map((n) => html`
          <tr data-node=${n.id} data-state=${n.state}>
            <td><b>${n.id}</b>${n.this_node ? html` <span class="muted">(this node)</span>` : ""}</td>
            <td><span class=${`badge ${n.state}`}>${n.state.replace("_", " ")}</span>
              ${n.problem && html`<div class="muted">${n.problem}</div>`}</td>
            <td class="mono">${n.flight_addr}</td><td class="mono">${n.kafka_addr || "—"}</td>
            <td class="num">${n.incarnation}</td><td class="mono">${n.wal || "—"}</td>
            <td class="num" data-led>${n.buckets_led}</td><td class="num">${num(n.tablets_open)}</td>
            <td class="num">${num(n.applied_index)}</td>
            <td>${n.lease_holder ? html`<span class="badge">lease holder</span>` : ""}</td>
          </tr>`)}
        </tbody>
      </table>`}`;
}

function TablesPage() {
  const { data, error } = useApi("/api/v1/tables", 5000);
  const [filter, setFilter] = useState("");
  const tables = data ? data.tables.filter((t) => `${t.database}.${t.table}`.toLowerCase().includes(filter.toLowerCase())) : [];
  return html`<h1>Tables</h1>
    <${ErrorBox} error=${error} />
    <form class="inline" onSubmit=${(e) => e.preventDefault()}>
      <input id="table-search" type="search" placeholder="Search by name" value=${filter}
        onInput=${(e) => setFilter(e.target.value)} />
      ${data && html`<span class="muted">${tables.length} of ${data.tables.length}</span>`}
    </form>
    ${data && html`<table id="tables">
      <thead><tr><th>database</th><th>table</th><th>kind</th><th class="num">buckets</th>
        <th class="num">partitions</th><th class="num">schema</th><th class="num">rows retained</th><th class="num">stored</th><th></th></tr></thead>
      <tbody>${tables.map((t) => html`
        <tr data-table=${`${t.database}.${t.table}`}>
          <td>${t.database}</td>
          <td><a href=${`#/tables/${enc(t.database)}/${enc(t.table)}`}>${t.table}</a></td>
          <td>${t.kind === "log" ? "log" : "primary key"}</td>
          <td class="num">${t.bucket_count}</td>
          <td class="num">${t.partitioned ? t.partitions : "—"}</td>
          <td class="num">v${t.schema_id}</td>
          <td class="num" title=${`${t.buckets_reporting} buckets reported by their leaders, ${t.buckets_from_metadata} counted from the stream metadata (compacted rows only)`}>${num(t.rows)}</td>
          <td class="num bytes">${bytes(t.bytes)}</td>
          <td><a href=${`#/data/${enc(t.database)}/${enc(t.table)}`}>data</a></td>
        </tr>`)}
      </tbody></table>`}`;
}

function Schema({ schema, primaryKey }) {
  return html`<table class="schema">
    <thead><tr><th>column</th><th>type</th><th>nullable</th><th>comment</th></tr></thead>
    <tbody>${schema.columns.map((c) => html`<tr>
      <td>${c.name}${primaryKey.includes(c.name) ? html` <span class="badge">key</span>` : ""}</td>
      <td class="mono">${typeof c.type === "string" ? c.type : JSON.stringify(c.type)}</td>
      <td>${c.nullable === false ? "no" : "yes"}</td><td>${c.comment || ""}</td></tr>`)}
    </tbody></table>`;
}

function TablePage({ db, table }) {
  const { data, error } = useApi(tableUrl(db, table), 2000);
  if (!data) return html`<h1>${db}.${table}</h1><${ErrorBox} error=${error} />`;
  const d = data.descriptor;
  const pk = d.primary_key || [];
  return html`<h1>${db}.${table} <span class="badge">${data.kind === "log" ? "log table" : "primary-key table"}</span></h1>
    <${ErrorBox} error=${error} />
    <p><a href=${`#/data/${enc(db)}/${enc(table)}`}>Rows and live tail →</a></p>
    <div class="cards">
      <${Card} k="buckets" v=${d.bucket_count} />
      <${Card} k="rows retained" v=${num(data.buckets.reduce((s, b) => s + (b.rows || 0), 0))} testid="rows" />
      <${Card} k="stored" v=${bytes(data.buckets.reduce((s, b) => s + (b.bytes || 0), 0))} testid="bytes" />
      <${Card} k="primary key" v=${pk.length ? pk.join(", ") : "—"} />
      <${Card} k="partition keys" v=${(d.partition_keys || []).join(", ") || "—"} />
      <${Card} k="bucket keys" v=${(d.bucket_keys || pk).join(", ") || "round robin"} />
      <${Card} k="lake snapshot age" v=${data.lake ? age(data.lake.age_ms) : "not tiered"} />
    </div>
    <h2>Buckets</h2>
    <table id="buckets">
      <thead><tr><th>bucket</th><th>partition</th><th>leader</th><th class="num">leader epoch</th>
        <th class="num">log start</th><th class="num">high watermark</th><th class="num">rows</th><th class="num">stored</th>
        <th class="num">lake offset</th><th class="num">lake lag</th><th>KV snapshot</th></tr></thead>
      <tbody>${data.buckets.map((b) => html`
        <tr data-bucket=${b.bucket} data-partition=${b.partition || ""} data-leader=${b.leader || ""} data-hw=${b.high_watermark ?? ""}>
          <td>${b.bucket}</td><td>${b.partition || "—"}</td>
          <td>${b.leader || html`<span class="badge down">none</span>`}</td>
          <td class="num">${b.leader_epoch}</td><td class="num">${num(b.log_start)}</td>
          <td class="num hw">${num(b.high_watermark)}</td><td class="num">${num(b.rows)}</td><td class="num bytes">${bytes(b.bytes)}</td>
          <td class="num">${num(b.lake_offset)}</td><td class="num">${num(b.lake_lag)}</td>
          <td class="kv-snapshot">${b.kv_snapshot ? `#${b.kv_snapshot.snapshot_id} at ${num(b.kv_snapshot.log_offset)}, ${age(b.kv_snapshot.age_ms)} old (${num(b.kv_snapshot.changes_since)} changes since)` : "—"}</td>
        </tr>`)}
      </tbody></table>
    <h2>Schema (version ${d.schema.schema_id})</h2>
    <${Schema} schema=${d.schema} primaryKey=${pk} />
    ${data.schemas.length > 1 && html`<h2>Earlier versions</h2>${data.schemas.slice(0, -1).reverse().map((s) => html`
      <h3>version ${s.schema_id}</h3><${Schema} schema=${s} primaryKey=${pk} />`)}`}
    ${data.partitions.length > 0 && html`<h2>Partitions</h2><p>${data.partitions.map((p) => html`<span class="badge">${p.name}</span> `)}</p>`}
    ${Object.keys(d.properties || {}).length > 0 && html`<h2>Properties</h2><pre class="mono">${JSON.stringify(d.properties, null, 2)}</pre>`}`;
}

function Rows({ columns, rows, id }) {
  const meta = ["_bucket", "_partition", "_offset", "_change_type"].filter((k) => rows.some((r) => k in r));
  const cols = [...meta, ...columns];
  const show = (v) => (v === null || v === undefined ? html`<span class="muted">null</span>` : typeof v === "object" ? JSON.stringify(v) : String(v));
  return html`<table id=${id}><thead><tr>${cols.map((c) => html`<th>${c}</th>`)}</tr></thead>
    <tbody>${rows.map((r) => html`<tr data-offset=${r._offset}>${cols.map((c) => html`<td class="cell">${show(r[c])}</td>`)}</tr>`)}</tbody></table>`;
}

function Tail({ db, table, columns, buckets, partition }) {
  const [running, setRunning] = useState(false);
  const [rows, setRows] = useState([]);
  const [error, setError] = useState(null);
  useEffect(() => {
    if (!running) return undefined;
    const controller = new AbortController();
    const cursors = {};
    for (const b of buckets) if ((b.partition || "") === (partition || "") && b.high_watermark !== null) cursors[b.bucket] = b.high_watermark;
    const loop = async () => {
      while (!controller.signal.aborted) {
        const from = Object.entries(cursors).map(([b, o]) => `${b}@${o}`).join(",");
        if (!from) { setError("no bucket of this table answers yet"); return; }
        const p = partition ? `&partition=${enc(partition)}` : "";
        try {
          const answer = await getJson(`${tableUrl(db, table)}/tail?from=${from}&wait_ms=10000${p}`, controller.signal);
          Object.assign(cursors, answer.next);
          setError(null);
          if (answer.rows.length) setRows((old) => [...answer.rows.reverse(), ...old].slice(0, 500));
        } catch (e) {
          if (controller.signal.aborted) return;
          setError(e.message);
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
    };
    loop();
    return () => controller.abort();
  }, [running, db, table, partition]);
  return html`<h2>Live tail</h2>
    <form class="inline" onSubmit=${(e) => e.preventDefault()}>
      <button id="tail-toggle" type="button" onClick=${() => setRunning(!running)}>${running ? "Stop" : "Start"} tail</button>
      <span class="muted" id="tail-status">${running ? `following ${buckets.filter((b) => (b.partition || "") === (partition || "")).length} buckets from their high watermarks; ${rows.length} rows so far` : "stopped"}</span>
    </form>
    <${ErrorBox} error=${error} />
    ${rows.length > 0 && html`<${Rows} columns=${columns} rows=${rows} id="tail-rows" />`}`;
}

function Lookup({ db, table, primaryKey }) {
  const [key, setKey] = useState("");
  const [answer, setAnswer] = useState(null);
  const [error, setError] = useState(null);
  const submit = async (e) => {
    e.preventDefault();
    let value = key.trim();
    try { JSON.parse(value); } catch { value = JSON.stringify(value); }
    try {
      setAnswer(await getJson(`${tableUrl(db, table)}/lookup?key=${enc(value)}`));
      setError(null);
    } catch (err) { setError(err.message); setAnswer(null); }
  };
  return html`<h2>Lookup by primary key (${primaryKey.join(", ")})</h2>
    <form class="inline" onSubmit=${submit}>
      <input id="lookup-key" placeholder=${primaryKey.length > 1 ? '["a", 1]' : "key"} value=${key} onInput=${(e) => setKey(e.target.value)} />
      <button type="submit">Look up</button>
      <span class="muted">a JSON value, or a JSON array for a key of several columns</span>
    </form>
    <${ErrorBox} error=${error} />
    ${answer && (answer.found ? html`<${Rows} columns=${Object.keys(answer.rows[0])} rows=${answer.rows} id="lookup-rows" />`
      : html`<p id="lookup-none">No row has this key.</p>`)}`;
}

function DataPage({ db, table }) {
  const [limit, setLimit] = useState(50);
  const [bucket, setBucket] = useState("");
  const detail = useApi(tableUrl(db, table), 0);
  const rowsPath = `${tableUrl(db, table)}/rows?limit=${limit}${bucket !== "" ? `&bucket=${bucket}` : ""}`;
  const { data, error } = useApi(rowsPath, 0);
  const d = detail.data;
  const partitions = d ? [...new Set(d.buckets.map((b) => b.partition).filter(Boolean))] : [];
  const [partition, setPartition] = useState(null);
  const chosenPartition = partition ?? partitions[0] ?? null;
  return html`<h1>${db}.${table}: data</h1>
    <p><a href=${`#/tables/${enc(db)}/${enc(table)}`}>← buckets and schema</a></p>
    <${ErrorBox} error=${detail.error || error} />
    <h2>Newest rows</h2>
    <form class="inline" onSubmit=${(e) => e.preventDefault()}>
      <label>rows <select id="rows-limit" value=${limit} onChange=${(e) => setLimit(Number(e.target.value))}>
        ${[10, 50, 200, 1000].map((n) => html`<option value=${n}>${n}</option>`)}</select></label>
      ${d && html`<label>bucket <select id="rows-bucket" value=${bucket} onChange=${(e) => setBucket(e.target.value)}>
        <option value="">all</option>${[...Array(d.descriptor.bucket_count).keys()].map((b) => html`<option value=${b}>${b}</option>`)}</select></label>`}
    </form>
    ${data && (data.rows.length ? html`<${Rows} columns=${data.columns} rows=${data.rows} id="newest-rows" />` : html`<p class="muted" id="no-rows">The table holds no rows.</p>`)}
    ${d && partitions.length > 0 && html`<form class="inline"><label>partition to tail
      <select value=${chosenPartition} onChange=${(e) => setPartition(e.target.value)}>${partitions.map((p) => html`<option value=${p}>${p}</option>`)}</select></label></form>`}
    ${d && html`<${Tail} db=${db} table=${table} columns=${d.descriptor.schema.columns.map((c) => c.name)} buckets=${d.buckets} partition=${chosenPartition} />`}
    ${d && d.kind === "primary_key" && html`<${Lookup} db=${db} table=${table} primaryKey=${d.descriptor.primary_key} />`}`;
}

function KafkaPage() {
  const groups = useApi("/api/v1/groups", 2000);
  const tables = useApi("/api/v1/tables", 5000);
  const kafkaDb = groups.data ? groups.data.kafka_database : "kafka";
  const topics = tables.data ? tables.data.tables.filter((t) => t.database === kafkaDb) : [];
  return html`<h1>Kafka</h1>
    <${ErrorBox} error=${groups.error || tables.error} />
    <h2>Topics (database <code>${kafkaDb}</code>)</h2>
    ${topics.length === 0 ? html`<p class="muted">No topics yet.</p>` : html`<table id="topics">
      <thead><tr><th>topic</th><th class="num">partitions</th><th class="num">rows retained</th></tr></thead>
      <tbody>${topics.map((t) => html`<tr data-topic=${t.table}><td><a href=${`#/tables/${enc(t.database)}/${enc(t.table)}`}>${t.table}</a></td>
        <td class="num">${t.bucket_count}</td><td class="num">${num(t.rows)}</td></tr>`)}</tbody></table>`}
    <h2>Consumer groups</h2>
    ${groups.data && (groups.data.groups.length === 0 ? html`<p class="muted">No consumer groups.</p>` : groups.data.groups.map((g) => {
      const lag = g.offsets.reduce((s, o) => s + (o.lag || 0), 0);
      return html`<div class="group" data-group=${g.group_id} data-lag=${lag}>
        <h3>${g.group_id} <span class=${`badge ${g.state}`}>${g.state}</span> <span class="muted">${g.protocol_type}${g.protocol ? ` / ${g.protocol}` : ""}, ${g.members.length} members, lag <b class="lag">${num(lag)}</b></span></h3>
        ${g.members.length > 0 && html`<table class="members"><thead><tr><th>member</th><th>client</th><th>host</th><th>assignment</th></tr></thead>
          <tbody>${g.members.map((m) => html`<tr><td class="mono">${m.member_id}</td><td>${m.client_id}</td><td>${m.client_host}</td>
            <td>${m.assignment.map((a) => `${a.topic} [${a.partitions.join(", ")}]`).join("; ") || "—"}</td></tr>`)}</tbody></table>`}
        ${g.offsets.length > 0 && html`<table class="offsets"><thead><tr><th>topic</th><th class="num">partition</th><th class="num">committed</th><th class="num">high watermark</th><th class="num">lag</th></tr></thead>
          <tbody>${g.offsets.map((o) => html`<tr data-partition=${o.partition}><td>${o.topic}</td><td class="num">${o.partition}</td><td class="num">${num(o.committed)}</td>
            <td class="num">${num(o.high_watermark)}</td><td class="num">${num(o.lag)}</td></tr>`)}</tbody></table>`}
      </div>`;
    }))}`;
}

/** A small uPlot line chart of `series` (name → values) over `times` (seconds). */
function Chart({ title, times, series, id, yFormat }) {
  const ref = useRef(null);
  const plot = useRef(null);
  const names = Object.keys(series);
  useEffect(() => {
    if (!ref.current || typeof window.uPlot !== "function") return undefined;
    const palette = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#718096", "#d69e2e", "#319795"];
    const opts = {
      width: 420, height: 180, title: "",
      scales: { x: { time: true } },
      axes: [{}, { values: (u, vals) => vals.map((v) => (yFormat ? yFormat(v) : v)) }],
      series: [{}, ...names.map((n, i) => ({ label: n, stroke: palette[i % palette.length], width: 1.5 }))],
    };
    plot.current = new window.uPlot(opts, [times, ...names.map((n) => series[n])], ref.current);
    return () => { plot.current.destroy(); plot.current = null; };
  }, [names.join(",")]);
  useEffect(() => {
    if (plot.current) plot.current.setData([times, ...names.map((n) => series[n])]);
  });
  return html`<div class="chart" id=${id}><h3>${title}</h3><div ref=${ref}></div></div>`;
}

function CostPage() {
  const { data, error } = useApi("/api/v1/cost", 2000);
  const now = data && data.now;
  const s = data ? data.series : [];
  const times = s.map((p) => p.at_ms / 1000);
  const ops = data ? data.prices.map((p) => p.op) : [];
  const byOp = Object.fromEntries(ops.filter((op) => s.some((p) => p.requests_per_s_by_op[op] > 0)).map((op) => [op, s.map((p) => p.requests_per_s_by_op[op])]));
  const price = data ? Object.fromEntries(data.prices.map((p) => [p.op, p.usd_per_1000])) : {};
  const month = 30 * 24 * 3600;
  return html`<h1>Object-store cost (this node)</h1>
    <${ErrorBox} error=${error} />
    ${data && !now && html`<p class="muted" id="cost-wait">Sampling every ${data.sample_every_s} s; the first rates appear after two samples.</p>`}
    ${now && html`
      <div class="cards">
        <${Card} k="requests / s" v=${fixed(now.requests_per_s, 1)} testid="rps" />
        <${Card} k="USD / month at this rate" v=${`$${fixed(now.usd_per_month, 2)}`} testid="usd" />
        <${Card} k="WAL ack p50" v=${ms(now.quantiles.wal_ack_p50_s)} testid="ack50" />
        <${Card} k="WAL ack p99" v=${ms(now.quantiles.wal_ack_p99_s)} testid="ack99" />
        <${Card} k="WAL upload p50" v=${bytes(now.quantiles.upload_bytes_p50)} />
        <${Card} k="WAL PUTs / s (budget)" v=${now.wal_put_rate_max ? `${fixed(now.per_s.wal_uploads, 1)} of ${fixed(now.wal_put_rate_max, 0)} (${fixed(now.wal_put_budget_used * 100, 0)}%)` : `${fixed(now.per_s.wal_uploads, 1)} (no budget)`} testid="budget" />
        <${Card} k="failures / s" v=${fixed(now.failures_per_s, 2)} />
        <${Card} k="throttled (503 SlowDown, 429) / s" v=${fixed(now.per_s.http_throttled, 2)} testid="throttled" />
        <${Card} k="HTTP attempts / s (retries included)" v=${fixed(now.per_s.http_requests, 1)} />
        <${Card} k="upload retries / s" v=${fixed(now.per_s.wal_upload_retries, 2)} />
        <${Card} k="writes refused (overload) / s" v=${fixed(now.per_s.writes_refused_overloaded, 2)} />
      </div>
      <div class="charts">
        <${Chart} id="chart-requests" title="requests / s by operation" times=${times} series=${Object.keys(byOp).length ? byOp : { all: s.map((p) => p.requests_per_s) }} />
        <${Chart} id="chart-usd" title="USD / month at each moment's rate" times=${times} series=${{ usd: s.map((p) => p.usd_per_month) }} />
        <${Chart} id="chart-ack" title="WAL ack latency (ms)" times=${times}
          series=${{ p50: s.map((p) => (p.quantiles.wal_ack_p50_s ?? null) && p.quantiles.wal_ack_p50_s * 1000), p99: s.map((p) => (p.quantiles.wal_ack_p99_s ?? null) && p.quantiles.wal_ack_p99_s * 1000) }} />
      </div>
      <h2>By operation</h2>
      <table id="cost-ops"><thead><tr><th>operation</th><th class="num">requests / s</th><th class="num">USD per 1,000</th><th class="num">USD / month</th></tr></thead>
        <tbody>${ops.map((op) => html`<tr data-op=${op}><td>${op}</td><td class="num">${fixed(now.requests_per_s_by_op[op], 2)}</td>
          <td class="num">${price[op]}</td><td class="num">${fixed(now.requests_per_s_by_op[op] * price[op] / 1000 * month, 2)}</td></tr>`)}</tbody></table>
      <h2>By purpose</h2>
      <table id="cost-purposes"><thead><tr><th>purpose</th><th class="num">requests / s</th></tr></thead>
        <tbody>${Object.entries(now.requests_per_s_by_purpose).map(([p, r]) => html`<tr><td>${p}</td><td class="num">${fixed(r, 2)}</td></tr>`)}</tbody></table>
      <p class="muted">${data.price_note}.</p>`}`;
}

function NotFound({ hash }) {
  return html`<h1>No such page</h1><p>${hash} is not a console page. <a href="#/cluster">Cluster</a></p>`;
}

// ---- the frame -----------------------------------------------------------------------

const PAGES = [["cluster", "Cluster"], ["tables", "Tables"], ["kafka", "Kafka"], ["cost", "Cost"]];

function route(hash) {
  const parts = hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const [page, db, table] = parts;
  if (!page || page === "cluster") return ["cluster", html`<${ClusterPage} />`];
  if (page === "tables" && db && table) return ["tables", html`<${TablePage} db=${db} table=${table} key=${hash} />`];
  if (page === "tables") return ["tables", html`<${TablesPage} />`];
  if (page === "data" && db && table) return ["tables", html`<${DataPage} db=${db} table=${table} key=${hash} />`];
  if (page === "kafka") return ["kafka", html`<${KafkaPage} />`];
  if (page === "cost") return ["cost", html`<${CostPage} />`];
  return [null, html`<${NotFound} hash=${hash} />`];
}

function App() {
  const [hash, setHash] = useState(window.location.hash);
  useEffect(() => {
    const on = () => setHash(window.location.hash);
    window.addEventListener("hashchange", on);
    return () => window.removeEventListener("hashchange", on);
  }, []);
  const health = useApi("/health", 5000);
  const [active, page] = route(hash);
  return html`<header>
      <span class="brand">Mink</span>
      <nav>${PAGES.map(([id, label]) => html`<a href=${`#/${id}`} class=${active === id ? "active" : ""}>${label}</a>`)}</nav>
      <span class="node" id="node-health">${health.data ? `this node: ${health.data.status}` : health.error ? "this node: not answering" : ""}</span>
    </header>
    <main>${page}</main>`;
}

const root = document.getElementById("app");
root.textContent = ""; // the "Loading" line: Preact renders beside what it finds
render(html`<${App} />`, root);
