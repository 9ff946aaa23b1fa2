package daemon

import (
	"github.com/mailroom/tailer/publish/relay"
	"net/http"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/publish/audit"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/replication"
)

// Metrics are the tailer's Prometheus metrics, on a registry of their own.
// Every name is listed in MetricNames, which the infra tests compare with the
// dashboard and the alert rules.
type Metrics struct {
	reg            *prometheus.Registry
	published      prometheus.Counter
	skipped        *prometheus.CounterVec
	batches        *prometheus.CounterVec
	batchSize      prometheus.Histogram
	publishLatency prometheus.Histogram
	messageBatches prometheus.Histogram
	messageLatency prometheus.Histogram
	commitToAck    prometheus.Histogram
	joinLatency    prometheus.Histogram
	lastDone       prometheus.Gauge
	confirmed      prometheus.Gauge
	slotLag        prometheus.Gauge
	slotRetained   prometheus.Gauge
	slotConfirmed  prometheus.Gauge
	slotSampled    prometheus.Gauge
	slotHeld       prometheus.Gauge
	slotLost       prometheus.Gauge
	blocked        *prometheus.GaugeVec
	signingKeys    *prometheus.GaugeVec
	ready          prometheus.Gauge
	reconnects     *prometheus.CounterVec
	pending        prometheus.GaugeFunc
	lagSeconds     prometheus.GaugeFunc
	pubAckWait     prometheus.GaugeFunc
	auditMissing   prometheus.Gauge
	auditChecked   prometheus.Counter
	auditTwice     prometheus.Counter
	auditLast      prometheus.Gauge
}

// MetricNames lists the tailer's own metric families.
var MetricNames = []string{
	"tailer_tokens_published_total",
	"tailer_tokens_skipped_total",
	"tailer_batches_published_total",
	"tailer_batch_size_tokens",
	"tailer_publish_latency_seconds",
	"tailer_message_batches",
	"tailer_message_publish_seconds",
	"tailer_commit_to_ack_seconds",
	"tailer_last_done_commit_lsn",
	"tailer_confirmed_lsn",
	"tailer_slot_lag_bytes",
	"tailer_signing_key",
	"tailer_slot_retained_bytes",
	"tailer_slot_confirmed_lsn",
	"tailer_slot_sample_timestamp_seconds",
	"tailer_slot_held",
	"tailer_slot_invalidated",
	"tailer_blocked",
	"tailer_ready",
	"tailer_reconnects_total",
	"tailer_tokens_pending",
	"tailer_lag_seconds",
	"tailer_puback_wait_seconds",
	"tailer_audit_missing_tokens",
	"tailer_audit_checked_tokens_total",
	"tailer_audit_twice_tokens_total",
	"tailer_audit_last_complete_timestamp_seconds",
}

