package daemon

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/batch/accounts"
)

// Metrics are the tailer's Prometheus metrics, on a registry of their own.
type Metrics struct {
	reg            *prometheus.Registry
	published      prometheus.Counter
	skipped        *prometheus.CounterVec
	batches        *prometheus.CounterVec
	batchSize      prometheus.Histogram
	publishLatency prometheus.Histogram
	lastPosition   prometheus.Gauge
}

// NewMetrics registers the metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tailer_tokens_published_total", Help: "Tokens published to JetStream (PubAck received).",
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailer_tokens_skipped_total", Help: "Tokens not published, by reason.",
		}, []string{"reason"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailer_batches_published_total", Help: "Batches published, by why they were cut.",
		}, []string{"cut"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tailer_batch_size_tokens", Help: "Tokens per published batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		publishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tailer_publish_latency_seconds", Help: "Time from publishing a batch to its PubAck.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}),
		lastPosition: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tailer_last_done_commit_lsn", Help: "Commit LSN of the newest token published or skipped.",
		}),
	}
	for _, r := range accounts.Reasons {
		m.skipped.WithLabelValues(r.String())
	}
	for _, c := range []batch.CutReason{batch.CutLimit, batch.CutTimeout, batch.CutShutdown} {
		m.batches.WithLabelValues(c.String())
	}
	m.reg.MustRegister(m.published, m.skipped, m.batches, m.batchSize, m.publishLatency, m.lastPosition,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// BatchPublished implements publish.Observer.
func (m *Metrics) BatchPublished(b *batch.Batch, n int, latency time.Duration) {
	m.published.Add(float64(n))
	m.batches.WithLabelValues(b.Cut.String()).Inc()
	m.batchSize.Observe(float64(n))
	m.publishLatency.Observe(latency.Seconds())
}

// TokensSkipped implements publish.Observer.
func (m *Metrics) TokensSkipped(reason accounts.Skip, n int) {
	m.skipped.WithLabelValues(reason.String()).Add(float64(n))
}

// Confirmed records the newest batch that is done.
func (m *Metrics) Confirmed(b *batch.Batch) {
	m.lastPosition.Set(float64(b.Last().Commit))
}
