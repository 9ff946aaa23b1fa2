package subscribe

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mailroom/tailer/internal/pause"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// Probe is what the health endpoint asks of a subscriber.
type Probe struct {
	Stream, Durable string
	JS              jetstream.JetStream
	// Server names the NATS server /readyz says does not answer, its
	// credentials redacted.
	Server string
	// Consuming reports whether the subscriber is bound to its consumer (a
	// sender between two starts is not).
	Consuming func() bool
	// Stats are the subscriber's counts.
	Stats func() subscriber.Stats
	// Stalled, if set, says why the reader is stalled ("": it is not): it
	// has had work waiting for longer than the stall timeout without
	// taking or finishing any (Stall).
	Stalled func() string
	// Denied, if set, says a publish the server denies the subscriber's
	// user ("": none), as Denials keeps it.
	Denied func() string
	// GroupStall, when not 0, fails /readyz once the durable has messages
	// waiting and no subscriber of it (this one or another) has had one
	// delivered or acknowledged for that long: the pair stuck, both
	// standing by, is said by both.
	GroupStall time.Duration
}

// MetricNames lists the subscriber's metric families, which the infra
// tests compare with the dashboard and the alert rules.
var MetricNames = []string{
	"mailroom_subscriber_messages_total",
	"mailroom_subscriber_redelivered_total",
	"mailroom_subscriber_acked_total",
	"mailroom_subscriber_batches_total",
	"mailroom_subscriber_batches_skipped_total",
	"mailroom_subscriber_dead_letters_total",
	"mailroom_subscriber_reader_failures_total",
	"mailroom_subscriber_consumer_recreated_total",
	"mailroom_subscriber_stream_gaps_total",
	"mailroom_subscriber_stream_gap_open",
	"mailroom_subscriber_taken_elsewhere_total",
	"mailroom_subscriber_in_doubt_batches",
	"mailroom_subscriber_last_delivery_timestamp_seconds",
	"mailroom_subscriber_pending_messages",
	"mailroom_subscriber_ack_pending_messages",
	"mailroom_subscriber_dead_letters_waiting",
	"mailroom_subscriber_active",
	"mailroom_subscriber_stalled",
	"mailroom_subscriber_up",
}

// Serve serves /healthz (the process answers), /readyz (bound to the
// consumer, the server answers for it, and the reader is not stalled;
// the body says whether this subscriber is the active one of its durable)
// and /metrics on addr.
func Serve(addr string, p *Probe) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{p: p})
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		st := p.state(ctx)
		switch {
		case !st.consuming:
			http.Error(w, "not ready: not consuming", http.StatusServiceUnavailable)
		case st.denied != "":
			http.Error(w, "not ready: "+st.denied, http.StatusServiceUnavailable)
		case st.stats.NoRoom != "":
			http.Error(w, "not ready: "+st.stats.NoRoom, http.StatusServiceUnavailable)
		case st.err != nil:
			http.Error(w, "not ready: consumer "+p.Durable+": "+st.err.Error(), http.StatusServiceUnavailable)
		case st.stats.OpenGap != "":
			http.Error(w, fmt.Sprintf("not ready: a gap in the stream, messages removed before this durable read them (%s): run tailer resync to publish their tokens again; ready once its first message arrives", st.stats.OpenGap), http.StatusServiceUnavailable)
		case st.stalled != "":
			http.Error(w, "not ready: "+st.stalled, http.StatusServiceUnavailable)
		case st.groupIdle > 0:
			http.Error(w, fmt.Sprintf("not ready: consumer %s has %d messages waiting (%d awaiting ack), and no subscriber of it has had one delivered or acknowledged for %s",
				p.Durable, st.info.NumPending, st.info.NumAckPending, st.groupIdle.Round(time.Second)), http.StatusServiceUnavailable)
		default:
			fmt.Fprintf(w, "ready: %s, consumer %s, %d pending, %d awaiting ack, %d batches in doubt\n",
				st.role(), p.Durable, st.info.NumPending, st.info.NumAckPending, st.stats.InDoubt)
		}
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return func() { srv.Close() }, nil
}

