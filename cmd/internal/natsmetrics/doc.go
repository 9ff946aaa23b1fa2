// Package natsmetrics exports what NATS servers say about themselves on
// their monitoring port (/varz, /jsz, /healthz) as Prometheus metrics:
// the broker's own view of the stream, its consumers, its storage and the
// cluster, which still speaks when the tailer and every subscriber are
// down. tailer nats-metrics serves it (the compose stack's nats-exporter
// service); it needs no NATS credentials, only the monitoring port.
//
// Each stream's and consumer's series come from the server that leads it
// (or the only server), so that an R3 stream is one series, not three
// that disagree while a follower catches up.
//
// Wiring: beside the data path, for operators.
package natsmetrics
