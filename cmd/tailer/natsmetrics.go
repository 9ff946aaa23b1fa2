package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/natsmetrics"
)

func (x *cli) natsMetricsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "nats-metrics",
		Short: "export the NATS servers' view of the stream, consumers and cluster to Prometheus",
		Long: `Serve the NATS servers' own view (the stream, its consumers, storage, the
cluster) as Prometheus metrics, read from their monitoring ports.`,
	}
	urls := c.Flags().String("monitor-url", "http://127.0.0.1:8222", "the NATS servers' monitoring ports (their http setting), comma-separated")
	addr := c.Flags().String("http-addr", "127.0.0.1:7777", "serve /metrics, /healthz and /readyz (a server answered at the last scrape) on this address")
	timeout := c.Flags().Duration("timeout", 5*time.Second, "how long a scrape waits for the servers")
	return x.leaf(c, func(c *cobra.Command, _ []string) int {
		m, err := natsmetrics.New(strings.Split(*urls, ","), *timeout)
		if err != nil {
			fmt.Fprintf(x.stderr, "tailer nats-metrics: --monitor-url: %v\n", err)
			return exitConfig
		}
		return natsMetrics(c.Context(), m, *addr, x.stderr)
	})
}

// natsMetrics serves the NATS servers' own view (stream, consumers,
// storage, cluster) as Prometheus metrics, from their monitoring ports.
func natsMetrics(ctx context.Context, c *natsmetrics.Collector, addr string, stderr io.Writer) int {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		// A scrape of its own: the healthcheck must not wait for
		// Prometheus's.
		_, _ = reg.Gather()
		if !c.Answered() {
			http.Error(w, "not ready: no NATS server's monitoring port answered", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "tailer nats-metrics: --http-addr: %v\n", err)
		return exitConfig
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "tailer nats-metrics: %v\n", err)
		return exitFailure
	}
	return exitOK
}