// state is one look at the subscriber and its consumer.
type state struct {
	consuming bool
	stalled   string
	denied    string
	stats     subscriber.Stats
	info      *jetstream.ConsumerInfo
	err       error
	// pinned: the consumer pins one subscriber; active: this one.
	pinned, active bool
	// groupIdle is how long the durable has had messages waiting with no
	// delivery and no ack, past Probe.GroupStall (0: not so).
	groupIdle time.Duration
}

func (st state) role() string {
	switch {
	case !st.pinned:
		return "delivering (the consumer does not pin one subscriber)"
	case st.active:
		return "active (pinned)"
	}
	return "standby (another subscriber of the durable is pinned, or none yet)"
}

func (p *Probe) state(ctx context.Context) state {
	st := state{consuming: p.Consuming(), stats: p.Stats()}
	if p.Stalled != nil {
		st.stalled = p.Stalled()
	}
	if p.Denied != nil {
		st.denied = p.Denied()
	}
	if nc := p.JS.Conn(); !nc.IsConnected() {
		// Asked, the consumer would say "context deadline exceeded".
		st.err = fmt.Errorf("NATS at %s does not answer (the connection is %s; it reconnects by itself)", p.Server, strings.ToLower(nc.Status().String()))
		return st
	}
	c, err := p.JS.Consumer(ctx, p.Stream, p.Durable)
	if err == nil {
		st.info, err = c.Info(ctx)
	}
	st.err = err
	if st.info != nil && p.GroupStall > 0 && (st.info.NumPending > 0 || st.info.NumAckPending > 0) {
		// The newest of a delivery and an ack, by any subscriber; a
		// consumer that never delivered counts from its creation.
		last := st.info.Created
		for _, t := range []*time.Time{st.info.Delivered.Last, st.info.AckFloor.Last} {
			if t != nil && t.After(last) {
				last = *t
			}
		}
		if idle := time.Since(last); idle > p.GroupStall {
			st.groupIdle = idle
		}
	}
	if st.info != nil && st.info.Config.PriorityPolicy == jetstream.PriorityPolicyPinned {
		st.pinned = true
		for _, g := range st.info.PriorityGroups {
			if g.Group == subscriber.PriorityGroup && g.PinnedClientID != "" && g.PinnedClientID == st.stats.PinID {
				st.active = true
			}
		}
	}
	return st
}

// collector reads the subscriber's counts and its consumer at each scrape.
type collector struct {
	p    *Probe
	once sync.Once
	d    map[string]*prometheus.Desc
}