// NewMetrics registers the metrics. pending reports the tokens read from the
// WAL and not yet done, lag the lag in seconds, pubAckWait how long the
// oldest publish has awaited its PubAck.
func NewMetrics(pending, lag, pubAckWait func() float64) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.publishMetrics()
	m.slotMetrics()
	m.auditMetrics()
	m.pending = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tailer_tokens_pending", Help: "Tokens read from the WAL and not yet published or skipped.",
	}, pending)
	m.lagSeconds = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tailer_lag_seconds", Help: "How far behind the slot's confirmed position is in time: now minus the newest commit, heartbeat or sampled WAL position known to be confirmed (after PubAck). It grows a second a second while nothing is confirmed (the walsender stuck, NATS away, the holder frozen, as a standby sees it), and stays under about MAILROOM_HEARTBEAT_INTERVAL while the tailer keeps up.",
	}, lag)
	m.pubAckWait = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tailer_puback_wait_seconds", Help: "How long the oldest message published has awaited its PubAck (0: none awaits one). It grows while the stream's leader is partitioned or frozen, until MAILROOM_PUBACK_TIMEOUT starts the session again.",
	}, pubAckWait)
	for _, r := range join.Reasons {
		m.skipped.WithLabelValues(r.String())
	}
	for _, c := range []batch.CutReason{batch.CutLimit, batch.CutTimeout, batch.CutShutdown} {
		m.batches.WithLabelValues(c.String())
	}
	for _, t := range []string{targetPostgres, targetNATS} {
		m.reconnects.WithLabelValues(t)
	}
	for _, r := range relay.Reasons {
		m.blocked.WithLabelValues(r)
	}
	m.reg.MustRegister(m.published, m.skipped, m.batches, m.batchSize, m.publishLatency, m.messageBatches, m.messageLatency, m.commitToAck, m.joinLatency,
		m.lastDone, m.confirmed, m.slotLag, m.slotRetained, m.slotConfirmed, m.slotSampled, m.slotHeld, m.slotLost, m.blocked, m.signingKeys, m.ready,
		m.reconnects, m.pending, m.lagSeconds, m.pubAckWait, m.auditMissing, m.auditChecked, m.auditTwice, m.auditLast,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// publishMetrics makes the metrics of what is published.
func (m *Metrics) publishMetrics() {
	latency := prometheus.ExponentialBuckets(0.0001, 2, 18) // 100µs .. 13s
	m.published = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tailer_tokens_published_total", Help: "Tokens published to JetStream (PubAck received).",
	})
	m.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tailer_tokens_skipped_total", Help: "Tokens not published, by reason.",
	}, []string{"reason"})
	m.batches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tailer_batches_published_total", Help: "Batches published, by why they were cut (limit, timeout, shutdown).",
	}, []string{"cut"})
	m.batchSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tailer_batch_size_tokens", Help: "Tokens per published batch.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14),
	})
	m.publishLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tailer_publish_latency_seconds", Help: "Time from a batch being handed to the publisher (cut) to its PubAck: its join and its wait for a place in a message included.", Buckets: latency,
	})
	m.messageBatches = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tailer_message_batches", Help: "Batches each published message carried: more than one when batches became ready while earlier messages awaited their PubAck (group commit).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11),
	})
	m.messageLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tailer_message_publish_seconds", Help: "Time from publishing a message to its PubAck: the stream's commit, its sync to disk included.", Buckets: latency,
	})
	m.commitToAck = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tailer_commit_to_ack_seconds", Help: "Time from the commit of a batch's oldest token to the batch's PubAck.", Buckets: latency,
	})
	m.joinLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tailer_join_seconds", Help: "Time of each query joining tokens to their accounts (one for the batches ready at once), its waits for transactions not yet visible included.", Buckets: latency,
	})
}

// slotMetrics makes the metrics of the slot and the tailer's state.
func (m *Metrics) slotMetrics() {
	m.lastDone = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_last_done_commit_lsn", Help: "Commit LSN of the newest token published or skipped.",
	})
	m.confirmed = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_confirmed_lsn", Help: "Last position this instance reported to the slot as flushed.",
	})
	m.slotLag = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_slot_lag_bytes", Help: "pg_current_wal_lsn() minus the slot's confirmed_flush_lsn, sampled.",
	})
	m.slotRetained = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_slot_retained_bytes", Help: "WAL the slot makes the server keep: pg_current_wal_lsn() minus restart_lsn, sampled.",
	})
	m.slotConfirmed = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_slot_confirmed_lsn", Help: "The slot's confirmed_flush_lsn, sampled.",
	})
	m.slotSampled = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_slot_sample_timestamp_seconds", Help: "When the slot was last sampled successfully (Unix time).",
	})
	m.slotLost = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_slot_invalidated", Help: "1 when the slot is lost (wal_status lost: WAL it needed was removed) or dropped (the slot its record names is gone): its tokens cannot be read from it.",
	})
	m.blocked = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tailer_blocked", Help: "1 while the tailer waits for the operator, by reason: resync (tailer resync is the way out), schema (a table or column it reads changed), publication (it does not carry token inserts), stream (the stream lost what it acknowledged, or is another's), nats (NATS stores nothing: its store full, the tailer's user denied).",
	}, []string{"reason"})
	m.signingKeys = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tailer_signing_key", Help: "1 for each key of the keyring this tailer verifies with, by id; primary=\"true\" on the one that signs new tokens (a rotation shows here as the primary's id changing).",
	}, []string{"key_id", "primary"})
	m.slotHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_slot_held", Help: "1 while this instance streams from the slot, 0 while it stands by or reconnects.",
	})
	m.ready = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_ready", Help: "1 when /readyz answers ready.",
	})
	m.reconnects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tailer_reconnects_total", Help: "Reconnects by target (postgres, nats): sessions restarted after a failure, and NATS client reconnects.",
	}, []string{"target"})
}

