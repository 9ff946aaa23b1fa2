package natsmetrics

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// startServer runs a real nats-server with its monitoring port; routes
// (cluster ports of the others) make it a node of a cluster on port cl.
func startServer(t *testing.T, name string, client, cl int, routes []int) *server.Server {
	t.Helper()
	o := &server.Options{ServerName: name, Host: "127.0.0.1", Port: client, HTTPHost: "127.0.0.1", HTTPPort: -1,
		JetStream: true, StoreDir: filepath.Join(t.TempDir(), name), NoSigs: true, NoLog: true}
	if cl != 0 {
		o.Cluster = server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: cl}
		for _, r := range routes {
			o.Routes = append(o.Routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", r)})
		}
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		t.Fatalf("%s not ready", name)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func monitorURL(s *server.Server) string { return "http://" + s.MonitorAddr().String() }

// series is one scrape: family name → the values of its labels server,
// account, stream, consumer (those it has) joined by "," → value.
type series map[string]map[string]float64

func scrape(t *testing.T, c *Collector) series {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := series{}
	for _, mf := range mfs {
		out[mf.GetName()] = map[string]float64{}
		for _, m := range mf.GetMetric() {
			byName := map[string]string{}
			for _, l := range m.GetLabel() {
				byName[l.GetName()] = l.GetValue()
			}
			var labels []string
			for _, name := range consumerLabels {
				if v, ok := byName[name]; ok {
					labels = append(labels, v)
				}
			}
			out[mf.GetName()][strings.Join(labels, ",")] = value(mf.GetType(), m)
		}
	}
	return out
}

func value(t dto.MetricType, m *dto.Metric) float64 {
	if t == dto.MetricType_COUNTER {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestSingleServer(t *testing.T) {
	t.Parallel()
	port, _ := pgtest.FreePort()
	s := startServer(t, "solo", port, 0, nil)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := t.Context()
	js, _ := jetstream.New(nc)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MAILROOM", Subjects: []string{"m.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := js.Publish(ctx, "m.x", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "sender", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for msg := range batch.Messages() {
		// Two acknowledged, the third held.
		if n++; n <= 2 {
			if err := msg.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	c, err := New([]string{monitorURL(s)}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := scrape(t, c)
	for _, want := range []struct {
		family, labels string
		value          float64
	}{
		{"nats_up", "solo", 1},
		{"nats_healthy", "solo", 1},
		{"nats_connections", "solo", 1},
		{"nats_jetstream_meta_leader", "solo", 1},
		{"nats_stream_messages", "solo,$G,MAILROOM", 5},
		{"nats_stream_last_seq", "solo,$G,MAILROOM", 5},
		{"nats_stream_replicas", "solo,$G,MAILROOM", 1},
		{"nats_stream_replicas_behind", "solo,$G,MAILROOM", 0},
		{"nats_consumer_pending_messages", "solo,$G,MAILROOM,sender", 2},
		{"nats_consumer_ack_pending_messages", "solo,$G,MAILROOM,sender", 1},
		{"nats_consumer_ack_floor_seq", "solo,$G,MAILROOM,sender", 2},
	} {
		if v, ok := got[want.family][want.labels]; !ok || v != want.value {
			t.Errorf("%s{%s} = %v (present %v), want %v; all: %v", want.family, want.labels, v, ok, want.value, got[want.family])
		}
	}
	if got["nats_jetstream_storage_bytes"]["solo"] <= 0 || got["nats_jetstream_storage_max_bytes"]["solo"] <= 0 {
		t.Errorf("storage used %v of %v", got["nats_jetstream_storage_bytes"], got["nats_jetstream_storage_max_bytes"])
	}
	for _, name := range MetricNames {
		if _, ok := got[name]; !ok && name != "nats_jetstream_meta_peers_offline" {
			t.Errorf("%s not exported", name)
		}
	}
	if !c.Answered() {
		t.Error("Answered() false after a scrape the server answered")
	}

	// A server that does not answer is down, not missing.
	dead, _ := pgtest.FreePort()
	c, _ = New([]string{fmt.Sprintf("http://127.0.0.1:%d", dead)}, time.Second)
	got = scrape(t, c)
	if v, ok := got["nats_up"][""]; !ok || v != 0 || c.Answered() {
		t.Errorf("a monitoring port that does not answer: nats_up %v, answered %v", got["nats_up"], c.Answered())
	}
}

// TestClusterOneSeriesPerStream: an R3 stream is exported once, by its
// leader, which counts the replica that went away.
func TestClusterOneSeriesPerStream(t *testing.T) {
	t.Parallel()
	var client, cl [3]int
	for i := range 3 {
		client[i], _ = pgtest.FreePort()
		cl[i], _ = pgtest.FreePort()
	}
	var nodes [3]*server.Server
	for i := range 3 {
		var routes []int
		for j := range 3 {
			if j != i {
				routes = append(routes, cl[j])
			}
		}
		nodes[i] = startServer(t, fmt.Sprintf("n%d", i+1), client[i], cl[i], routes)
	}
	var urls []string
	for _, s := range nodes {
		urls = append(urls, monitorURL(s))
	}
	c, err := New(urls, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(nodes[0].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tailertest.Eventually(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MAILROOM", Subjects: []string{"m.>"}, Replicas: 3})
		return err
	})
	for i := range 4 {
		if _, err := js.Publish(ctx, "m.x", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	tailertest.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := js.CreateOrUpdateConsumer(ctx, "MAILROOM", jetstream.ConsumerConfig{Durable: "sender", AckPolicy: jetstream.AckExplicitPolicy})
		return err
	})
	var leader string
	tailertest.Eventually(t, 30*time.Second, func() error {
		got := scrape(t, c)
		if len(got["nats_consumer_pending_messages"]) != 1 {
			return fmt.Errorf("consumer series %v, want one (its leader's)", got["nats_consumer_pending_messages"])
		}
		for labels, v := range got["nats_consumer_pending_messages"] {
			if v != 4 || !strings.HasSuffix(labels, ",MAILROOM,sender") {
				return fmt.Errorf("consumer %s: %v pending, want 4", labels, v)
			}
		}
		if len(got["nats_stream_messages"]) != 1 {
			return fmt.Errorf("stream series %v, want one (its leader's)", got["nats_stream_messages"])
		}
		for labels, v := range got["nats_stream_messages"] {
			leader, _, _ = strings.Cut(labels, ",")
			if v != 4 || got["nats_stream_replicas"][labels] != 3 || got["nats_stream_replicas_behind"][labels] != 0 {
				return fmt.Errorf("stream %s: %v messages, %v replicas, %v behind", labels, v, got["nats_stream_replicas"][labels], got["nats_stream_replicas_behind"][labels])
			}
		}
		if n := len(got["nats_up"]); n != 3 {
			return fmt.Errorf("nats_up %v", got["nats_up"])
		}
		leaders := 0.0
		for _, v := range got["nats_jetstream_meta_leader"] {
			leaders += v
		}
		if leaders != 1 || len(got["nats_jetstream_meta_peers_offline"]) != 1 {
			return fmt.Errorf("meta leaders %v, peers offline %v", got["nats_jetstream_meta_leader"], got["nats_jetstream_meta_peers_offline"])
		}
		return nil
	})
	// A follower of the stream goes away: its leader counts it behind.
	for i, s := range nodes {
		if s.Name() != leader {
			s.Shutdown()
			s.WaitForShutdown()
			t.Logf("stopped n%d, a follower of the stream led by %s", i+1, leader)
			break
		}
	}
	tailertest.Eventually(t, 30*time.Second, func() error {
		got := scrape(t, c)
		key := leader + ",$G,MAILROOM"
		if got["nats_stream_replicas_behind"][key] != 1 || got["nats_up"][""] != 0 {
			return fmt.Errorf("replicas behind %v, up %v", got["nats_stream_replicas_behind"], got["nats_up"])
		}
		return nil
	})
}