func (c *collector) desc(name string) *prometheus.Desc {
	c.once.Do(func() {
		help := map[string]string{
			"mailroom_subscriber_messages_total":                  "Messages delivered to the subscriber.",
			"mailroom_subscriber_redelivered_total":               "Messages delivered more than once (their tokens may have reached a reader before).",
			"mailroom_subscriber_acked_total":                     "Messages acknowledged.",
			"mailroom_subscriber_batches_total":                   "Batches done (finished by the reader, or stored).",
			"mailroom_subscriber_batches_skipped_total":           "Batches of redelivered messages done before, not written again.",
			"mailroom_subscriber_dead_letters_total":              "Batches, and unreadable messages, set aside on the dead-letter stream by this process.",
			"mailroom_subscriber_reader_failures_total":           "Readers (senders) that failed with batches in hand.",
			"mailroom_subscriber_consumer_recreated_total":        "Times the consumer was found gone from the server and made again.",
			"mailroom_subscriber_stream_gaps_total":               "Places where the stream lacked messages the durable had not read (removed before it read them): their tokens reach no reader until tailer resync.",
			"mailroom_subscriber_stream_gap_open":                 "1 while a gap in the stream has been found and no resync's message has followed it.",
			"mailroom_subscriber_taken_elsewhere_total":           "Messages of the durable found given to another client, not to a subscriber of it (a consumer that does not pin one subscriber): their tokens were not written by tailer subscribe.",
			"mailroom_subscriber_in_doubt_batches":                "Batches handed to the reader and not known finished.",
			"mailroom_subscriber_last_delivery_timestamp_seconds": "When the last message was delivered (Unix time; 0: none yet).",
			"mailroom_subscriber_pending_messages":                "Messages on the stream the consumer has yet to deliver.",
			"mailroom_subscriber_ack_pending_messages":            "Messages delivered and not acknowledged.",
			"mailroom_subscriber_dead_letters_waiting":            "Dead letters of this durable on the dead-letter stream, waiting for tailer dead-letters resend.",
			"mailroom_subscriber_active":                          "1 when this subscriber is the one its consumer delivers to.",
			"mailroom_subscriber_stalled":                         "1 when the reader has had lines waiting, and taken or finished none, for longer than the stall timeout.",
			"mailroom_subscriber_up":                              "1 when the server answers for the consumer.",
		}
		c.d = make(map[string]*prometheus.Desc, len(MetricNames))
		for _, n := range MetricNames {
			c.d[n] = prometheus.NewDesc(n, help[n], nil, prometheus.Labels{"durable": c.p.Durable})
		}
	})
	return c.d[name]
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, n := range MetricNames {
		ch <- c.desc(n)
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st := c.p.state(ctx)
	counter := func(n string, v int) {
		ch <- prometheus.MustNewConstMetric(c.desc(n), prometheus.CounterValue, float64(v))
	}
	gauge := func(n string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.desc(n), prometheus.GaugeValue, v)
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	s := st.stats
	counter("mailroom_subscriber_messages_total", s.Messages)
	counter("mailroom_subscriber_redelivered_total", s.Redelivered)
	counter("mailroom_subscriber_acked_total", s.Acked)
	counter("mailroom_subscriber_batches_total", s.Batches)
	counter("mailroom_subscriber_batches_skipped_total", s.Skipped)
	counter("mailroom_subscriber_dead_letters_total", s.DeadLetters)
	counter("mailroom_subscriber_reader_failures_total", s.ReaderFailures)
	counter("mailroom_subscriber_consumer_recreated_total", s.Recreated)
	counter("mailroom_subscriber_stream_gaps_total", s.Gaps)
	gauge("mailroom_subscriber_stream_gap_open", b(s.OpenGap != ""))
	counter("mailroom_subscriber_taken_elsewhere_total", s.TakenElsewhere)
	gauge("mailroom_subscriber_in_doubt_batches", float64(s.InDoubt))
	last := 0.0
	if !s.LastDelivery.IsZero() {
		last = float64(s.LastDelivery.UnixMilli()) / 1000
	}
	gauge("mailroom_subscriber_last_delivery_timestamp_seconds", last)
	gauge("mailroom_subscriber_up", b(st.err == nil))
	if st.info != nil {
		gauge("mailroom_subscriber_pending_messages", float64(st.info.NumPending))
		gauge("mailroom_subscriber_ack_pending_messages", float64(st.info.NumAckPending))
	}
	gauge("mailroom_subscriber_active", b(st.err == nil && st.consuming && (!st.pinned || st.active)))
	gauge("mailroom_subscriber_stalled", b(st.stalled != ""))
	if n, err := subscriber.CountDeadLetters(ctx, c.p.JS, c.p.Stream, c.p.Durable); err == nil {
		gauge("mailroom_subscriber_dead_letters_waiting", float64(n))
	}
}

// Stall is a reader's stall, as the health check and the log say it.
type Stall struct {
	// Reader names the reader (Sender.Name), Timeout the stall timeout.
	Reader  func() string
	Timeout time.Duration
	// Stalled is Lines.Stalled.
	Stalled func(time.Duration) bool
}

// Reason says why the reader is stalled ("": it is not).
func (s *Stall) Reason() string {
	if !s.Stalled(s.Timeout) {
		return ""
	}
	return fmt.Sprintf("%s has held lines, or left them waiting, for longer than --stall-timeout (%s) without finishing any: "+
		"the durable delivers nothing more meanwhile; look at the sender, or stop it (what it held is delivered again)", s.Reader(), s.Timeout)
}

// Watch says in the log, once a stall, that the reader stalled (an ERROR)
// and that it moved again, looking every few seconds until ctx is done.
func (s *Stall) Watch(ctx context.Context, log *slog.Logger) {
	said := false
	for pause.For(ctx, protocol.StallLookEvery(s.Timeout)) == nil {
		switch reason := s.Reason(); {
		case reason != "" && !said:
			log.Error("the sender is stalled", "reason", reason)
			said = true
		case reason == "" && said:
			log.Info("the sender moves again")
			said = false
		}
	}
}