// auditMetrics makes the metrics of the continuous audit.
func (m *Metrics) auditMetrics() {
	m.auditMissing = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_audit_missing_tokens", Help: "Tokens an audit found missing from the stream (eligible when the slot confirmed past them), not healed nor acknowledged since (tailer audit --heal, --acknowledge): the slot's record, read every MAILROOM_AUDIT_INTERVAL.",
	})
	m.auditChecked = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tailer_audit_checked_tokens_total", Help: "Tokens tailer run's audit found on the stream by key.",
	})
	m.auditTwice = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tailer_audit_twice_tokens_total", Help: "Tokens tailer run's audit found on the stream more than once (consumers that drop a token they have by key deliver them once).",
	})
	m.auditLast = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tailer_audit_last_complete_timestamp_seconds", Help: "When tailer run's audit last finished (Unix time): it stays behind while the audit cannot finish (NATS or PostgreSQL away, the stream changing as it is read, the tailer behind).",
	})
}

// audited counts what a complete audit found.
func (m *Metrics) audited(rep audit.Report) {
	m.auditChecked.Add(float64(rep.Checked))
	m.auditTwice.Add(float64(len(rep.Twice)))
	m.auditLast.SetToCurrentTime()
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// BatchPublished implements publish.Observer.
func (m *Metrics) BatchPublished(b *batch.Batch, n int, latency time.Duration) {
	m.published.Add(float64(n))
	m.batches.WithLabelValues(b.Cut.String()).Inc()
	m.batchSize.Observe(float64(n))
	m.publishLatency.Observe(latency.Seconds())
	m.commitToAck.Observe(time.Since(b.Tokens[0].Committed()).Seconds())
}

// MessagePublished implements publish.Observer.
func (m *Metrics) MessagePublished(batches, _ int, latency time.Duration) {
	m.messageBatches.Observe(float64(batches))
	m.messageLatency.Observe(latency.Seconds())
}

// Joined implements publish.Observer.
func (m *Metrics) Joined(_ int, latency time.Duration) { m.joinLatency.Observe(latency.Seconds()) }

// TokensSkipped implements publish.Observer.
func (m *Metrics) TokensSkipped(reason join.Skip, n int) {
	m.skipped.WithLabelValues(reason.String()).Add(float64(n))
}

// BatchDone implements publish.Observer.
func (m *Metrics) BatchDone(b *batch.Batch)     { m.lastDone.Set(float64(b.Last().Commit)) }
func (m *Metrics) statusSent(lsn pglogrepl.LSN) { m.confirmed.Set(float64(lsn)) }
func (m *Metrics) reconnect(target string)      { m.reconnects.WithLabelValues(target).Inc() }
func (m *Metrics) setHeld(held bool)            { m.slotHeld.Set(b2f(held)) }
func (m *Metrics) setReady(ready bool)          { m.ready.Set(b2f(ready)) }

// setKeys shows the keyring's keys, the primary marked.
func (m *Metrics) setKeys(ids []string, primary string) {
	m.signingKeys.Reset()
	for _, id := range ids {
		m.signingKeys.WithLabelValues(id, b2s(id == primary)).Set(1)
	}
}

func b2s(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// setBlocked marks reason as why the tailer waits ("": it does not).
func (m *Metrics) setBlocked(reason string) {
	for _, r := range relay.Reasons {
		m.blocked.WithLabelValues(r).Set(b2f(r == reason))
	}
}
func (m *Metrics) slotSample(s replication.SlotInfo) {
	m.slotLag.Set(float64(s.LagBytes()))
	m.slotRetained.Set(float64(s.RetainedBytes()))
	m.slotConfirmed.Set(float64(s.ConfirmedFlush))
	m.slotSampled.SetToCurrentTime()
	m.slotLost.Set(b2f(s.Lost()))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
